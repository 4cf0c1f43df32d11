"""int8 K/V (``kv_cache_dtype="int8"``): the quantization rule, the pool's format and its
``read_slots`` / ``write_slots`` seam, pool sizing, bad values, and the real model.

The engine test compares the int8 pool with the fp32 one on the reference prompts of
test_engine_reference.py (fp32 model, native steps, fp32 activations, so the K/V storage
is the only difference): the mean |delta logprob| of the tokens both score, prompt and
greedy continuation, must stay <= 0.05 (measured 0.012 on the decoded tokens and 0.024 on
the prompts, 2-core Xeon); greedy agreement is reported, not asserted.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from test_engine_reference import PROMPTS

from radixlm.kernels import ref
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.kv_pool import KVPayload, KVPool, check_kv_cache_dtype

CPU = torch.device("cpu")


def _pool(kv_cache_dtype: str, dtype=torch.bfloat16, capacity=64, layers=3, heads=2, dim=16):
    return KVPool(capacity, layers, heads, dim, dtype, CPU, 4, 32, kv_cache_dtype=kv_cache_dtype)


def _fill(pool: KVPool, slots: list[int], seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    loc = torch.tensor(slots)
    for layer in range(len(pool.k_buffer)):
        k, v = (torch.randn(len(slots), *pool.k_buffer[0].shape[1:], generator=gen) * 3
                for _ in range(2))
        pool.store(layer, loc, k.to(pool.dtype), v.to(pool.dtype))


def test_quantize_kv_rule_and_error_bound() -> None:
    """scale = bf16(max|x| / 127); q = rne(x / scale) in -127..127; |x - q scale| <= scale / 2
    (+ the clamp of a max rounded below by the bf16 scale: at most half a step more)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, 64, generator=gen) * torch.logspace(-4, 4, 50)[:, None, None]
    x[7, 1] = 0
    q, s = ref.quantize_kv(x)
    assert q.dtype == torch.int8 and s.dtype == torch.bfloat16 and s.shape == (50, 3)
    amax = x.abs().amax(-1)
    assert torch.equal(s, (amax / 127).to(torch.bfloat16))
    assert int(q.abs().max()) == 127 and int(q[7, 1].abs().max()) == 0 and float(s[7, 1]) == 0
    err = (x - ref.dequantize_kv(q, s)).abs()
    assert bool((err <= s.float()[..., None] * 0.5 + amax[..., None] * 2 ** -8).all())
    assert bool((err.amax(-1) < amax / 100 + 1e-30).all())  # < 1% of the row's range
    ties = torch.tensor([[0.5, 1.5, 2.5, -0.5, 127.0]])  # scale 1.0: ties go to even
    assert ref.quantize_kv(ties)[0].tolist() == [[0, 2, 2, 0, 127]]


@pytest.mark.parametrize("kv_cache_dtype,dtype", [("int8", torch.bfloat16),
                                                  ("int8", torch.float32),
                                                  ("auto", torch.bfloat16),
                                                  ("auto", torch.float32)])
def test_read_write_slots_round_trip_the_pools_bytes(kv_cache_dtype, dtype) -> None:
    pool = _pool(kv_cache_dtype, dtype)
    src = [5, 9, 2, 30, 31]
    _fill(pool, src)
    payload = pool.read_slots(src)
    per_token = KVPool.bytes_per_token(3, 2, 16, dtype, kv_cache_dtype)
    assert payload.num_tokens == 5 and payload.nbytes == 5 * per_token
    assert payload.layout == pool.layout
    assert payload.layout.startswith("int8/" if kv_cache_dtype == "int8" else str(dtype)[6:])
    dst = [40, 41, 42, 43, 44]
    pool.write_slots(dst, payload)
    bufs = pool.k_buffer + pool.v_buffer + pool.k_scale + pool.v_scale
    assert len(bufs) == (12 if kv_cache_dtype == "int8" else 6)
    for buf in bufs:  # byte for byte, compared as integers
        assert torch.equal(buf[dst].view(torch.uint8), buf[src].view(torch.uint8))
    for layer in range(3):  # and attention reads the same K/V there
        for a, b in zip(pool.rows(layer, torch.tensor(dst)), pool.rows(layer, torch.tensor(src))):
            assert torch.equal(a, b)
    # as one opaque byte string, and cut
    again = KVPayload.from_bytes(pool.layout, payload.to_bytes())
    assert len(payload.to_bytes()) == payload.nbytes
    assert all(torch.equal(a, b) for a, b in zip(again.arrays(), payload.arrays()))
    part = payload.slice(1, 3)
    assert part.num_tokens == 2 and torch.equal(part.k[2], payload.k[2][1:3])
    assert KVPayload.from_bytes(pool.layout, b"").num_tokens == 0


