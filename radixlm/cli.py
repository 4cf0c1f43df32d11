"""`radixlm` command line: `radixlm serve ...`, `radixlm run [MODEL]`, `radixlm list` and
`radixlm bench serving ...`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from radixlm.formats.tool_parsers import TOOL_CALL_PARSERS
from radixlm.runtime.server_args import ALWAYS_ON, IGNORED, warn_ignored

DEFAULT_MODEL = "smollm2-135m-instruct"
IGNORED_PREFIX = "ignored_"


def _add_serve_args(p: argparse.ArgumentParser) -> None:
    """`serve` options. SGLang's names are aliases of ours (`--model-path` = `--model`);
    SGLang flags without meaning here are accepted and warned about (server_args.py).
    The help lists them in the order added: the engine group (model, memory, scheduling,
    decoding, parallel), then the server group."""
    e = p.add_argument_group("engine (None/unset means the engine's default)")
    _add_model_args(e)
    _add_memory_args(e)
    _add_scheduling_args(e)
    _add_hicache_args(e)
    _add_decoding_args(e)
    _add_reasoning_args(e)
    _add_parallel_args(e)
    _add_server_args(p.add_argument_group("server"))
    for name, takes_value in IGNORED.items():  # SGLang flags with no meaning here
        flag, dest = "--" + name.replace("_", "-"), IGNORED_PREFIX + name
        if takes_value:
            p.add_argument(flag, dest=dest, help=argparse.SUPPRESS)
        else:
            p.add_argument(flag, dest=dest, action="store_true", default=None,
                           help=argparse.SUPPRESS)
    for name in ALWAYS_ON:  # SGLang switches for what radixlm always does
        p.add_argument("--" + name.replace("_", "-"), dest="always_" + name,
                       action="store_true", help=argparse.SUPPRESS)


def _add_model_args(e: argparse._ArgumentGroup) -> None:
    """Which model, tokenizer and template, and how it runs."""
    e.add_argument("--model", "--model-path", dest="model", default=DEFAULT_MODEL,
                   help="model alias, local HF directory or .gguf file")
    e.add_argument("--tokenizer-path", help="tokenizer directory (default: the model's)")
    e.add_argument("--chat-template", help="chat template name or file (.jinja / .json)")
    # values are validated by EngineConfig (one list of choices, kept there)
    e.add_argument("--dtype", help="auto | bfloat16 | float16 | float32")
    e.add_argument("--quantization", help="q8_0 | q4_0 | q4_1: block-quantize a safetensors "
                                          "checkpoint at load (default: its own precision)")
    e.add_argument("--native-activations",
                   help="auto | mixed | fp32 | int8 | bf16: how native CPU matmuls read "
                        "activations (mixed: fastest big steps, not batch-invariant)")
    e.add_argument("--device", help="auto | cpu | cuda")
    e.add_argument("--attention-backend", help="auto | torch | triton")
    e.add_argument("--enable-deterministic-inference", action="store_true", default=None,
                   help="batch-invariant outputs: a token's numbers the same bits in any "
                        "batch, chunking or cache state (CPU: native or torch path; CUDA "
                        "and triton attention: a startup error)")
    e.add_argument("--context-length", type=int, help="max tokens of prompt + output")


def _add_memory_args(e: argparse._ArgumentGroup) -> None:
    """The KV pool's size."""
    e.add_argument("--max-total-tokens", type=int, help="KV pool capacity in tokens")
    e.add_argument("--mem-fraction", "--mem-fraction-static", dest="mem_fraction", type=float,
                   help="memory share for the KV pool")
    e.add_argument("--kv-cache-dtype",
                   help="K/V storage: auto (the model's dtype) | int8 (per-token, per-head "
                        "scales: ~1.9x the tokens in the same memory); fp8_e4m3 | fp8_e5m2 "
                        "are refused with what this device supports")


def _add_scheduling_args(e: argparse._ArgumentGroup) -> None:
    """Batch and queue sizes, the scheduling policy, priorities and the prefix cache."""
    e.add_argument("--max-running-requests", type=int)
    e.add_argument("--max-queued-requests", type=int,
                   help="waiting-queue bound; further requests get 429")
    e.add_argument("--chunked-prefill-size", type=int)
    e.add_argument("--mixed-prefill-size", type=int,
                   help="while requests decode, a prompt longer than a step's budget comes "
                        "this many tokens a step (the requests decode in it); default 256")
    e.add_argument("--schedule-policy", help="lpm | fcfs | priority")
    e.add_argument("--enable-priority-scheduling", action="store_true", default=None,
                   help="SGLang's switch: --schedule-policy priority")
    e.add_argument("--schedule-low-priority-values-first", dest="low_priority_values_first",
                   action="store_true", default=None)
    e.add_argument("--priority-preemption", action="store_true", default=None,
                   help="a higher-priority request may retract lower-priority running ones")
    e.add_argument("--priority-preemption-threshold",
                   "--priority-scheduling-preemption-threshold",
                   dest="priority_preemption_threshold", type=int,
                   help="preempt only when priorities differ by more than this")
    e.add_argument("--disable-radix-cache", action="store_true", default=None)


