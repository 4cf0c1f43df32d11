"""Batch invariance on the embedded model, in the spirit of SGLang's test_deterministic: a
greedy answer's token ids AND output logprobs are the same bits alone (``single``), inside
batches of other prompts (``mixed``), after a shared prefix was cached (``prefix``), on a
full cache hit (``radix_cache``), with its prompt chunked, from the host and disk tiers and
after a restart, after a retraction, and with speculation's verify steps; a seeded sample
(temperature 0.8) is the same text in a batch, from the cache, on another engine, with
speculation and as sample j of ``n`` (seed + j). The flag's plan (one activation mode for
every step) and its refusal of modes whose kernels round by step size are checked too, and
what the engine reports (the torch path under the flag: tests/test_deterministic_torch.py).

The default configuration (no flag, ``native_activations="auto"``) is batch-invariant on
the native path too (issue 30): the embedded GGUF runs every step natively in int8 blocks,
whose kernels (512-bit / AVX2 transposed chunks for small steps, AMX int8 tiles from 8
tokens) sum each token in one order. The ``default_*`` tests hold single / mixed (beside
prefills and beside decodes of other lengths) / prefix / radix_cache / chunked prefill at
several chunk sizes on that configuration, bit for bit, with a prompt long enough (> 256
tokens) that its steps cross every kernel's step-size threshold."""

from __future__ import annotations

import pytest
import torch

from radixlm.native import build
from radixlm.native.build import ACT_BF16, ACT_F32, ACT_INT8
from radixlm.native.plan import STEP_INVARIANT_MODES, activation_modes, invariant_plan
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.engine import Engine

pytestmark = pytest.mark.skipif(build.load() is None or not build.int8_decode_preferred(),
                                reason="needs the native library with int8 activations")

NEW = 16
GREEDY = {"temperature": 0.0, "max_new_tokens": NEW, "ignore_eos": True}
SAMPLED = {"temperature": 0.8, "max_new_tokens": NEW, "ignore_eos": True, "sampling_seed": 7}
SYSTEM = ("You are a careful assistant for a science museum. Answer every visitor in one or "
          "two plain sentences, name units where a number has one, and never invent facts "
          "about the exhibits, the opening hours or the prices of the tickets.")
QUESTIONS = ["What is the capital of France?", "Count from one to twenty, with commas.",
             "Why is the sky blue? Explain the physics of scattering in detail.",
             "Hi", "What is 12 times 7?", "Write a haiku about rain on a tin roof."]
# other requests of the mixed batches, of different lengths (4-240 tokens; the batch of 14
# is over a 1024-token prefill step)
OTHERS = [" ".join(f"word{i}x{j}" for j in range(n)) for i, n in enumerate((3, 20, 9, 50, 1,
                                                                               12, 30, 14))]
DET = {"enable_deterministic_inference": True, "max_total_tokens": 4096,
       "log_level": "warning"}


def answer(out: dict) -> tuple:
    """A greedy answer's identity: (token id, logprob) per output token (the bits)."""
    return tuple((tid, lp) for lp, tid, _ in out["meta_info"]["output_token_logprobs"])


def ask(engine: Engine, prompts: list[str], params: dict = GREEDY) -> list[tuple]:
    return [answer(o) for o in engine.generate(prompts, params, return_logprob=True)]


def alone_cold(engine: Engine, prompts: list[str], params: dict = GREEDY) -> list[tuple]:
    out = []
    for p in prompts:
        assert engine.flush_cache()
        out += ask(engine, [p], params)
    return out


@pytest.fixture(scope="module")
def engine():
    with Engine(speculative_algorithm="none", **DET) as e:
        yield e


@pytest.fixture(scope="module")
def texts(engine):
    return [engine.tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
        tokenize=False, add_generation_prompt=True) for q in QUESTIONS]


@pytest.fixture(scope="module")
def ref(engine, texts):
    """Each prompt alone on a flushed cache: the reference of every axis."""
    return alone_cold(engine, texts)


@pytest.fixture(scope="module")
def default():
    """The default configuration: no deterministic flag, default native activations."""
    with Engine(speculative_algorithm="none", max_total_tokens=4096,
                log_level="warning") as e:
        yield e


