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
        "--max-queued-requests", "3", "--attention-backend", "torch", "--log-level", "debug",
        "--grammar-backend", "outlines"])
    config = EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    assert config == EngineConfig(
        model="m", max_running_requests=4, max_total_tokens=999, chunked_prefill_size=64,
        schedule_policy="fcfs", disable_radix_cache=True, enable_jump_forward=False,
        dtype="float32", context_length=256, max_queued_requests=3, attention_backend="torch",
        log_level="debug", grammar_backend="outlines")


def test_bad_engine_value_is_rejected_by_the_config() -> None:
    args = build_parser().parse_args(["serve", "--schedule-policy", "random"])
    with pytest.raises(ValueError, match="schedule_policy"):
        EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    args = build_parser().parse_args(["serve", "--grammar-backend", "xgrammar"])
    with pytest.raises(ValueError, match="grammar_backend must be llguidance|outlines"):
        EngineConfig.from_kwargs(**engine_kwargs_from_args(args))


def test_sglang_json_whitespace_flags() -> None:
    """SGLang's --constrained-json-disable-any-whitespace / --constrained-json-whitespace-
    pattern reach the config (and the engine's default pattern); a pattern that may match
    anything but whitespace, or both at once, is refused by name."""
    def config(*flags):
        return EngineConfig.from_kwargs(**engine_kwargs_from_args(
            build_parser().parse_args(["serve", *flags])))

    c = config("--constrained-json-disable-any-whitespace")
    assert c.constrained_json_disable_any_whitespace is True
    assert c.json_whitespace == ""
    c = config("--constrained-json-whitespace-pattern", r"[ \n]{0,2}")
    assert c.json_whitespace == r"[ \n]{0,2}"
    with pytest.raises(ValueError, match="may match non-whitespace"):
        config("--constrained-json-whitespace-pattern", "[ a]?")
    with pytest.raises(ValueError, match="exclude each other"):
        config("--constrained-json-whitespace-pattern", " ",
               "--constrained-json-disable-any-whitespace")


def test_bench_serving_arguments() -> None:
    args = build_parser().parse_args(["bench", "serving", "--backend", "openai",
                                      "--request-rate", "2.5", "--max-concurrency", "4"])
    assert (args.backend, args.request_rate, args.max_concurrency) == ("openai", 2.5, 4)
    assert args.dataset == "random" and args.arrival == "poisson"


def test_shared_prefix_dataset_shares_prefixes() -> None:
    from radixlm.server.bench import make_dataset

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
    from radixlm.server.app import create_app

    fake = FakeEngine(context_len=4096, step_delay=0.001)
    with ThreadServer(create_app(fake)) as server:
        out = tmp_path / "b.json"
        code = main(["bench", "serving", "--base-url", server.base_url, "--backend", backend,
                     "--num-prompts", "5", "--input-len", "8", "--output-len", "4",
                     "--request-rate", "1000", "--arrival", "fixed", "--max-concurrency", "2",
                     "--output-json", str(out)])
    summary = json.loads(out.read_text())
    assert code == 0 and summary["completed"] == 5 and summary["failed"] == 0
    assert summary["total_output_tokens"] == 20
    assert summary["total_input_tokens"] == sum(len(c["text"]) for c in fake.calls)
    assert all(c["sampling_params"]["ignore_eos"] is True for c in fake.calls)
    assert summary["itl_ms"]["p50"] > 0 and summary["ttft_ms"]["p99"] > 0


def test_sglang_flag_names_parse_into_the_same_config() -> None:
    ours = build_parser().parse_args([
        "serve", "--model", "m", "--mem-fraction", "0.3", "--schedule-policy", "priority",
        "--tp-size", "1", "--dp-size", "1", "--chat-template", "chatml",
        "--tokenizer-path", "t", "--served-model-name", "x", "--random-seed", "7",
        "--priority-preemption-threshold", "2"])
    sglang = build_parser().parse_args([
        "serve", "--model-path", "m", "--mem-fraction-static", "0.3",
        "--enable-priority-scheduling", "--tp", "1", "--dp", "1", "--chat-template", "chatml",
        "--tokenizer-path", "t", "--served-model-name", "x", "--random-seed", "7",
        "--priority-scheduling-preemption-threshold", "2"])
    a = EngineConfig.from_kwargs(**engine_kwargs_from_args(ours))
    b = EngineConfig.from_kwargs(**engine_kwargs_from_args(sglang))
    assert a == b
    assert (a.model, a.mem_fraction, a.schedule_policy, a.chat_template, a.tokenizer_path,
            a.served_model_name, a.random_seed, a.priority_preemption_threshold) == (
        "m", 0.3, "priority", "chatml", "t", "x", 7, 2)