def _add_hicache_args(e: argparse._ArgumentGroup) -> None:
    """The hierarchical cache: a host tier and a disk tier below the KV pool (SGLang's
    names; --hicache-storage-dir and --hicache-storage-size are ours)."""
    e.add_argument("--enable-hierarchical-cache", action="store_true", default=None,
                   help="evicted radix nodes move to a host-memory tier (the KV pool's "
                        "format) and come back on a match instead of being recomputed")
    e.add_argument("--hicache-ratio", type=float,
                   help="host tier size as a multiple of the KV pool (default 2)")
    e.add_argument("--hicache-size", type=float,
                   help="host tier size in GB (overrides --hicache-ratio; default 0: unset)")
    e.add_argument("--hicache-storage-backend",
                   help="file: also write whole 64-token blocks through to disk, found again "
                        "by their content after a restart")
    e.add_argument("--hicache-storage-dir",
                   help="directory of the file backend (must exist and be writable)")
    e.add_argument("--hicache-storage-size", type=float,
                   help="most GB the file backend keeps (least recently used go; default 8)")


def _add_decoding_args(e: argparse._ArgumentGroup) -> None:
    """Constrained decoding (jump-forward, grammar backend, JSON whitespace), the tool-call
    format, the seed and speculative decoding."""
    e.add_argument("--disable-jump-forward", action="store_true", default=None)
    e.add_argument("--complete-within-max-tokens", action="store_true", default=None,
                   help="constrained requests close a valid document within max_tokens "
                        "unless they ask otherwise (complete_within_max_tokens)")
    e.add_argument("--grammar-backend", help="llguidance | outlines (constrained decoding)")
    e.add_argument("--constrained-json-whitespace-pattern",
                   help="regex of the whitespace JSON output may have between tokens, where a "
                        "request names none (default: ', ' and ': ' separators, nothing else)")
    e.add_argument("--constrained-json-disable-any-whitespace", action="store_true",
                   default=None, help="JSON output with no whitespace between tokens "
                                      "(compact), where a request names no pattern")
    e.add_argument("--tool-call-parser",
                   help=f"tool-call format: {' | '.join(TOOL_CALL_PARSERS)} (default: the one "
                        "the chat template shows, else qwen25)")
    e.add_argument("--random-seed", type=int)
    e.add_argument("--speculative-algorithm",
                   help="NGRAM: speculative decoding with n-gram drafts (no draft model), "
                        "sized per step to where it pays | none: off (default: NGRAM where "
                        "the native CPU library runs the steps, else off)")
    e.add_argument("--speculative-num-draft-tokens", type=int,
                   help="most draft tokens a request verifies per step")
    e.add_argument("--speculative-ngram-min-match-window-size", type=int,
                   help="shortest suffix (tokens) an n-gram draft is matched on")
    e.add_argument("--speculative-ngram-max-match-window-size", type=int,
                   help="longest suffix (tokens) an n-gram draft is matched on")


def _add_reasoning_args(e: argparse._ArgumentGroup) -> None:
    """Reasoning models: the thinking block's format and strict thinking (SGLang's flags)."""
    from radixlm.constraints.reasoning import REASONING_PARSERS

    e.add_argument("--reasoning-parser",
                   help=f"{' | '.join(REASONING_PARSERS)}: split the thinking off into "
                        "reasoning_content, apply constraints after it, take thinking_budget")
    e.add_argument("--enable-strict-thinking", action="store_true", default=None,
                   help="forbid end-of-turn and tool-call tokens inside the thinking block "
                        "and an empty answer after it")


