"""`radixlm` command line: `radixlm serve ...` and `radixlm bench serving ...`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

DEFAULT_MODEL = "smollm2-135m-instruct"


def _add_serve_args(p: argparse.ArgumentParser) -> None:
    e = p.add_argument_group("engine (None/unset means the engine's default)")
    e.add_argument("--model", default=DEFAULT_MODEL,
                   help="model alias, local HF directory or .gguf file")
    # values are validated by EngineConfig (one list of choices, kept there)
    e.add_argument("--dtype", help="auto | bfloat16 | float16 | float32")
    e.add_argument("--device", help="auto | cpu | cuda")
    e.add_argument("--attention-backend", help="auto | torch | triton")
    e.add_argument("--context-length", type=int, help="max tokens of prompt + output")
    e.add_argument("--max-total-tokens", type=int, help="KV pool capacity in tokens")
    e.add_argument("--mem-fraction", type=float, help="memory share for the KV pool")
    e.add_argument("--max-running-requests", type=int)
    e.add_argument("--max-queued-requests", type=int,
                   help="waiting-queue bound; further requests get 429")
    e.add_argument("--chunked-prefill-size", type=int)
    e.add_argument("--schedule-policy", help="lpm | fcfs | ...")
    e.add_argument("--disable-radix-cache", action="store_true", default=None)
    e.add_argument("--disable-jump-forward", action="store_true", default=None)
    e.add_argument("--grammar-backend", help="llguidance | outlines (constrained decoding)")
    e.add_argument("--random-seed", type=int)
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=30000)
    s.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (all but /health)")
    s.add_argument("--request-timeout", type=float,
                   help="seconds; a request running longer is aborted (504)")
    s.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024)
    s.add_argument("--served-model-name", help="model id in /v1 responses")
    s.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after SIGTERM/SIGINT")
    s.add_argument("--log-level", default=None, help="debug|info|warning|error")


def engine_kwargs_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig keyword arguments from parsed `serve` arguments (None = default)."""
    return {
        "model": args.model, "dtype": args.dtype, "device": args.device,
        "attention_backend": args.attention_backend, "context_length": args.context_length,
        "max_total_tokens": args.max_total_tokens, "mem_fraction": args.mem_fraction,
        "max_running_requests": args.max_running_requests,
        "max_queued_requests": args.max_queued_requests,
        "chunked_prefill_size": args.chunked_prefill_size,
        "schedule_policy": args.schedule_policy,
        "disable_radix_cache": args.disable_radix_cache,
        "enable_jump_forward": False if args.disable_jump_forward else None,
        "grammar_backend": args.grammar_backend, "random_seed": args.random_seed,
        "log_level": args.log_level,
    }


def _serve(args: argparse.Namespace) -> int:
    from radixlm.runtime.server.launch import serve
    from radixlm.runtime.server.state import ServerSettings

    log_level = args.log_level
    if log_level is None:
        from radixlm.envs import log_level as env_log_level
        log_level = env_log_level()
    settings = ServerSettings(
        host=args.host, port=args.port, api_key=args.api_key,
        max_queued_requests=args.max_queued_requests, request_timeout=args.request_timeout,
        max_body_bytes=args.max_body_bytes, served_model_name=args.served_model_name,
        shutdown_timeout=args.shutdown_timeout)
    return serve(engine_kwargs_from_args(args), settings, log_level)


def build_parser() -> argparse.ArgumentParser:
    """The full `radixlm` argument parser."""
    from radixlm.runtime.server import bench

    parser = argparse.ArgumentParser(prog="radixlm")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", help="run the HTTP server (native + OpenAI API)")
    _add_serve_args(serve_p)
    serve_p.set_defaults(func=_serve)
    bench_p = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench_p.add_subparsers(dest="bench_command", required=True)
    serving = bench_sub.add_parser("serving", help="load-test a running server")
    bench.add_args(serving)
    serving.set_defaults(func=bench.main_from_args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `radixlm` console script."""
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
