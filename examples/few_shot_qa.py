"""Few-shot question answering: a constant few-shot prefix (shared in the radix cache) and a
short greedy answer.

    python examples/few_shot_qa.py [--url http://127.0.0.1:30000]
"""

import argparse

import radixlm as sgl

EXAMPLES = [
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Spain?", "Madrid"),
]


@sgl.function
def few_shot_qa(s, question):
    s += "Answer each question with one word.\n\n"
    for q, a in EXAMPLES:
        s += f"Question: {q}\nAnswer: {a}\n\n"
    s += "Question: " + question + "\nAnswer:"
    s += sgl.gen("answer", max_tokens=8, stop="\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="a running radixlm serve; default: in-process engine")
    args = parser.parse_args()
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    sgl.set_default_backend(backend)
    for question in ["What is the capital of France?", "What is the capital of Germany?"]:
        state = few_shot_qa.run(question=question, temperature=0)
        print(f"{question} -> {state['answer'].strip()}"
              f"  (cached prompt tokens: {state.get_meta_info('answer')['cached_tokens']})")
    backend.shutdown()


if __name__ == "__main__":
    main()