@pytest.fixture(scope="module")
def prompts(texts, default):
    """The chat prompts and one long one (a few hundred tokens: its prefill is one step of
    more than 256 tokens cold, several steps chunked or after a cached prefix)."""
    passage = " ".join(f"Room {i} holds the {kind} collection, {i * 7 + 3} objects from "
                       f"{1700 + 13 * i}." for i, kind in
                       enumerate((["mineral", "fossil", "clock", "engine", "telescope",
                                   "meteorite", "insect", "radio", "bird", "glass",
                                   "coin", "shell", "map", "camera", "violin"] * 2)[:18]))
    question = f"{passage} Which room holds the most objects, and how many are there?"
    long = default.tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        tokenize=False, add_generation_prompt=True)
    assert len(default.tokenizer.encode(long)) > 300
    return [*texts, long]


@pytest.fixture(scope="module")
def default_ref(default, prompts):
    """Each prompt alone on a flushed cache with the defaults (one prefill step each)."""
    assert len(default.tokenizer.encode(prompts[-1])) < default.config.chunked_prefill_size
    return alone_cold(default, prompts)


@pytest.fixture(scope="module")
def chunk16():
    with Engine(chunked_prefill_size=16, speculative_algorithm="none", **DET) as e:
        yield e


@pytest.fixture(scope="module")
def spec():
    with Engine(speculative_algorithm="NGRAM", **DET) as e:
        yield e


# ---------------------------------------------------------------- the plan and the flag


def test_the_plan_is_one_mode_for_every_step():
    bf16, fp32 = torch.bfloat16, torch.float32
    assert activation_modes("auto", 8, bf16, int8=True, deterministic=True) == ((1, ACT_INT8),)
    assert activation_modes("auto", 8, bf16, int8=False, deterministic=True) == ((1, ACT_BF16),)
    assert activation_modes("auto", 0, bf16, deterministic=True) == ((1, ACT_F32),)
    assert activation_modes("auto", 2, fp32, deterministic=True) == ((1, ACT_F32),)
    assert invariant_plan(((1, ACT_INT8),)) and ACT_INT8 in STEP_INVARIANT_MODES
    assert not invariant_plan(((1, ACT_INT8), (8, ACT_BF16)))
    assert invariant_plan(((1, ACT_F32),)) == (ACT_F32 in STEP_INVARIANT_MODES)


def test_the_flag_reaches_the_config_from_the_cli_and_sglang_kwargs():
    from radixlm.cli import build_parser, engine_kwargs_from_args
    from radixlm.runtime.server_args import IGNORED

    args = build_parser().parse_args(["serve", "--enable-deterministic-inference"])
    assert EngineConfig.from_kwargs(**engine_kwargs_from_args(args)) \
        .enable_deterministic_inference is True
    args = build_parser().parse_args(["serve"])
    assert EngineConfig.from_kwargs(**engine_kwargs_from_args(args)) \
        .enable_deterministic_inference is False
    assert "enable_deterministic_inference" not in IGNORED
    assert EngineConfig.from_kwargs(enable_deterministic_inference=True) \
        .enable_deterministic_inference


def test_a_rounding_mode_is_a_startup_error_and_the_torch_path_is_not(monkeypatch):
    """A native mode whose kernels round by step size is refused; without the native
    library the flag now runs the torch path's fixed-order kernels."""
    if ACT_F32 not in STEP_INVARIANT_MODES:
        with pytest.raises(ValueError, match="cannot honour native activations 'fp32'"):
            Engine(native_activations="fp32", **DET)
    from radixlm.runtime import model_runner

    monkeypatch.setattr(model_runner, "native_library", lambda config, device: None)
    with Engine(**DET) as e:
        assert e.runner.native is None and e.batch_invariant is True


