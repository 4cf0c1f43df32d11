"""Extract structured data as JSON that follows a pydantic model (constrained decoding).

    python examples/json_extraction.py [--url http://127.0.0.1:30000]
"""

import argparse
import json

from pydantic import BaseModel

import radixlm as sgl


class Person(BaseModel):
    name: str
    age: int
    city: str


@sgl.function
def extract(s, text):
    s += sgl.system("You extract facts from text as JSON.")
    s += sgl.user("Extract the person's name, age and city as JSON.\nText: " + text)
    s += sgl.assistant(sgl.gen("json", json_schema=Person, max_tokens=64))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="a running radixlm serve; default: in-process engine")
    args = parser.parse_args()
    backend = sgl.RuntimeEndpoint(args.url) if args.url else sgl.Runtime()
    sgl.set_default_backend(backend)
    text = "Maria Lopez is 34 years old and lives in Madrid, where she works as a nurse."
    state = extract.run(text=text, temperature=0)
    if state.error():
        raise SystemExit(f"failed: {state.error()}")
    person = Person.model_validate(json.loads(state["json"]))
    print(state["json"])
    print(person)
    backend.shutdown()


if __name__ == "__main__":
    main()
