"""Run one program over many inputs with run_batch: the constant prefix is traced and cached
first, then the programs run concurrently (the engine batches them) with a progress bar.

    python examples/run_batch.py [--url http://127.0.0.1:30000]
"""

import argparse
import time

import radixlm as sgl


@sgl.function
def classify(s, review):
    s += "Review: Works great, I love it.\nSentiment: positive\n\n"
    s += "Review: It broke immediately. Awful.\nSentiment: negative\n\n"
    s += "Review: " + review + "\nSentiment: " + sgl.select("label", ["positive", "negative"])


REVIEWS = [
    "Absolutely love it, works perfectly.", "Broke after two days, waste of money.",
    "Great value and fast shipping.", "Terrible customer service, never again.",
    "Exceeded my expectations!", "The battery died within an hour.",
    "Five stars, would buy again.", "Cheap plastic, very disappointed.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="a running radixlm serve; default: in-process engine")
    args = parser.parse_args()
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    sgl.set_default_backend(backend)
    t0 = time.perf_counter()
    states = classify.run_batch([{"review": r} for r in REVIEWS], progress_bar=True)
    elapsed = time.perf_counter() - t0
    for review, state in zip(REVIEWS, states, strict=True):
        print(f"{state['label']:>8}  {review}")
    print(f"{len(REVIEWS)} programs in {elapsed:.2f} s")
    backend.shutdown()


if __name__ == "__main__":
    main()