def test_the_engine_and_the_server_report_batch_invariance(engine):
    from fastapi.testclient import TestClient

    from radixlm.server.app import create_app

    assert engine.batch_invariant is True and engine.get_stats()["batch_invariant"] is True
    assert engine.runner.native.max_rows is None  # every step native
    assert invariant_plan(engine.runner.native.act_modes)
    client = TestClient(create_app(engine))
    info = client.get("/get_server_info").json()
    assert info["batch_invariant"] is True and info["enable_deterministic_inference"] is True
    assert info["activations"] == "int8"
    body = {"text": "Hello", "sampling_params": {**SAMPLED, "max_new_tokens": 2}}
    assert client.post("/generate", json=body).json()["meta_info"]["reproducible"] is True
    out = engine.generate("Hello", SAMPLED)
    assert out["meta_info"]["reproducible"] is True
    assert "reproducible" not in engine.generate("Hello", GREEDY)["meta_info"]


def test_an_engine_that_is_not_invariant_says_so():
    with Engine(native_activations="fp32", max_total_tokens=1024, log_level="warning") as e:
        expected = ACT_F32 in STEP_INVARIANT_MODES
        assert e.batch_invariant is expected and e.get_stats()["batch_invariant"] is expected
        assert e.generate("Hello", SAMPLED)["meta_info"]["reproducible"] is expected


# ---------------------------------------------------------------- greedy, bit for bit


def test_single(engine, texts, ref):
    """The same prompt alone, cold, again (``ref`` was the first time)."""
    assert len(set(ref)) == len(ref)  # (different prompts, different answers)
    assert alone_cold(engine, texts[:3]) == ref[:3]