def test_payloads_of_another_layout_are_refused() -> None:
    int8, bf16 = _pool("int8"), _pool("auto")
    _fill(int8, [1, 2])
    payload = int8.read_slots([1, 2])
    with pytest.raises(ValueError, match="layout 'int8/L3/H2/D16' does not match.*bfloat16"):
        bf16.write_slots([3, 4], payload)
    with pytest.raises(ValueError, match="2 tokens for 3 slots"):
        int8.write_slots([3, 4, 5], payload)
    other = KVPool(64, 3, 2, 32, torch.bfloat16, CPU, 4, 32, kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="does not match"):
        other.write_slots([3, 4], payload)
    with pytest.raises(ValueError, match="not whole tokens"):
        KVPayload.from_bytes(int8.layout, payload.to_bytes()[:-1])
    with pytest.raises(ValueError, match="not a KV layout"):
        KVPayload.from_bytes("int4/L3/H2/D16", b"")


def test_the_same_memory_holds_about_twice_the_tokens(monkeypatch) -> None:
    """Pool sizing (``ModelRunner._pool_capacity``) at a fixed free memory, SmolLM2's shape
    (30 layers, 3 KV heads, head dim 64): int8 holds >= 1.9x the tokens of bf16 (1.94x:
    66 bytes a row instead of 128) and 3.9x those of fp32; the buffers allocated for those
    tokens fit the same bytes."""
    from radixlm.runtime import model_runner
    from radixlm.runtime.model_runner import ModelRunner

    monkeypatch.setattr(model_runner, "available_memory", lambda: 1 << 30)
    cfg = types.SimpleNamespace(num_layers=30, num_kv_heads=3, head_dim=64)

    def capacity(dtype, kv):
        runner = types.SimpleNamespace(dtype=dtype, device=CPU)
        return ModelRunner._pool_capacity(runner, EngineConfig(kv_cache_dtype=kv), cfg,
                                          2048, 0)

    bf16, int8 = capacity(torch.bfloat16, "auto"), capacity(torch.bfloat16, "int8")
    fp32 = capacity(torch.float32, "auto")
    assert int8 / bf16 >= 1.9 and int8 / fp32 >= 3.8
    budget = 0.15 * (1 << 30)  # mem_fraction of the free memory
    for tokens, kv in ((bf16, "auto"), (int8, "int8")):
        pool = KVPool(tokens, 30, 3, 64, torch.bfloat16, CPU, 2, 8, kv_cache_dtype=kv)
        assert abs(pool.nbytes - budget) <= 2 * KVPool.bytes_per_token(30, 3, 64,
                                                                       torch.bfloat16, kv)


def test_bad_kv_cache_dtypes_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto | int8"):
        EngineConfig(kv_cache_dtype="int4")
    for name in ("fp8_e4m3", "fp8_e5m2"):  # SGLang's names: valid, but not on a CPU
        EngineConfig(kv_cache_dtype=name)
        with pytest.raises(ValueError, match=f"kv_cache_dtype='{name}' is not supported on "
                                             "cpu: a CPU has no native fp8 conversions; "
                                             "supported here: auto | int8"):
            check_kv_cache_dtype(name, CPU)
    with pytest.raises(ValueError, match="not supported on cpu"):
        _pool("fp8_e4m3")


def test_engine_refuses_fp8_before_loading_the_model() -> None:
    from radixlm.runtime.engine import Engine

    with pytest.raises(ValueError, match="fp8_e5m2.*supported here: auto | int8"):
        Engine(kv_cache_dtype="fp8_e5m2", max_total_tokens=1024, log_level="warning")


def test_cli_flag_reaches_the_engine_config() -> None:
    from radixlm.cli import build_parser, engine_kwargs_from_args

    args = build_parser().parse_args(["serve", "--kv-cache-dtype", "int8"])
    assert EngineConfig.from_kwargs(**engine_kwargs_from_args(args)).kv_cache_dtype == "int8"
    args = build_parser().parse_args(["serve"])
    assert EngineConfig.from_kwargs(**engine_kwargs_from_args(args)).kv_cache_dtype == "auto"


@pytest.fixture(scope="module")
def engine_int8():
    from radixlm.runtime.engine import Engine

    engine = Engine(dtype="float32", kv_cache_dtype="int8", max_total_tokens=16384,
                    log_level="warning")
    yield engine
    engine.shutdown()


def _logprobs(out: dict, key: str) -> list[float]:
    return [lp for lp, _, _ in out["meta_info"][key] if lp is not None]


