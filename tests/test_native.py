"""Native CPU ops (radixlm/native) against their torch twins, the GGUF blocks against the
file's dequantized weights, and the engine with the native path on, off and unavailable."""

from __future__ import annotations

import logging
import shutil
import subprocess
import types

import native_ref as ref
import numpy as np
import pytest
import torch

from radixlm.kernels import ref as kernels_ref
from radixlm.native import arena, build, ops
from radixlm.native.build import ACT_BF16, ACT_F32, ACT_INT8
from radixlm.native.qweights import (
    FMT_BF16,
    FMT_F32,
    FMT_Q4,
    FMT_Q8,
    dense_rows,
    from_gguf_raw,
    gguf_blocks,
    quantize_q4,
    quantize_q4_0,
    quantize_q8,
)

# On a host without a C compiler the engine runs the reference path (tested below with the
# compiler hidden); the kernel tests then have nothing to run.
needs_compiler = pytest.mark.skipif(build._compiler() is None,
                                    reason="no C compiler: the native library cannot be built")
pytestmark = needs_compiler

# Every SIMD path this x86-64 host can execute: its own (-march=native), AVX2 with FMA
# (the u8*s8 maddubs path of hosts without VNNI), and the plain C one.
VARIANTS = {"native": None, "avx2": ["-mavx2", "-mfma", "-mf16c"], "generic": ["-mno-avx"]}


@pytest.fixture(scope="module", params=list(VARIANTS))
def lib(request, tmp_path_factory):
    if request.param == "native":
        lib = build.load()
        assert lib is not None, "the native library must build on the test machine (gcc)"
        return lib
    flags = set(build.cpu_flags())
    if request.param == "avx2" and not {"avx2", "fma"} <= flags:
        pytest.skip("this host cannot execute AVX2")  # not an x86-64 AVX2 machine
    lib = build.load_variant(VARIANTS[request.param])
    expected = {"avx2": "avx2", "generic": "generic"}[request.param]
    assert lib.rlm_isa().decode() == expected
    return lib


def _assert_matches_twin(lib, w, x: torch.Tensor, act: str) -> None:
    """The kernel's product equals ref.qmatmul's (a build without bf16 dot products runs
    bf16 as fp32)."""
    out = ops.norm_matmul(lib, x, w, act=act)
    expected = ref.qmatmul(x, w, act="fp32" if act == "bf16" and not lib.rlm_bf16() else act)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)


def _rand_weight(fmt: int, n: int, k: int, seed: int):
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.1
    if fmt == FMT_F32:
        return dense_rows(w)
    if fmt == FMT_BF16:
        return dense_rows(torch.from_numpy(w).bfloat16().view(torch.int16).numpy()
                          .view(np.uint16))
    return quantize_q4(w) if fmt == FMT_Q4 else quantize_q8(w)


def test_library_reports_the_host_isa():
    isa = build.load().rlm_isa().decode()
    flags = build.cpu_flags()
    expected = ("avx512-vnni" if {"avx512_vnni", "avx512vl"} <= set(flags)
                else "avx-vnni" if "avx_vnni" in flags
                else "avx2" if {"avx2", "fma"} <= set(flags) else "generic")
    assert isa == expected



@pytest.mark.parametrize("variant", ["native", "avx2"])
def test_the_streaming_kernels_keep_their_prefetches(variant):
    """The kernels ask for weights ahead of use (prefetch_bytes, kx_ask_ahead, prefetch_rows;
    a 1B Q6_K decode step's weights stream 1.6x faster with them on a Zen 5). gcc deletes a
    call to a helper that only prefetches unless the helper is inlined first, silently: the
    built library is disassembled and its prefetch instructions counted."""
    if variant == "avx2" and not {"avx2", "fma"} <= set(build.cpu_flags()):
        pytest.skip("this host cannot execute AVX2")  # not an x86-64 AVX2 machine
    lib = build.load() if variant == "native" else build.load_variant(VARIANTS["avx2"])
    objdump = shutil.which("objdump")
    assert objdump, "objdump (binutils, which gcc links with) is missing"
    text = subprocess.run([objdump, "-d", "--no-show-raw-insn", lib._name], check=True,
                          capture_output=True, text=True).stdout
    if lib.rlm_isa().decode() != "generic":
        assert text.count("prefetcht0") >= 8