def test_mixed(engine, texts, ref):
    """Each prompt inside batches of 2-14 requests with other prompts of other lengths, at
    different positions."""
    for size in (2, 5, 14):
        assert engine.flush_cache()
        batch = [OTHERS[(i + size) % len(OTHERS)] for i in range(size - 1)]
        batch.insert(size // 2, texts[size % len(texts)])
        got = ask(engine, batch)
        assert got[size // 2] == ref[size % len(texts)], size
    assert engine.flush_cache()
    mixed = [t for pair in zip(texts, OTHERS) for t in pair]
    assert ask(engine, mixed)[::2] == ref


def test_prefix(engine, texts, ref):
    """After the shared system prompt was cached (a prompt of its own), each prompt reuses
    it: the same bits as computing it."""
    assert engine.flush_cache()
    head = texts[0][:texts[0].index(QUESTIONS[0])]
    engine.generate(head, {"max_new_tokens": 1})
    for text, expected in zip(texts, ref):
        out = engine.generate(text, GREEDY, return_logprob=True)
        assert out["meta_info"]["cached_tokens"] > 40
        assert answer(out) == expected


def test_radix_cache(engine, texts, ref):
    """A full hit: the prompt and its answer are in the tree; only the last token runs."""
    assert engine.flush_cache()
    for text, expected in zip(texts, ref):
        engine.generate(text, GREEDY)
        out = engine.generate(text, GREEDY, return_logprob=True)
        assert out["meta_info"]["cached_tokens"] == out["meta_info"]["prompt_tokens"] - 1
        assert answer(out) == expected


def test_chunked_prefill(chunk16, texts, ref):
    assert all(len(chunk16.tokenizer.encode(t)) > 3 * 16 for t in texts)
    assert alone_cold(chunk16, texts) == ref
    with Engine(chunked_prefill_size=64, speculative_algorithm="none", **DET) as chunk64:
        assert chunk64.flush_cache()
        assert ask(chunk64, texts) == ref


def test_host_and_disk_tiers_and_a_restart(tmp_path, texts, ref):
    tiers = {**DET, "max_total_tokens": 512, "enable_hierarchical_cache": True,
             "hicache_storage_backend": "file", "hicache_storage_dir": str(tmp_path),
             "speculative_algorithm": "none"}
    text, expected = texts[2], ref[2]

    def run(e: Engine, tier: str) -> None:
        out = e.generate(text, GREEDY, return_logprob=True)
        if tier != "none":
            assert out["meta_info"]["cached_tokens_details"][tier] > 0, tier
        assert answer(out) == expected, tier

    with Engine(**tiers) as a:
        run(a, "none")
        assert a.flush_cache("device")  # the prefix moves to the host tier
        run(a, "host")
        assert a.flush_cache("device") and a.flush_cache("host")
        run(a, "storage")
        assert a.scheduler.kv.tiers.storage.wait_idle()
    with Engine(**tiers) as b:  # a restart over the same directory
        run(b, "storage")


def test_retraction_and_resume(engine, texts, ref):
    """A pool far too small for the batch: requests are retracted and resumed (their
    prompt and output so far recomputed in other steps), greedy and seeded alike."""
    assert engine.flush_cache()
    seeded = ask(engine, texts, SAMPLED)
    with Engine(**{**DET, "max_total_tokens": 260}, speculative_algorithm="none") as e:
        got = ask(e, texts + texts)
        retracted = e.get_stats()["num_retractions_total"]
        assert retracted > 0
        assert ask(e, texts + texts, SAMPLED) == seeded + seeded
        assert e.get_stats()["num_retractions_total"] > retracted
    assert got == ref + ref


def test_speculation(spec, texts, ref):
    """n-gram drafts verified in steps of several tokens: the same bits as decoding."""
    outs = [spec.generate(t, GREEDY, return_logprob=True) for t in texts]
    assert sum(o["meta_info"]["spec_accept_token_num"] for o in outs) > 0  # drafts ran
    assert [answer(o) for o in outs] == ref
    assert spec.flush_cache()
    assert ask(spec, texts + OTHERS[:4])[:len(texts)] == ref


# ---------------------------------------------------------------- seeded sampling


def test_seeded_sampling_is_reproducible(engine, chunk16, spec, texts):
    """temperature 0.8 with a seed: the same text alone, in a batch, from the cache, on
    another engine (a restart, chunked), with speculation; sample j of n is seed + j."""
    text = texts[4]

    def sample(e: Engine, prompts: list[str], params: dict = SAMPLED) -> list[tuple]:
        outs = e.generate(prompts, params, return_logprob=True)
        assert all(o["meta_info"]["reproducible"] is True for o in outs)
        return [answer(o) for o in outs]

    assert engine.flush_cache()
    first = sample(engine, [text])[0]
    seeds = [sample(engine, [text], {**SAMPLED, "sampling_seed": 7 + j})[0] for j in (1, 2)]
    assert len({first, *seeds}) > 1  # it samples: other seeds, other text
    assert first != ask(engine, [text])[0]
    assert sample(engine, [text])[0] == first  # from the cache
    assert engine.flush_cache()
    assert sample(engine, OTHERS[:3] + [text] + OTHERS[3:5])[3] == first
    assert sample(engine, [text], {**SAMPLED, "n": 3}) == [first, *seeds]
    assert chunk16.flush_cache() and sample(chunk16, [text])[0] == first
    assert spec.flush_cache() and sample(spec, [text, *OTHERS[:2]])[0] == first


# ---------------------------------------------------------------- a safetensors checkpoint


def test_blocks_made_at_load_run_every_step_natively(tiny_model_dir):
    """A safetensors checkpoint quantized at load (q8_0) runs every step natively under the
    flag (prefill chunks too, which otherwise go to the torch path from 64 tokens): a
    100-token prompt's answer is the same bits alone, batched and chunked."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 1000, (n,), generator=gen).tolist() for n in (100, 7, 33)]

    def go(e: Engine, batch: list[list[int]]) -> list[tuple]:
        outs = e.generate(input_ids=batch, sampling_params=GREEDY, return_logprob=True)
        return [answer(o) for o in outs]

    kw = {**DET, "quantization": "q8_0", "speculative_algorithm": "none"}
    with Engine(str(tiny_model_dir), **kw) as e:
        assert e.batch_invariant and e.runner.native.max_rows is None
        alone = go(e, prompts[:1])
        assert e.flush_cache()
        assert go(e, prompts)[0] == alone[0]
    with Engine(str(tiny_model_dir), chunked_prefill_size=16, **kw) as e:
        assert go(e, prompts[:1]) == alone


# ---------------------------------------------------------------- the default configuration


def test_default_every_step_runs_one_rounding(default):
    """No flag, default activations: every step native, int8 blocks at every step size."""
    native = default.runner.native
    assert default.config.enable_deterministic_inference is False
    assert default.config.native_activations == "auto"
    assert native.max_rows is None and native.act_modes == ((1, ACT_INT8),)
    assert len({native._mode(n) for n in (1, 2, 7, 8, 12, 64, 300, 1024)}) == 1
    assert default.batch_invariant is True and default.get_stats()["batch_invariant"] is True


def test_default_single(default, prompts, default_ref):
    assert len(set(default_ref)) == len(default_ref)
    assert alone_cold(default, prompts[::3]) == default_ref[::3]


def test_default_mixed(default, prompts, default_ref):
    """Each prompt inside batches of other prompts of other lengths (one prefill step for
    all of them, then decode steps of the whole batch), at different positions."""
    for size in (2, 5, 14):
        assert default.flush_cache()
        batch = [OTHERS[(i + size) % len(OTHERS)] for i in range(size - 1)]
        k = size % len(prompts)
        batch.insert(size // 2, prompts[k])
        assert ask(default, batch)[size // 2] == default_ref[k], size
    assert default.flush_cache()
    assert ask(default, prompts) == default_ref  # the long one beside the short ones
    assert default.flush_cache()
    mixed = [t for pair in zip(prompts, OTHERS) for t in pair]
    assert ask(default, mixed)[::2] == default_ref


def test_default_mixed_with_decoding_neighbours(default, prompts, default_ref):
    """A prompt that arrives while 8 other requests decode: its prefill shares steps with
    their one-token rows, its decode steps are 9 rows at other positions (a step size
    where the ``mixed`` plan rounds otherwise than alone)."""
    longer = {**GREEDY, "max_new_tokens": 3 * NEW}
    for k in (0, len(prompts) - 1):
        assert default.flush_cache()
        streams = [default.generate(p, longer, stream=True) for p in [*OTHERS[:7], prompts[2]]]
        for s in streams:
            next(s)  # each has its first token: decoding
        assert ask(default, [prompts[k]])[0] == default_ref[k], k
        for s in streams:
            for _ in s:
                pass


def test_default_prefix(default, prompts, default_ref):
    """A shared system prompt cached first (a prompt of its own), and the long prompt's
    first part cached at a length that is no block or chunk boundary: the same bits as
    computing them."""
    assert default.flush_cache()
    head = prompts[0][:prompts[0].index(QUESTIONS[0])]
    default.generate(head, {"max_new_tokens": 1})
    for text, expected in zip(prompts, default_ref):
        out = default.generate(text, GREEDY, return_logprob=True)
        assert out["meta_info"]["cached_tokens"] > 40
        assert answer(out) == expected
    assert default.flush_cache()
    long = prompts[-1]
    default.generate(long[:len(long) * 2 // 3], {"max_new_tokens": 1})
    out = default.generate(long, GREEDY, return_logprob=True)
    assert out["meta_info"]["cached_tokens"] > 150
    assert answer(out) == default_ref[-1]


def test_default_radix_cache(default, prompts, default_ref):
    """A hit (prompt and answer in the tree: only the last prompt token runs) vs a miss."""
    assert default.flush_cache()
    for text, expected in zip(prompts, default_ref):
        default.generate(text, GREEDY)
        out = default.generate(text, GREEDY, return_logprob=True)
        assert out["meta_info"]["cached_tokens"] == out["meta_info"]["prompt_tokens"] - 1
        assert answer(out) == expected
    default.generate(prompts, GREEDY)  # every prompt cached: a batch of hits
    assert ask(default, prompts) == default_ref


@pytest.mark.parametrize("chunk", [16, 37, 64, 256])
def test_default_chunked_prefill(chunk, prompts, default_ref):
    """Prompts split in chunks of 16 / 37 (no multiple of a block or an AMX tile) / 64 /
    256 tokens: the long prompt's chunks run in steps of 5-256 tokens."""
    with Engine(chunked_prefill_size=chunk, speculative_algorithm="none",
                max_total_tokens=4096, log_level="warning") as e:
        assert e.config.chunked_prefill_size == chunk and e.batch_invariant
        assert alone_cold(e, prompts[-2:]) == default_ref[-2:]
        assert e.flush_cache()
        assert ask(e, prompts) == default_ref
