"""`radixlm run [MODEL]` and `radixlm list`: their arguments and entry points."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from radixlm.chat.backends import ChatError, ChatOptions, EngineBackend, HttpBackend
from radixlm.chat.models import format_table, known_models, remember, unknown_model_message
from radixlm.chat.repl import Repl


class UnknownModel(ValueError):
    """The model named is not one this process can find."""


def add_run_args(p: argparse.ArgumentParser, default_model: str) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help=f"alias, local HF directory or .gguf file (default {default_model}; "
                        "`radixlm list` shows what is here); with --url, the model name sent "
                        "(default: the server's)")
    p.set_defaults(default_model=default_model)
    p.add_argument("--url", help="chat with a running server (e.g. http://127.0.0.1:30000) "
                                 "instead of loading the model in this process")
    p.add_argument("--api-key", help="Bearer key for --url")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--temperature", type=float, default=ChatOptions.temperature)
    p.add_argument("--top-p", type=float, default=ChatOptions.top_p)
    p.add_argument("--max-tokens", type=int, default=ChatOptions.max_tokens)
    e = p.add_argument_group("in-process engine (None/unset means the engine's default)")
    e.add_argument("--context-length", type=int)
    e.add_argument("--max-total-tokens", type=int, help="KV pool capacity in tokens")
    e.add_argument("--dtype", help="auto | bfloat16 | float16 | float32")
    e.add_argument("--device", help="auto | cpu | cuda")
    e.add_argument("--native-activations",
                   help="auto | mixed | fp32 | int8 | bf16: how native CPU matmuls read "
                        "activations (mixed: fastest big steps, not batch-invariant)")


def load_engine(model: str, engine_kwargs: dict[str, Any]) -> Any:
    """The Engine for `model`, behind a progress bar of the load's stages (a GGUF's first
    conversion shows its own bar inside the first stage). UnknownModel: no such model;
    ValueError: a bad engine option."""
    from tqdm import tqdm

    with tqdm(total=3, unit="stage", file=sys.stderr, leave=False,
              bar_format="{desc:<36}{bar:20} {n_fmt}/{total_fmt} [{elapsed}]") as bar:
        bar.set_description(f"finding {model}")
        from radixlm.runtime.weights import resolve_model

        try:
            resolve_model(model)  # converts a GGUF on first use
        except ValueError as exc:
            raise UnknownModel(str(exc)) from exc
        bar.update()
        bar.set_description("loading the model")
        from radixlm.runtime.engine import Engine

        engine = Engine(model=model, log_level="warning",
                        **{k: v for k, v in engine_kwargs.items() if v is not None})
        bar.update()
        bar.set_description("warming up")
        engine.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 1})
        bar.update()
    return engine


def options_from_args(args: argparse.Namespace) -> ChatOptions:
    options = ChatOptions(temperature=args.temperature, top_p=args.top_p,
                          max_tokens=args.max_tokens, system=args.system)
    if options.temperature < 0 or not 0 < options.top_p <= 1 or options.max_tokens < 1:
        raise ValueError("--temperature must be >= 0, --top-p in (0, 1], --max-tokens >= 1")
    return options


def run_main(args: argparse.Namespace) -> int:
    """`radixlm run`."""
    try:
        options = options_from_args(args)
    except ValueError as exc:
        print(f"radixlm run: {exc}", file=sys.stderr)
        return 2
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    if args.url:
        try:
            backend: Any = HttpBackend(args.url, args.api_key, args.model)
        except ChatError as exc:
            print(f"radixlm run: {exc}", file=sys.stderr)
            return 2
    else:
        model = args.model or args.default_model
        kwargs = {"context_length": args.context_length, "dtype": args.dtype,
                  "max_total_tokens": args.max_total_tokens, "device": args.device,
                  "native_activations": args.native_activations}
        try:
            backend = EngineBackend(load_engine(model, kwargs))
        except UnknownModel as exc:
            print(unknown_model_message(model, str(exc)), file=sys.stderr)
            return 2
        except ValueError as exc:
            print(f"radixlm run: {exc}", file=sys.stderr)
            return 2
        remember(model)  # a path given (aliases are listed anyway)
    try:
        return Repl(backend, options).run()
    finally:
        backend.close()


def list_main(args: argparse.Namespace) -> int:
    """`radixlm list`."""
    print(format_table(known_models()))
    return 0