def _add_parallel_args(e: argparse._ArgumentGroup) -> None:
    """Tensor parallel ranks (over hosts) and data parallel replicas."""
    e.add_argument("--tp-size", "--tp", dest="tp_size", type=int,
                   help="tensor-parallel ranks (torch.distributed)")
    e.add_argument("--dp-size", "--dp", dest="dp_size", type=int,
                   help="data-parallel replicas behind sglang-router (the router takes --port)")
    e.add_argument("--nnodes", type=int,
                   help="hosts the --tp-size ranks are spread over (tp-size/nnodes each)")
    e.add_argument("--node-rank", type=int,
                   help="this host's index 0..nnodes-1; node 0 serves HTTP, the others only "
                        "run their ranks")
    e.add_argument("--dist-init-addr",
                   help="HOST:PORT of node 0's rendezvous (default: MASTER_ADDR/MASTER_PORT)")
    e.add_argument("--router-policy", default="cache_aware",
                   help="sglang-router policy with --dp-size > 1: cache_aware | round_robin | "
                        "random | power_of_two")


def _add_server_args(s: argparse._ArgumentGroup) -> None:
    """The HTTP layer: address, key, timeouts, body size, model name, logging."""
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=30000)
    s.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (all but /health)")
    s.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds; a request running longer is aborted (504); 0: no limit "
                        "(default 600)")
    s.add_argument("--stream-stall-timeout", type=float, default=30.0,
                   help="seconds a streaming client may read nothing before its request is "
                        "aborted (default 30)")
    s.add_argument("--max-body-bytes", type=int, default=32 * 1024 * 1024)
    s.add_argument("--served-model-name", help="model id in /v1 responses")
    s.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after SIGTERM/SIGINT")
    s.add_argument("--log-level", default=None, help="debug|info|warning|error")
    s.add_argument("--playground-show-text", action="store_true",
                   help="the playground's radix tree view shows prompt text (only without "
                        "--api-key on a loopback --host; default: token counts and ids)")


def ignored_flags(args: argparse.Namespace) -> list[str]:
    """The SGLang flags given that have no meaning here (their SGLang names)."""
    return [k[len(IGNORED_PREFIX):] for k, v in vars(args).items()
            if k.startswith(IGNORED_PREFIX) and v is not None]


def engine_kwargs_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """EngineConfig keyword arguments from parsed `serve` arguments (None = default)."""
    return {
        "model": args.model, "tokenizer_path": args.tokenizer_path,
        "chat_template": args.chat_template, "served_model_name": args.served_model_name,
        "dtype": args.dtype, "device": args.device, "quantization": args.quantization,
        "native_activations": args.native_activations,
        "enable_deterministic_inference": args.enable_deterministic_inference,
        "attention_backend": args.attention_backend, "context_length": args.context_length,
        "max_total_tokens": args.max_total_tokens, "mem_fraction": args.mem_fraction,
        "kv_cache_dtype": args.kv_cache_dtype,
        "max_running_requests": args.max_running_requests,
        "max_queued_requests": args.max_queued_requests,
        "chunked_prefill_size": args.chunked_prefill_size,
        "mixed_prefill_size": args.mixed_prefill_size,
        "schedule_policy": args.schedule_policy,
        "enable_priority_scheduling": args.enable_priority_scheduling,
        "low_priority_values_first": args.low_priority_values_first,
        "priority_preemption": args.priority_preemption,
        "priority_preemption_threshold": args.priority_preemption_threshold,
        "disable_radix_cache": args.disable_radix_cache,
        "enable_hierarchical_cache": args.enable_hierarchical_cache,
        "hicache_ratio": args.hicache_ratio, "hicache_size": args.hicache_size,
        "hicache_storage_backend": args.hicache_storage_backend,
        "hicache_storage_dir": args.hicache_storage_dir,
        "hicache_storage_size": args.hicache_storage_size,
        "enable_jump_forward": False if args.disable_jump_forward else None,
        "complete_within_max_tokens": args.complete_within_max_tokens,
        "grammar_backend": args.grammar_backend,
        "constrained_json_whitespace_pattern": args.constrained_json_whitespace_pattern,
        "constrained_json_disable_any_whitespace": args.constrained_json_disable_any_whitespace,
        "tool_call_parser": args.tool_call_parser,
        "random_seed": args.random_seed,
        "speculative_algorithm": args.speculative_algorithm,
        "speculative_num_draft_tokens": args.speculative_num_draft_tokens,
        "speculative_ngram_min_match_window_size": args.speculative_ngram_min_match_window_size,
        "speculative_ngram_max_match_window_size": args.speculative_ngram_max_match_window_size,
        "reasoning_parser": args.reasoning_parser,
        "enable_strict_thinking": args.enable_strict_thinking,
        "log_level": args.log_level, "tp_size": args.tp_size, "dp_size": args.dp_size,
        "nnodes": args.nnodes, "node_rank": args.node_rank,
        "dist_init_addr": args.dist_init_addr,
    }