def test_activation_quantization_matches_twin(lib):
    x = torch.randn(5, 96) * torch.tensor([0.01, 1.0, 30.0]).repeat_interleave(32)
    x[2, 32:64] = 0  # an all-zero block
    a, d, s = ops.quantize_act(lib, x)
    ra, rd, rs = ref.quantize_act(x)
    assert torch.equal(a, ra)
    torch.testing.assert_close(d, rd)
    torch.testing.assert_close(s, rs, rtol=1e-5, atol=1e-6)


def test_kquant_activation_quantization_matches_twin(lib):
    """The K-quants' activations: one scale a block of 256 (llama.cpp's Q8_K rule), the same
    bytes as the twin's, and the exact sums of a by 16 the kernels' m terms read."""
    x = torch.randn(4, 512) * torch.tensor([0.01, 30.0]).repeat_interleave(256)
    x[1, :256] = 0  # an all-zero block
    x[2, 7] = 500.0  # one outlier sets its block's scale
    a, d, sums = ops.quantize_act(lib, x, block=256)
    ra, rd, _ = ref.quantize_act(x, block=256)
    assert torch.equal(a, ra)
    torch.testing.assert_close(d, rd)
    assert torch.equal(sums.long(), ra.view(4, -1, 16).long().sum(-1))


def test_library_reports_its_bf16_and_amx_paths(lib, request):
    """bf16 dot products only in a build for a CPU that has them; AMX tiles only with
    AMX-BF16 in the CPU (and a kernel that grants them)."""
    flags = set(build.cpu_flags())
    native = request.node.callspec.params["lib"] == "native"
    assert lib.rlm_bf16() == int(native and "avx512_bf16" in flags)
    if not (native and "amx_bf16" in flags):
        assert lib.rlm_amx() == 0
    if not (native and {"amx_int8", "amx_bf16"} <= flags):
        assert lib.rlm_amx_i8() == 0
        assert lib.rlm_amx_kq() == 0
    elif lib.rlm_amx():  # the tile state granted: the int8 tiles run too, K-quants included
        assert lib.rlm_amx_i8() == 1
        assert lib.rlm_amx_kq() == 1  # (0: the tiles' K-quant sums disagree with the 512-bit ones)


@pytest.mark.parametrize("fmt", [FMT_Q4, FMT_Q8])
@pytest.mark.parametrize("act", ["fp32", "int8", "bf16"])
@pytest.mark.parametrize("n,k", [(1, 32), (37, 96), (130, 576), (6, 1024)])
@pytest.mark.parametrize("t", [1, 2, 3, 9, 37, 70])
def test_quantized_matmul_matches_twin(lib, fmt, act, n, k, t):
    """Every activation mode on odd shapes: 2-3 tokens share unpacked weights; 37 and 70
    tokens take the AMX tiles where the host has them (a partial last token group, and
    more than 64 tokens). A build without bf16 dot products runs bf16 as fp32."""
    _assert_matches_twin(lib, _rand_weight(fmt, n, k, seed=n + k + t), torch.randn(t, k), act)


@pytest.mark.parametrize("fmt", [FMT_Q4, FMT_Q8])
@pytest.mark.parametrize("k", [96, 576, 1024])
def test_int8_rows_are_the_same_bits_at_every_step_size(lib, fmt, k):
    """With int8 activation blocks a token's products are summed in the same order whatever
    else shares the step (alone, 2-3 tokens, groups of 4 and the rest, and from 16 tokens
    Q8 rows on AMX int8 tiles where the host has them: whole-block integer sums scaled as
    the 512-bit path scales them, 45 rows = two 16-row tiles and a tail on that path): the
    same bits, so a step verifying drafts at one-token rounding reproduces decoding exactly,
    and a prompt's prefill rounds as its tokens would alone."""
    w = _rand_weight(fmt, 45, k, seed=k)
    x = torch.randn(70, k)
    alone = torch.cat([ops.norm_matmul(lib, x[i:i + 1], w, act="int8") for i in range(70)])
    for t in (2, 3, 4, 5, 8, 13, 16, 17, 33, 70):
        together = torch.cat([ops.norm_matmul(lib, x[i:i + t], w, act="int8")
                              for i in range(0, 70, t)])
        assert torch.equal(together, alone), t


