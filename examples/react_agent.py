"""A ReAct-style agent: the model picks its next action with `select`, a Python tool runs,
and the observation goes back into the prompt until the model answers.

    python examples/react_agent.py [--url http://127.0.0.1:30000]
"""

import argparse
import ast
import operator

import radixlm as sgl

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv}


def calculator(expression: str) -> str:
    """Evaluate + - * / on numbers, nothing else."""
    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("unsupported expression")
    try:
        return str(ev(ast.parse(expression.strip(), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"


LOOKUP = {"eiffel tower": "The Eiffel Tower is 330 metres tall.",
          "mount everest": "Mount Everest is 8849 metres tall."}


def lookup(topic: str) -> str:
    return LOOKUP.get(topic.strip().lower().strip(".\"'"), "no entry")


TOOLS = {"calculate": calculator, "lookup": lookup}

INSTRUCTIONS = (
    "Answer the question. At each step choose an action: 'lookup' (find a fact about a topic),"
    " 'calculate' (evaluate an arithmetic expression) or 'finish' (give the final answer).\n\n"
    "Question: How tall is Mount Everest in metres, plus one?\n"
    "Step 1 action: lookup\nInput: Mount Everest\n"
    "Observation: Mount Everest is 8849 metres tall.\n"
    "Step 2 action: calculate\nInput: 8849 + 1\nObservation: 8850\n"
    "Step 3 action: finish\nFinal answer: 8850 metres\n\n"
)


@sgl.function
def react(s, question, max_steps=4):
    s += INSTRUCTIONS + "Question: " + question + "\n"
    for step in range(max_steps):
        # the first step must use a tool; after that the model may also finish
        actions = ["lookup", "calculate"] + (["finish"] if step else [])
        s += f"Step {step + 1} action: " + sgl.select(f"action_{step}", actions)
        action = s[f"action_{step}"]
        if action == "finish":
            s += "\nFinal answer: " + sgl.gen("answer", max_tokens=24, stop="\n")
            return
        s += "\nInput: " + sgl.gen(f"input_{step}", max_tokens=16, stop="\n")
        s += "\nObservation: " + TOOLS[action](s[f"input_{step}"]) + "\n"
    s += "Final answer: " + sgl.gen("answer", max_tokens=24, stop="\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="a running radixlm serve; default: in-process engine")
    args = parser.parse_args()
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    sgl.set_default_backend(backend)
    state = react.run(question="How tall is the Eiffel Tower in metres, times two?",
                      temperature=0)
    if state.error():
        raise SystemExit(f"failed: {state.error()}")
    print(state.text())
    backend.shutdown()


if __name__ == "__main__":
    main()