def _serve(args: argparse.Namespace) -> int:
    from radixlm.server.launch import serve, setup_logging
    from radixlm.server.state import ServerSettings

    log_level = args.log_level
    if log_level is None:
        from radixlm.envs import log_level as env_log_level
        log_level = env_log_level()
    setup_logging(log_level)
    warn_ignored(ignored_flags(args))
    dp_size = 1 if args.dp_size is None else args.dp_size
    if dp_size < 1:
        print("radixlm serve: --dp-size must be >= 1", file=sys.stderr)
        return 2
    nnodes = 1 if args.nnodes is None else args.nnodes
    if dp_size > 1 and nnodes > 1:
        print("radixlm serve: --dp-size > 1 with --nnodes > 1 is not supported; start the "
              "replicas by hand and point sglang-router at them (docs/SCALE_OUT.md)",
              file=sys.stderr)
        return 2
    if args.nnodes is not None or args.node_rank is not None:
        code = _check_nodes(args)
        if code is not None:
            return code
    try:
        settings = ServerSettings(
            host=args.host, port=args.port, api_key=args.api_key,
            max_queued_requests=args.max_queued_requests,
            request_timeout=args.request_timeout or None,
            stream_stall_timeout=args.stream_stall_timeout,
            max_body_bytes=args.max_body_bytes, served_model_name=args.served_model_name,
            shutdown_timeout=args.shutdown_timeout,
            playground_show_text=args.playground_show_text)
    except ValueError as exc:
        print(f"radixlm serve: {exc}", file=sys.stderr)
        return 2
    if dp_size > 1:
        from radixlm.server import data_parallel as dp

        if args.router_policy not in dp.ROUTER_POLICIES:
            print(f"radixlm serve: --router-policy must be one of "
                  f"{' | '.join(dp.ROUTER_POLICIES)}, got {args.router_policy!r}",
                  file=sys.stderr)
            return 2
        if args.api_key:  # the router would not pass clients' keys through unchecked
            print("radixlm serve: --api-key is not supported with --dp-size > 1 "
                  "(put the key on the router's host instead)", file=sys.stderr)
            return 2
        return dp.serve_data_parallel(args.serve_argv, args.host, args.port, dp_size,
                                      args.router_policy, args.shutdown_timeout)
    return serve(engine_kwargs_from_args(args), settings, log_level)


def _check_nodes(args: argparse.Namespace) -> int | None:
    """Multi-host settings: an exit code when they are bad (said on stderr) or when this is
    a node other than 0 (which runs its ranks here until they end); None for node 0."""
    from radixlm.runtime.config import EngineConfig

    kwargs = {k: v for k, v in engine_kwargs_from_args(args).items() if v is not None}
    try:
        config = EngineConfig.from_kwargs(**kwargs)
    except ValueError as exc:
        print(f"radixlm serve: {exc}", file=sys.stderr)
        return 2
    if config.node_rank == 0:
        return None
    from radixlm.runtime.parallel.node import run_node

    try:
        return run_node(config)
    except ValueError as exc:
        print(f"radixlm serve: {exc}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    """The full `radixlm` argument parser."""
    from radixlm.chat import commands as chat
    from radixlm.server import bench

    parser = argparse.ArgumentParser(prog="radixlm")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", help="run the HTTP server (native + OpenAI API) and "
                                           "the playground at /")
    _add_serve_args(serve_p)
    serve_p.set_defaults(func=_serve)
    run_p = sub.add_parser("run", help="chat in the terminal (in-process, or with --url)")
    chat.add_run_args(run_p, DEFAULT_MODEL)
    run_p.set_defaults(func=chat.run_main)
    list_p = sub.add_parser("list", help="the models `radixlm run` can load")
    list_p.set_defaults(func=chat.list_main)
    bench_p = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench_p.add_subparsers(dest="bench_command", required=True)
    serving = bench_sub.add_parser("serving", help="load-test a running server")
    bench.add_args(serving)
    serving.set_defaults(func=bench.main_from_args)
    return parser


def launch_server_main(argv: Sequence[str] | None = None) -> int:
    """`python -m radixlm.launch_server ...`: `radixlm serve ...` under SGLang's entry name."""
    parser = argparse.ArgumentParser(prog="python -m radixlm.launch_server")
    _add_serve_args(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.serve_argv = argv  # replicas of --dp-size get them again
    return _serve(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `radixlm` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.serve_argv = argv[1:]  # `serve`'s own arguments (replicas get them again)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