def test_int8_blocks_on_avx512_without_vnni(tmp_path):
    """An AVX-512 build without VNNI (a Skylake-X host): the 512-bit int8 path on maddubs,
    Q8 by the sign trick where the VNNI build takes the activations + 128 against signed
    weights. The integers are the same, so the same bits as this host's own build, at every
    step size, and the twin's products."""
    if not {"avx2", "fma", "avx512bw", "avx512vl", "avx512_vnni"} <= set(build.cpu_flags()):
        pytest.skip("this host has no AVX-512 VNNI to compare the build without it to")
    plain = build.load_variant(["-march=native", "-mno-avx512vnni", "-mno-avxvnni"])
    assert plain.rlm_isa().decode() == "avx2"
    for fmt, k in ((FMT_Q4, 576), (FMT_Q8, 576), (FMT_Q8, 96)):
        w = _rand_weight(fmt, 45, k, seed=k + fmt)
        x = torch.randn(13, k)
        alone = torch.cat([ops.norm_matmul(plain, x[i:i + 1], w, act="int8") for i in range(13)])
        torch.testing.assert_close(alone, ref.qmatmul(x, w, act="int8"), rtol=1e-4, atol=1e-4)
        for t in (4, 9, 13):
            together = torch.cat([ops.norm_matmul(plain, x[i:i + t], w, act="int8")
                                  for i in range(0, 13, t)])
            assert torch.equal(together, alone), (fmt, t)
            assert torch.equal(ops.norm_matmul(build.load(), x[:t], w, act="int8"),
                               alone[:t]), (fmt, t)


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_0", "Q4_1"])
def test_block_rows_repacked_are_the_same_bits(type_name):
    """Q8 / Q4 rows repacked 16 side by side (kx32.c: 512-bit VNNI builds without AMX int8
    tiles) give the bits of the plain rows at every step size, for a partial last chunk of
    16 blocks (k = 96, 544) and whole ones (1024), from contiguous arrays and from a GGUF's
    interleaved blocks; a repacked-only matrix's rows (the engine's embedding lookup)
    dequantize to gguf-py's numbers."""
    import gguf

    native = build.load()
    if not native.rlm_kx32_rows():
        pytest.skip("this host's build reads Q8 / Q4 rows in the plain layout only")
    kind = gguf.GGMLQuantizationType[type_name]
    ours = {"Q8_0": quantize_q8, "Q4_0": quantize_q4_0, "Q4_1": quantize_q4}[type_name]
    for n, k in ((32, 96), (48, 544), (16, 1024)):
        w = np.random.default_rng(n + k).standard_normal((n, k)).astype(np.float32) * 0.1
        raw = gguf.quants.quantize(w, kind)
        x = torch.randn(70, k)
        for weight in (ours(w), from_gguf_raw(type_name, raw)):
            for t in (1, 2, 3, 5, 8, 9, 17, 64, 70):
                assert torch.equal(ops.norm_matmul(native, x[:t], weight, act="int8"),
                                   ops.norm_matmul(native, x[:t], weight, act="int8",
                                                   repack=False)), (n, k, t)
        weight = from_gguf_raw(type_name, raw)
        dst = np.empty(int(native.rlm_kx_bytes(weight.fmt, n, k)), np.uint8)
        arena.repack(native, weight, dst)
        mat = arena._qmat(weight, [], dst)  # (no plain rows: what the engine's arena holds)
        rows = np.arange(n - 1, -1, -1, dtype=np.int64)
        out = torch.empty(n, k).numpy()  # (64-byte aligned: the rows are stored whole)
        native.rlm_dequant_rows(ops.ctypes.byref(mat), rows.ctypes.data, n, out.ctypes.data)
        np.testing.assert_array_equal(out, gguf.quants.dequantize(raw, kind)[::-1])


@pytest.mark.parametrize("fmt", [FMT_F32, FMT_BF16])
@pytest.mark.parametrize("act", ["fp32", "int8", "bf16"])
@pytest.mark.parametrize("n,k", [(1, 32), (37, 96), (130, 576)])
@pytest.mark.parametrize("t", [1, 2, 3, 4, 9, 37, 70, 300])
def test_dense_matmul_matches_twin(lib, fmt, act, n, k, t):
    """Dense rows (a checkpoint at its own precision): fp32 activations against fp32 or
    bf16 rows are the exact products (up to summation order) at every step size, through
    the small-step kernel (1-3 tokens), the row tiles and, on AVX2, the panel GEMM; bf16
    activations round as a torch bf16 linear (bf16 dot products, AMX tiles where the host
    has them, 300 tokens with the operands swapped); int8 activation blocks are for block
    weights, so dense rows read int8 steps' activations in fp32."""
    w = _rand_weight(fmt, n, k, seed=n + k + t)
    x = torch.randn(t, k)
    out = ops.norm_matmul(lib, x, w, act=act)
    twin = "fp32" if act == "int8" or (act == "bf16" and not lib.rlm_bf16()) else act
    torch.testing.assert_close(out, ref.qmatmul(x, w, act=twin), rtol=1e-4, atol=1e-4)
    if twin == "fp32":  # and what a torch fp32 linear computes from the same weights
        dense = torch.from_numpy(w.dequantize())
        torch.testing.assert_close(out, torch.nn.functional.linear(x, dense), rtol=1e-5,
                                   atol=1e-5)


