"""`radixlm` CLI parsing: serve options map onto EngineConfig / ServerSettings."""

from __future__ import annotations

import pytest

from radixlm.cli import build_parser, engine_kwargs_from_args
from radixlm.runtime.config import EngineConfig


def test_unset_serve_options_mean_engine_defaults() -> None:
    args = build_parser().parse_args(["serve"])
    kwargs = engine_kwargs_from_args(args)
    assert {k for k, v in kwargs.items() if v is not None} == {"model"}
    assert EngineConfig.from_kwargs(**kwargs) == EngineConfig()  # every key is a config field
    assert (args.host, args.port, args.api_key) == ("127.0.0.1", 30000, None)


def test_serve_options_reach_the_engine_config() -> None:
    args = build_parser().parse_args([
        "serve", "--model", "m", "--max-running-requests", "4", "--max-total-tokens", "999",
        "--chunked-prefill-size", "64", "--schedule-policy", "fcfs", "--disable-radix-cache",
        "--disable-jump-forward", "--dtype", "float32", "--context-length", "256",
        "--max-queued-requests", "3", "--attention-backend", "torch", "--log-level", "debug"])
    config = EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    assert config == EngineConfig(
        model="m", max_running_requests=4, max_total_tokens=999, chunked_prefill_size=64,
        schedule_policy="fcfs", disable_radix_cache=True, enable_jump_forward=False,
        dtype="float32", context_length=256, max_queued_requests=3, attention_backend="torch",
        log_level="debug")


def test_bad_engine_value_is_rejected_by_the_config() -> None:
    args = build_parser().parse_args(["serve", "--schedule-policy", "random"])
    with pytest.raises(ValueError, match="schedule_policy"):
        EngineConfig.from_kwargs(**engine_kwargs_from_args(args))


def test_bench_serving_arguments() -> None:
    args = build_parser().parse_args(["bench", "serving", "--backend", "openai",
                                      "--request-rate", "2.5", "--max-concurrency", "4"])
    assert (args.backend, args.request_rate, args.max_concurrency) == ("openai", 2.5, 4)
    assert args.dataset == "random" and args.arrival == "poisson"


def test_shared_prefix_dataset_shares_prefixes() -> None:
    from radixlm.runtime.server.bench import make_dataset

    reqs = make_dataset("shared-prefix", 6, input_len=40, output_len=3, seed=1, num_groups=2)
    heads = {r.prompt.split("\n")[0] for r in reqs}
    assert len(heads) == 2 and all(len(h.split()) == 30 for h in heads)
    assert len({r.prompt for r in reqs}) == 6
    assert make_dataset("random", 3, 10, 2, seed=1) == make_dataset("random", 3, 10, 2, seed=1)


@pytest.mark.parametrize("backend", ["radixlm", "openai"])
def test_bench_against_the_fake_server(backend: str, tmp_path) -> None:
    import json

    from server_fakes import FakeEngine, ThreadServer

    from radixlm.cli import main
    from radixlm.runtime.server.app import create_app

    fake = FakeEngine(context_len=4096, step_delay=0.001)
    server = ThreadServer(create_app(fake)).start()
    try:
        out = tmp_path / "b.json"
        code = main(["bench", "serving", "--base-url", server.base_url, "--backend", backend,
                     "--num-prompts", "5", "--input-len", "8", "--output-len", "4",
                     "--request-rate", "1000", "--arrival", "fixed", "--max-concurrency", "2",
                     "--output-json", str(out)])
    finally:
        server.stop()
    summary = json.loads(out.read_text())
    assert code == 0 and summary["completed"] == 5 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 20
    assert summary["total_input_tokens"] == sum(len(c["text"]) for c in fake.calls)
    assert all(c["sampling_params"]["ignore_eos"] is True for c in fake.calls)
    assert summary["itl_ms"]["p50"] > 0 and summary["ttft_ms"]["p99"] > 0
