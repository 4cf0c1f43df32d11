"""Stream a program's output as it is generated (sync and async iterators).

    python examples/streaming.py [--url http://127.0.0.1:30000]
"""

import argparse
import asyncio

import radixlm as sgl


@sgl.function
def story(s, topic):
    s += sgl.user(f"Write a short story about {topic} in three sentences.")
    s += sgl.assistant(sgl.gen("story", max_tokens=64))


async def stream_async(topic: str) -> None:
    state = story.run(topic=topic, stream=True, temperature=0)
    async for piece in state.text_async_iter("story"):
        print(piece, end="", flush=True)
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="a running radixlm serve; default: in-process engine")
    args = parser.parse_args()
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    sgl.set_default_backend(backend)
    state = story.run(topic="a lighthouse keeper", stream=True, temperature=0)
    for piece in state.text_iter("story"):
        print(piece, end="", flush=True)
    print()
    asyncio.run(stream_async("a robot learning to paint"))
    backend.shutdown()


if __name__ == "__main__":
    main()