@pytest.mark.parametrize("act", ["fp32", "bf16"])
@pytest.mark.parametrize("n,k", [(37, 96), (150, 576)])
def test_prefill_sized_matmul_matches_twin(lib, act, n, k):
    """300 tokens (a prefill chunk): on AMX the operands swap roles (weights as B tiles,
    output tiles stored straight into place) from 256 tokens on; a partial last group of
    tokens and of rows."""
    _assert_matches_twin(lib, _rand_weight(FMT_Q4, n, k, seed=n + k), torch.randn(300, k), act)


@pytest.mark.parametrize("act, tokens", [("int8", 4), ("bf16", 32)])
def test_rounded_activations_stay_within_stated_error(lib, act, tokens):
    """int8 blocks of activations (llama.cpp's scheme, ~0.5%) and bf16 rounding of
    activations and weights (the AMX batch path, as a torch bf16 linear): under 1%
    relative error against the exact product, documented."""
    w = _rand_weight(FMT_Q4, 256, 576, seed=1)
    x = torch.randn(tokens, 576)
    exact = ref.qmatmul(x, w)
    approx = ops.norm_matmul(lib, x, w, act=act)
    assert ((approx - exact).norm() / exact.norm()).item() < 0.01


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_act_mul_matches_twin(lib, act):
    """The vectorized exp of SiLU and gelu-tanh (and of the attention softmax) within a few
    ulp of torch, over the whole range: tiny, huge, both signs, and an odd tail."""
    g = torch.cat([torch.randn(1000) * 4, torch.tensor([0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0,
                                                         -100.0, 100.0, -1e4, 1e4, 20.5])])
    u = torch.randn(g.numel())
    f = (torch.nn.functional.silu if act == "silu"
         else lambda x: torch.nn.functional.gelu(x, approximate="tanh"))
    expected = (f(g.double()) * u.double()).float()
    # (gelu-tanh's far negative tail, under 1e-12, is exp of a cubic: its float32 argument
    # alone is ~1e-5 relative off there)
    atol = 1e-30 if act == "silu" else 1e-12
    torch.testing.assert_close(ops.act_mul(lib, g, u, act), expected, rtol=2e-6, atol=atol)


@pytest.mark.parametrize("vocab,words", [(100, 4), (100, 3), (2050, 65), (49152, 1536)])
def test_bitmask_equals_its_twin(lib, vocab, words):
    """The sampler's C bitmask sets the twin's -inf and nothing else, in place: a mask that
    covers the vocabulary, one narrower (the tail disallowed), one wider; rows all allowed,
    none allowed, random; a row view with a stride. What the C op does not take (bf16
    logits, a row count that differs) goes to the twin, whose answer or error it gives."""
    gen = torch.Generator().manual_seed(vocab + words)
    wide = torch.randn(4, vocab + 7, generator=gen)
    logits = wide[:, :vocab]  # (rows vocab + 7 floats apart)
    mask = torch.randint(-(2**31), 2**31 - 1, (4, words), generator=gen, dtype=torch.int32)
    mask[1], mask[2] = -1, 0
    mask[3, ::3] = 0
    expected, tail = kernels_ref.apply_token_bitmask(logits.clone(), mask), wide[:, vocab:].clone()
    apply = ops.bitmask_applier(lib)
    out = apply(logits, mask)
    assert out.data_ptr() == logits.data_ptr()
    assert torch.equal(logits, expected) and torch.equal(wide[:, vocab:], tail)
    half = torch.randn(4, vocab, generator=gen).bfloat16()
    twin = kernels_ref.apply_token_bitmask(half.clone(), mask)
    assert torch.equal(apply(half, mask), twin)
    with pytest.raises(RuntimeError):
        apply(torch.randn(3, vocab), mask)