def test_launch_server_parser_takes_a_users_sglang_command() -> None:
    from radixlm.cli import _add_serve_args, ignored_flags

    parser = __import__("argparse").ArgumentParser()
    _add_serve_args(parser)
    args = parser.parse_args(
        "--model-path smollm2-135m-instruct --host 0.0.0.0 --port 30001 --dtype bfloat16 "
        "--context-length 2048 --mem-fraction-static 0.2 --max-running-requests 8 "
        "--max-total-tokens 9000 --chunked-prefill-size 512 --schedule-policy lpm "
        "--disable-radix-cache --api-key k --served-model-name s --random-seed 1 "
        "--log-level warning --tp-size 1 --dp-size 1 --trust-remote-code "
        "--cuda-graph-max-bs 16 --enable-metrics --enable-mixed-chunk "
        "--mixed-prefill-size 64".split())
    assert sorted(ignored_flags(args)) == ["cuda_graph_max_bs", "enable_metrics",
                                          "trust_remote_code"]
    config = EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    assert config == EngineConfig(
        model="smollm2-135m-instruct", dtype="bfloat16", context_length=2048,
        mem_fraction=0.2, max_running_requests=8, max_total_tokens=9000,
        chunked_prefill_size=512, mixed_prefill_size=64, disable_radix_cache=True,
        served_model_name="s",
        random_seed=1, log_level="warning")
    assert (args.host, args.port, args.api_key) == ("0.0.0.0", 30001, "k")
    with pytest.raises(SystemExit):
        parser.parse_args(["--no-such-flag"])


def test_engine_keywords_take_sglang_names(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="radixlm"):
        config = EngineConfig.from_kwargs(model_path="m", mem_fraction_static=0.25, tp_size=1,
                                          disable_cuda_graph=True, port=1234,
                                          enable_mixed_chunk=True)  # (what radixlm does)
    assert config == EngineConfig(model="m", mem_fraction=0.25)
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["ignored (no meaning in radixlm): disable_cuda_graph, port"]
    with pytest.raises(ValueError, match="same setting"):
        EngineConfig.from_kwargs(model="a", model_path="b")
    with pytest.raises(ValueError, match="mixed_prefill_size must be >= 1"):
        EngineConfig.from_kwargs(model="m", mixed_prefill_size=0)
    with pytest.raises(ValueError, match="unknown engine option"):
        EngineConfig.from_kwargs(model_path="m", speculative_eagle_topk=4)
    with pytest.raises(ValueError, match="speculative_algorithm='EAGLE' needs a draft model"):
        EngineConfig.from_kwargs(model_path="m", speculative_algorithm="EAGLE")
    assert EngineConfig.from_kwargs(tp_size=2).tp_size == 2  # checked against the model later
    with pytest.raises(ValueError, match="radixlm serve --dp-size"):
        EngineConfig.from_kwargs(dp_size=2)


def test_chat_template_by_name_or_file(tmp_path) -> None:
    from radixlm.formats.chat_templates import NAMED, load_chat_template

    assert load_chat_template("chatml") == NAMED["chatml"]
    jinja = tmp_path / "t.jinja"
    jinja.write_text("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}")
    assert load_chat_template(str(jinja)) == jinja.read_text()
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text('{"chat_template": "{{ messages[0][\'content\'] }}"}')
    assert load_chat_template(str(cfg)) == "{{ messages[0]['content'] }}"
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}")
    for arg, needle in ((str(bad), "not valid Jinja"), ("no-such-template", "known name"),
                        (str(tmp_path / "x.json"), "neither a file")):
        with pytest.raises(ValueError, match=needle):
            load_chat_template(arg)