def test_engine_int8_logprobs_near_the_fp32_kv(engine_int8, engine_fp32, capsys) -> None:
    """The int8 pool on every path of the engine (native decode and prefill, the pool
    written and read back): prompt logprobs and the greedy continuation's logprobs (scored
    by the fp32-KV engine on the same tokens) within a mean |delta| of 0.05."""
    assert engine_int8.runner.pool.quantized and engine_int8.runner.native is not None
    params = {"temperature": 0, "max_new_tokens": 16}
    ours = engine_int8.generate(PROMPTS, params, return_logprob=True, logprob_start_len=0)
    theirs = engine_fp32.generate(PROMPTS, params, return_logprob=True, logprob_start_len=0)
    tok = engine_int8.tokenizer
    ids = [tok.encode(p, add_special_tokens=False) + o["output_ids"] for p, o in zip(PROMPTS,
                                                                                   ours)]
    scored = engine_fp32.generate(input_ids=ids, sampling_params={"max_new_tokens": 0},
                                  return_logprob=True, logprob_start_len=0)
    prompt_d, decode_d, agree = [], [], 0
    for a, b, s in zip(ours, theirs, scored):
        n = a["meta_info"]["prompt_tokens"]
        prompt_d += list(np.abs(np.subtract(_logprobs(a, "input_token_logprobs"),
                                            _logprobs(b, "input_token_logprobs"))))
        decode_d += list(np.abs(np.subtract(
            _logprobs(a, "output_token_logprobs"),
            [lp for lp, _, _ in s["meta_info"]["input_token_logprobs"][n:]])))
        agree += a["output_ids"] == b["output_ids"]
    with capsys.disabled():
        print(f"\nint8 KV vs fp32 KV on {len(PROMPTS)} reference prompts: mean |delta "
              f"logprob| prompt {np.mean(prompt_d):.4f} (max {np.max(prompt_d):.3f}), greedy "
              f"continuation {np.mean(decode_d):.4f} (max {np.max(decode_d):.3f}); greedy "
              f"text equal on {agree}/{len(PROMPTS)}")
    assert len(decode_d) == sum(len(o["output_ids"]) for o in ours) > 8 * len(PROMPTS)
    assert np.mean(prompt_d) <= 0.05 and np.mean(decode_d) <= 0.05
    assert np.mean(prompt_d + decode_d) > 0  # the int8 pool did change the numbers
    engine_int8.check_integrity()


def test_engine_int8_torch_path_stays_as_near(engine_int8, engine_fp32) -> None:
    """A prefill chunk larger than the native step size runs on the torch path (reading the
    int8 pool dequantized), the same prompt in 16-token chunks natively: both within a mean
    |delta logprob| of 0.05 of the fp32 KV. (Not closer to each other than that: rounding to
    int8 turns the two paths' ~1e-6 summation-order differences into whole quantization
    steps from layer to layer: identical int8 K bytes in layers 0-1, ~1% of them one step
    apart by layer 5.)"""
    from radixlm.runtime.engine import Engine

    prompt = " ".join(PROMPTS) * 2  # > 64 tokens: the torch path prefills it in one chunk
    ids = engine_int8.tokenizer.encode(prompt, add_special_tokens=False)
    assert len(ids) > 64
    params = {"max_new_tokens": 1, "temperature": 0}

    def prompt_logprobs(engine) -> np.ndarray:
        out = engine.generate(input_ids=ids, sampling_params=params, return_logprob=True,
                              logprob_start_len=0)
        return np.array(_logprobs(out, "input_token_logprobs"))

    exact, torch_path = prompt_logprobs(engine_fp32), prompt_logprobs(engine_int8)
    with Engine(dtype="float32", kv_cache_dtype="int8", max_total_tokens=4096,
                chunked_prefill_size=16, log_level="warning") as small_steps:
        native_path = prompt_logprobs(small_steps)
    for lps in (torch_path, native_path):
        assert 0 < np.abs(lps - exact).mean() <= 0.05


def test_tensor_parallel_ranks_keep_int8_pools(engine_fp32) -> None:
    """tp_size=2 (the torch path on each rank, each holding its KV heads' int8 rows): the
    same bound against the fp32 KV, on the greedy tokens of four reference prompts."""
    import os

    from radixlm.runtime.engine import Engine

    if (os.cpu_count() or 1) < 2:
        pytest.skip("tp=2 needs 2 CPU cores")
    params = {"temperature": 0, "max_new_tokens": 12}
    with Engine(dtype="float32", tp_size=2, kv_cache_dtype="int8", max_total_tokens=4096,
                context_length=512, log_level="warning") as engine:
        assert engine.runner.pool.quantized and engine.runner.tp is not None
        ours = engine.generate(PROMPTS[:4], params, return_logprob=True)
    theirs = engine_fp32.generate(PROMPTS[:4], params, return_logprob=True)
    deltas = [abs(a - b) for o, t in zip(ours, theirs) if o["output_ids"] == t["output_ids"]
              for a, b in zip(_logprobs(o, "output_token_logprobs"),
                              _logprobs(t, "output_token_logprobs"))]
    assert len(deltas) >= 24 and 0 < np.mean(deltas) <= 0.05