def test_norm_then_matmul_matches_twin(lib):
    w = _rand_weight(FMT_Q8, 67, 64, seed=3)
    x, norm = torch.randn(6, 64) * 3, torch.rand(64) + 0.5
    out = ops.norm_matmul(lib, x, w, norm=norm, eps=1e-6)
    torch.testing.assert_close(out, ref.qmatmul(ref.rmsnorm(x, norm, 1e-6), w), rtol=1e-4,
                               atol=1e-4)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,dim", [(4, 2, 16), (3, 3, 64), (8, 1, 24), (2, 1, 6),
                                             (9, 3, 64), (9, 1, 64), (6, 2, 128),
                                             (10, 1, 128), (4, 1, 256), (8, 4, 256),
                                             (6, 6, 96)])
def test_attention_through_req_to_token_matches_twin(lib, kv_dtype, heads, kv_heads, dim):
    gen = torch.Generator().manual_seed(heads * dim)
    slots = 300
    k_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(kv_dtype)
    v_cache = torch.randn(slots, kv_heads, dim, generator=gen).to(kv_dtype)
    table = torch.randperm(slots - 1, generator=gen)[:3 * 90].view(3, 90).int() + 1  # scattered
    rows = torch.tensor([2, 0, 0, 1, 2])  # request 0 has two tokens in the step
    pos = torch.tensor([0, 40, 41, 89, 7])
    q = torch.randn(5, heads, dim, generator=gen)
    out = ops.attention(lib, q, rows, pos, table, k_cache, v_cache, dim ** -0.5)
    expected = ref.attention(q, rows, pos, table, k_cache, v_cache, dim ** -0.5)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    # Gemma 2's soft-cap of the scores (a cap under the scores' spread: it bites)
    out = ops.attention(lib, q * 4, rows, pos, table, k_cache, v_cache, dim ** -0.5, softcap=2.0)
    expected = ref.attention(q * 4, rows, pos, table, k_cache, v_cache, dim ** -0.5, softcap=2.0)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(out, ops.attention(lib, q * 4, rows, pos, table, k_cache,
                                                 v_cache, dim ** -0.5), atol=1e-3)


def test_gguf_blocks_are_the_files_own_numbers(model_dir):
    """Q4_1 / Q8_0 blocks read from the embedded GGUF dequantize to exactly what the gguf
    package dequantizes (and Q4_0, made with gguf's quantizer, likewise)."""
    import gguf

    from radixlm.runtime.weights import gguf_source

    path = gguf_source(model_dir)
    blocks = gguf_blocks(path)
    reader = gguf.GGUFReader(str(path))
    seen = set()
    for t in reader.tensors:
        if t.name not in ("blk.0.attn_q.weight", "blk.5.ffn_down.weight", "token_embd.weight"):
            continue
        expected = gguf.quants.dequantize(t.data, t.tensor_type).reshape(blocks[t.name].n, -1)
        np.testing.assert_array_equal(blocks[t.name].dequantize(), expected.astype(np.float32))
        seen.add(t.tensor_type.name)
    assert seen == {"Q4_1", "Q8_0"}
    w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_0)
    q40 = from_gguf_raw("Q4_0", raw)
    np.testing.assert_array_equal(
        q40.dequantize(), gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_0))


def test_native_blocks_match_the_dequantized_checkpoint(model_dir):
    """Under HF names (q/k rows un-permuted) the blocks are the converted fp32 weights."""
    from radixlm.runtime.weights import load_gguf_blocks, load_hf_config, load_state_dict

    blocks = load_gguf_blocks(model_dir, load_hf_config(model_dir))
    state = load_state_dict(model_dir)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj"
                 ".weight", "model.layers.7.mlp.up_proj.weight", "model.embed_tokens.weight"):
        np.testing.assert_allclose(blocks[name].dequantize(), state[name].numpy(), atol=1e-6)


PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three colors:\n1.",
           "Once upon a time, in a small village,", "Q: What is 12 times 12?\nA:"]


@pytest.fixture(scope="module")
def reference_engine():
    """The reference path: dense fp32 weights, torch ops, no native library."""
    from radixlm.runtime.engine import Engine

    engine = Engine(dtype="float32", weight_quant="none", max_total_tokens=8192,
                    log_level="warning")
    assert engine.runner.native is None
    yield engine
    engine.shutdown()


def _greedy(engine, prompts, n=24):
    outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": n},
                           return_logprob=True)
    return [o["output_ids"] for o in outs], [o["meta_info"]["output_token_logprobs"]
                                             for o in outs]


