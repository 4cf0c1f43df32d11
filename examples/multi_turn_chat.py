"""A multi-turn chat rendered with the model's own chat template (including its default
system prompt); each turn reuses the previous turns from the radix cache.

    python examples/multi_turn_chat.py [--url http://127.0.0.1:30000]
"""

import argparse

import radixlm as sgl


@sgl.function
def chat(s, questions):
    for i, question in enumerate(questions):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen(f"answer_{i}", max_tokens=48))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="a running radixlm serve; default: in-process engine")
    args = parser.parse_args()
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    sgl.set_default_backend(backend)
    questions = ["What is the capital of France?", "What is a famous tower there?",
                 "How tall is it, roughly?"]
    state = chat.run(questions=questions, temperature=0)
    for i, message in enumerate(state.messages()):
        print(f"[{message['role']}] {message['content']}")
        if message["role"] == "assistant":
            meta = state.get_meta_info(f"answer_{(i - 2) // 2}")
            print(f"    (prompt {meta['prompt_tokens']} tokens, "
                  f"{meta['cached_tokens']} from cache)")
    backend.shutdown()


if __name__ == "__main__":
    main()
