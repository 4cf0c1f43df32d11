"""Tree of thought: fork the state into parallel drafts (they share the question's prefix in
the radix cache and run concurrently), then write a summary that reads them all.

    python examples/tree_of_thought.py [--url http://127.0.0.1:30000]
"""

import argparse

import radixlm as sgl


@sgl.function
def tree_of_thought(s, question, n_drafts=3):
    s += sgl.user(question)
    s += sgl.assistant_begin()
    drafts = s.fork(n_drafts)
    drafts += lambda i: f"Idea {i + 1}: " + sgl.gen("idea", max_tokens=32, stop="\n",
                                                    temperature=0.8)
    drafts.join()
    s += "Here are some ideas:\n"
    for i, idea in enumerate(s["idea"]):
        s += f"{i + 1}. {idea.strip()}\n"
    s += "The best one is " + sgl.gen("summary", max_tokens=48, temperature=0, stop="\n")
    s += sgl.assistant_end()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="a running radixlm serve; default: in-process engine")
    args = parser.parse_args()
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    sgl.set_default_backend(backend)
    state = tree_of_thought.run(question="How can I keep a small garden watered during a "
                                "two-week holiday?")
    for meta, idea in zip(state.get_meta_info("idea"), state["idea"], strict=True):
        print(f"- {idea.strip()}  (cached {meta['cached_tokens']}/{meta['prompt_tokens']})")
    print("Summary:", state["summary"].strip())
    backend.shutdown()


if __name__ == "__main__":
    main()