def test_engine_native_greedy_equals_reference(engine_fp32, reference_engine):
    """fp32 activations (``engine_fp32`` asks for them: the default rounds activations to
    int8 blocks at every step on most CPUs, see below): the native path's greedy text
    (batched and alone) equals the reference path's, and each chosen token's logprob is
    within 2e-3. (A comparison with another implementation, not of two runs: these
    prompts' smallest top-2 logprob gap, ~5e-3, is far above what the steps' composition
    moves an fp32 logprob, ~1.5e-5, measured.)"""
    assert engine_fp32.runner.native is not None
    assert engine_fp32.runner.native.act_modes == ((1, ACT_F32),)
    ids, lps = _greedy(engine_fp32, PROMPTS)
    ref_ids, ref_lps = _greedy(reference_engine, PROMPTS)
    assert ids == ref_ids
    for a, b in zip(lps, ref_lps):
        np.testing.assert_allclose([x[0] for x in a], [x[0] for x in b], atol=2e-3)
    alone, _ = _greedy(engine_fp32, [PROMPTS[1]])
    assert alone[0] == ref_ids[1]


def _assert_logprobs_near_reference(engine, reference_engine, prompts, new_tokens, atol):
    """Greedy-decode ``prompts`` together on ``engine``; every chosen token's logprob is
    within ``atol`` of the reference engine scoring the same text."""
    outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": new_tokens},
                           return_logprob=True)
    ids = [engine.tokenizer.encode(p, add_special_tokens=False) + o["output_ids"]
           for p, o in zip(prompts, outs)]
    refs = reference_engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0},
                                     return_logprob=True, logprob_start_len=0)
    for out, ref_out in zip(outs, refs):
        n_in = out["meta_info"]["prompt_tokens"]
        ours = [lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]]
        theirs = [lp for lp, _, _ in ref_out["meta_info"]["input_token_logprobs"][n_in:]]
        np.testing.assert_allclose(ours, theirs, atol=atol)


def test_engine_int8_activations_stay_close(reference_engine):
    """int8 activation blocks (a GGUF's default at every step where the CPU has u8 x s8
    SIMD; asked for here, since dtype="float32" makes auto fp32): chosen-token
    logprobs within 0.3 of the reference over 30 layers (measured ~0.2 at worst; greedy
    text may part on near-ties, as llama.cpp's)."""
    from radixlm.runtime.engine import Engine

    engine = Engine(dtype="float32", native_activations="int8", max_total_tokens=4096,
                    log_level="warning")
    try:
        assert engine.runner.native._mode(1) == ACT_INT8
        _assert_logprobs_near_reference(engine, reference_engine, PROMPTS[:1], 8, atol=0.3)
    finally:
        engine.shutdown()


def test_engine_bf16_batch_steps_stay_close(reference_engine):
    """The mixed plan on a bf16 model: steps of 8+ tokens run bf16 on AMX tiles, of 2+ tokens
    bf16 dot products on an AVX512-BF16 CPU without them, but steps under 8 tokens int8
    blocks where the CPU has u8 x s8 SIMD (else fp32; all fp32 without bf16 or u8 x s8). 16 requests
    decoded together, and one alone: every chosen token's logprob within 0.3 of the fp32
    reference scoring the same text (bf16 prefill and bf16 / int8 steps, as a torch bf16
    model would differ)."""
    from radixlm.native.build import int8_decode_preferred, load
    from radixlm.runtime.engine import Engine

    engine = Engine(dtype="bfloat16", native_activations="mixed", max_total_tokens=8192,
                    log_level="warning")
    try:
        lib = load()
        native = engine.runner.native
        lib_from = 8 if lib.rlm_amx() else (2 if lib.rlm_bf16() else 0)
        assert lib.rlm_bf16_min_rows() == lib_from
        small = ACT_INT8 if int8_decode_preferred() else ACT_F32
        expect_from = max(lib_from, 8) if lib_from and small == ACT_INT8 else lib_from
        assert native._mode(1) == small
        if expect_from:
            assert native._mode(expect_from - 1) == small
            assert native._mode(expect_from) == ACT_BF16
        else:
            assert native._mode(64) == ACT_F32

        def step(extends: int, tokens: int, cached: int):  # what accepts() reads
            return types.SimpleNamespace(num_tokens=extends * tokens,
                                         extend_lens_cpu=[tokens] * extends,
                                         seq_lens_cpu=[cached + tokens] * extends)

        # a GGUF read as a GGUF has no torch weights: every step runs natively
        assert native.max_rows is None
        assert all(native.accepts(step(*s)) for s in ((16, 4, 256), (16, 16, 64), (1, 300, 0),
                                                      (16, 16, 2000), (1, 1024, 0)))
        prompts = [f"{p} ({i})" for i in range(4) for p in PROMPTS[:4]]
        _assert_logprobs_near_reference(engine, reference_engine, prompts, 6, atol=0.3)
        _assert_logprobs_near_reference(engine, reference_engine, PROMPTS[:1], 8, atol=0.3)
    finally:
        engine.shutdown()


def test_fallback_when_the_library_is_unavailable(monkeypatch, caplog, tiny_model_dir):
    """No compiler: the engine starts on the reference path and says so once."""
    from radixlm.runtime.engine import Engine

    monkeypatch.setattr(build, "_compiler", lambda: None)
    build.load.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="radixlm.native.build"):
            engine = Engine(model=str(tiny_model_dir), dtype="float32", max_total_tokens=1024,
                            log_level="warning")
            try:
                assert engine.runner.native is None
                out = engine.generate("Hello", {"temperature": 0, "max_new_tokens": 4})
                assert out["meta_info"]["completion_tokens"] == 4
            finally:
                engine.shutdown()
        messages = [r.getMessage() for r in caplog.records if "native CPU ops" in r.getMessage()]
        assert len(messages) == 1 and "no C compiler" in messages[0]
    finally:
        build.load.cache_clear()


def test_build_key_covers_every_source_file(tmp_path, monkeypatch):
    """The cache key of a build covers the unit, every part and the header: editing any of
    them rebuilds."""
    import shutil

    csrc = tmp_path / "csrc"
    shutil.copytree(build.CSRC, csrc)
    monkeypatch.setattr(build, "CSRC", csrc)
    files = build.sources()
    assert {"cpu_ops.c", "rlm.h", "amx.c", "layer.c"} <= {p.name for p in files}
    key = build.build_key("cc", ["cc 1.0"])
    for path in files:
        text = path.read_text()
        path.write_text(text + "\n")
        assert build.build_key("cc", ["cc 1.0"]) != key, path.name
        path.write_text(text)
    assert build.build_key("cc", ["cc 1.0"]) == key


def test_native_off_by_environment(monkeypatch):
    monkeypatch.setenv("RADIXLM_NATIVE", "0")
    build.load.cache_clear()
    try:
        assert build.load() is None
    finally:
        build.load.cache_clear()


@pytest.fixture(scope="module")
def q8_model_dir(tiny_model_dir, tmp_path_factory):
    """The tiny random model with every linear rounded to Q8 blocks, so the native path's
    own quantization of this (non-GGUF) checkpoint reproduces its weights."""
    import shutil

    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("tiny-q8")
    for f in tiny_model_dir.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    state = load_file(str(tiny_model_dir / "model.safetensors"))
    for name, w in state.items():
        if w.ndim == 2:
            state[name] = torch.from_numpy(quantize_q8(w.numpy()).dequantize())
    save_file(state, str(out / "model.safetensors"))
    return out


def test_tiny_model_native_matches_reference_with_mixed_steps(q8_model_dir, lib, monkeypatch):
    """A non-GGUF checkpoint (head_dim 16; its weights Q8 values, rounded here): native
    greedy with fp32 activations equals the reference path's, on its own dense fp32 rows
    (the default) and on Q8 blocks (``quantization="q8_0"``, which reproduce those weights
    exactly), including a step that extends several tokens after a cached prefix and a
    batch of requests at different lengths; with each SIMD build (AVX2, generic too)."""
    from radixlm.runtime.engine import Engine

    monkeypatch.setattr(build, "load", lambda: lib)
    prompts = ["The weather today is", "The weather today is nice and", "A", "Numbers: 1, 2"]
    outs = {}
    for label, kw in (("dense", {}), ("q8_0", {"quantization": "q8_0"}),
                      ("ref", {"weight_quant": "none"})):
        engine = Engine(model=str(q8_model_dir), dtype="float32", native_activations="fp32",
                        max_total_tokens=2048, log_level="warning", **kw)
        try:
            assert (engine.runner.native is not None) == (label != "ref")
            assert engine.runner.precision["weights"] == ("fp32" if label != "q8_0"
                                                          else "q8_0 (quantized at load)")
            params = {"temperature": 0, "max_new_tokens": 12}
            first = engine.generate(prompts[0], params)["output_ids"]
            cached = engine.generate(prompts[1], params)  # prefix hit, then a 2-token extend
            assert cached["meta_info"]["cached_tokens"] > 0
            batch = [o["output_ids"] for o in engine.generate(prompts, params)]
            outs[label] = (first, cached["output_ids"], batch)
        finally:
            engine.shutdown()
    assert outs["dense"] == outs["ref"] and outs["q8_0"] == outs["ref"]


def test_cpu_isa_cap_emulates_an_avx2_host(monkeypatch):
    """RADIXLM_CPU_ISA=avx2 on any x86-64 host: the flags the paths are chosen from lose
    AVX-512/AMX, bf16 is not native (dtype auto -> fp32), the library is the AVX2 build,
    and torch's dispatch is capped by cap_cpu_isa; a bad value is named."""
    from radixlm import envs
    from radixlm.runtime.device import cpu_has_native_bf16

    if not {"avx2", "fma"} <= set(build.host_cpu_flags()):
        pytest.skip("this host cannot execute AVX2")
    monkeypatch.setenv("RADIXLM_CPU_ISA", "avx2")
    flags = build.cpu_flags()
    assert "avx2" in flags and not any(f.startswith(("avx512", "amx")) for f in flags)
    assert not cpu_has_native_bf16()
    build.load.cache_clear()
    try:
        lib = build.load()
        assert lib.rlm_isa().decode() == "avx2" and lib.rlm_bf16() == 0
    finally:
        build.load.cache_clear()
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        monkeypatch.setenv(name, "x")  # recorded, so teardown restores the original
        monkeypatch.delenv(name)
    envs.cap_cpu_isa()
    import os

    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2"
    assert os.environ["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    monkeypatch.setenv("RADIXLM_CPU_ISA", "avx9000")
    with pytest.raises(ValueError, match="RADIXLM_CPU_ISA"):
        build.cpu_flags()


def test_int8_one_token_steps_by_isa():
    """auto picks int8 activation blocks for the steps of a block-quantized model under 8
    tokens (one-token steps first of all) where the CPU multiplies u8 x s8 in SIMD (AVX2's
    maddubs, VNNI's dpbusd), whatever the vendor, and fp32 without (plain C builds, other
    architectures); larger steps fp32, or bf16 from ``bf16_from`` tokens on a bf16 model
    (never under 8 where int8 runs: its small steps round alike at every size); an explicit
    mode runs every step."""
    from radixlm.native.plan import activation_modes

    for flags, expected in ((["avx2", "fma"], True),
                            (["avx2", "fma", "avx512f", "avx512_vnni", "amx_int8"], True),
                            (["avx2", "fma", "avx_vnni"], True),
                            (["avx512_vnni"], True),
                            (["sse4_2", "ssse3", "avx"], False),
                            (["asimd", "asimddp"], False), ([], False)):
        assert build.int8_decode_preferred(flags) is expected, flags
    I8, F32, BF16 = ACT_INT8, ACT_F32, ACT_BF16
    # auto: int8 on every step where int8 runs (batch-invariant), else as mixed
    for bf16_from, dtype in ((8, torch.bfloat16), (2, torch.bfloat16), (0, torch.float32)):
        assert activation_modes("auto", bf16_from, dtype, True) == ((1, I8),)
    assert activation_modes("mixed", 8, torch.bfloat16, True) == ((1, I8), (8, BF16))  # AMX
    # bf16 dot products without AMX: int8 still under 8 tokens (same bits at every size)
    assert activation_modes("mixed", 2, torch.bfloat16, True) == ((1, I8), (8, BF16))
    assert activation_modes("auto", 2, torch.bfloat16, False) == ((1, F32), (2, BF16))
    assert activation_modes("mixed", 8, torch.float32, True) == ((1, I8), (8, F32))
    assert activation_modes("mixed", 0, torch.bfloat16, True) == ((1, I8), (8, F32))  # AVX2
    assert activation_modes("auto", 8, torch.bfloat16, False) == ((1, F32), (8, BF16))
    assert activation_modes("auto", 0, torch.float32, False) == ((1, F32),)
    assert activation_modes("fp32", 8, torch.bfloat16, True) == ((1, F32),)
    assert activation_modes("int8", 8, torch.float32, False) == ((1, I8),)


def test_int8_rule_under_the_isa_cap(monkeypatch):
    """RADIXLM_CPU_ISA caps the flags the rule reads: AVX2 keeps maddubs (int8), the plain
    C build has none (fp32)."""
    if not {"avx2", "fma"} <= set(build.host_cpu_flags()):
        pytest.skip("this host cannot execute AVX2")
    monkeypatch.setenv("RADIXLM_CPU_ISA", "avx2")
    assert build.int8_decode_preferred()
    monkeypatch.setenv("RADIXLM_CPU_ISA", "generic")
    assert not build.int8_decode_preferred()
