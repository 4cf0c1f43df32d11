"""GGUF types without a native kernel (radixlm/native/recode.py): Q3_K, Q5_0 and IQ4_NL
rewritten into Q6_K / Q8_0 blocks of the same numbers (bit-equal to gguf-py's
dequantization), IQ4_XS into Q8_0 blocks of its values with each block's scale rounded to
fp16, Q2_K and Q5_1 re-quantized to Q8_0 (within its rounding), each named by its origin;
files of them served with transformers' choices."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from test_native import lib, needs_compiler  # noqa: F401  (the fixture over the variants)
from test_native_kquants import SUPER_BLOCKS, _chosen_are_argmax, kquant_rows, write_tiny_gguf

from radixlm.native import recode
from radixlm.native.plan import describe_weights
from radixlm.native.qweights import gguf_blocks, recoded
from radixlm.native.recode import EXACT, PENDING, REQUANTIZED


def _raw(type_name: str, n: int, k: int, seed: int) -> np.ndarray:
    """Random rows of ``type_name``: K-quants every bit pattern of quants and scales (finite
    super-scales), the 32-blocks gguf-py's quantization of random weights."""
    if type_name in SUPER_BLOCKS:
        return kquant_rows(type_name, n, k, seed, top=1e-2)
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    return gguf.quants.quantize(w, gguf.GGMLQuantizationType[type_name])


def _source(type_name: str, raw: np.ndarray) -> np.ndarray:
    kind = gguf.GGMLQuantizationType[type_name]
    return np.asarray(gguf.quants.dequantize(raw, kind), np.float32).reshape(raw.shape[0], -1)


@pytest.mark.parametrize("type_name", sorted(EXACT))
def test_exact_recodes_hold_the_files_numbers(type_name):
    """Q3_K as Q6_K, Q5_0 and IQ4_NL as Q8_0: every weight the same float32 bits as
    gguf-py's dequantization of the file's blocks (signed zeros and all), in the kernel
    format's own block layout (what the native kernels read); a pending rewrite reads as
    the done one."""
    raw = _raw(type_name, 8, 512, seed=1)
    read = recoded(type_name, raw)  # (Q3_K, IQ4_NL: pending until the weight is placed)
    assert read.pending == (type_name if type_name in PENDING else None)
    w = read.materialized()
    assert w.pending is None and w.materialized() is w
    assert (w.kind, w.origin) == (EXACT[type_name].lower(), type_name)
    assert (w.n, w.k) == (read.n, read.k) == (8, 512)
    assert np.array_equal(read.dequantize(), w.dequantize())
    assert np.array_equal(w.dequantize().view(np.uint32), _source(type_name, raw).view(np.uint32))
    if type_name == "Q3_K":  # the Q6_K bytes dequantized by gguf-py's own Q6_K rule
        again = _source("Q6_K", w.qs)
        assert np.array_equal(again.view(np.uint32), _source("Q3_K", raw).view(np.uint32))


@needs_compiler
def test_the_librarys_q3_k_rewrite_is_the_numpy_rule():
    """``rlm_q3k_as_q6k`` (csrc/recode.c) writes the bytes of the numpy rule, alone and with
    its super-blocks split over a team (13 x 4 of them over 2 and 3 threads: unequal parts)."""
    raw = kquant_rows("Q3_K", 13, 1024, seed=4)
    expected = recode.q3_k_as_q6_k_numpy(raw)
    for threads in (1, 2, 3):
        assert np.array_equal(recode.q3_k_as_q6_k(raw, threads), expected)


def test_iq4_xs_holds_the_files_values_under_fp16_block_scales():
    """IQ4_XS as Q8_0: each value is the file's grid value (int8, exact), each block of 32
    shares one fp16 scale, the nearest to the file's ``d * (ls - 32)``: every weight within
    2^-11 of gguf-py's relatively (2^-25 x its value absolutely where the scale is below
    fp16's normal range), some not equal (a real rounding), the zero scales' ones zero;
    the pending rewrite reads as the done one."""
    raw = _raw("IQ4_XS", 8, 1024, seed=7)
    read = recoded("IQ4_XS", raw)
    assert read.pending == "IQ4_XS" and (read.n, read.k) == (8, 1024)
    w = read.materialized()
    assert (w.kind, w.origin, w.pending) == ("q8_0", "IQ4_XS", None)
    assert np.isin(w.qs, recode.IQ4_GRID).all() and w.d.dtype == np.float16
    source = _source("IQ4_XS", raw).reshape(8, -1, 32)
    ours = w.dequantize().reshape(8, -1, 32)
    assert np.array_equal(read.dequantize(), w.dequantize())
    bound = np.maximum(np.abs(source) * 2.0 ** -11, np.abs(w.qs.reshape(ours.shape)) * 2.0 ** -25)
    assert np.all(np.abs(ours - source) <= bound)
    assert np.any(ours != source)
    assert np.array_equal(ours == 0, source == 0)
    ratio = source / w.qs.reshape(ours.shape)  # (the grid holds no 0)
    assert np.array_equal(ratio.max(-1), ratio.min(-1))  # (the file's values, one scale)


@needs_compiler
@pytest.mark.parametrize("type_name", ["IQ4_NL", "IQ4_XS"])
def test_the_librarys_iq4_values_are_the_numpy_rule(type_name):
    """``rlm_iq4_values`` (csrc/recode.c) writes numpy's values and ``rlm_iq4xs_scales``
    numpy's IQ4_XS scales (rounded alike), alone and split over teams of 2
    and 3 threads (13 rows: unequal parts)."""
    raw = _raw(type_name, 13, 1024, seed=8)
    expected = recode.iq4_values_numpy(type_name, raw).reshape(13, -1, 32)
    blocks = raw.reshape(-1, recode.PENDING[type_name][0])
    for threads in (1, 2, 3):
        assert np.array_equal(recode.iq4_as_q8_0(type_name, raw, threads)[0], expected)
        if type_name == "IQ4_XS":  # (``rlm_iq4xs_scales``; the nibbles a copy)
            scales = recode.iq4_scales(type_name, blocks, threads)
            assert np.array_equal(scales.view(np.uint16),
                                  recode.iq4_xs_scales_numpy(blocks).view(np.uint16))
            qs, d = recode.iq4_nibbles(type_name, raw, threads)
            assert np.array_equal(qs.reshape(-1, 128), blocks[:, 8:])
            assert np.array_equal(d.reshape(-1).view(np.uint16), scales.view(np.uint16))


@needs_compiler
def test_the_librarys_q5_0_values_are_the_numpy_rule():
    """``rlm_q5_0_values`` (csrc/recode.c) writes numpy's Q8_0 values and the file's fp16
    scales, alone and split over teams of 2 and 3 threads (13 rows: unequal parts); random
    bytes, so every fifth-bit pattern."""
    raw = np.random.default_rng(5).integers(0, 256, (13, 1024 // 32 * 22), dtype=np.uint8)
    raw.reshape(-1, 22)[:, 1] &= 0x3B  # (finite fp16 scales)
    q_np, d_np = recode.q5_0_as_q8_0_numpy(raw)
    for threads in (1, 2, 3):
        q, d = recode.q5_0_as_q8_0(raw, threads)
        assert np.array_equal(q, q_np) and np.array_equal(d.view(np.uint16), d_np.view(np.uint16))


def test_iq4_xs_scales_past_fp16_are_refused():
    """A damaged IQ4_XS block whose d * (ls - 32) overflows fp16 (d = 60000, ls = 0): a
    ValueError naming it where the weight is rewritten, not infinities in the weights."""
    raw = _raw("IQ4_XS", 2, 256, seed=9)
    raw[1, 0:2] = np.array([60000], np.float16).view(np.uint8)
    raw[1, 2:8] = 0
    with pytest.raises(ValueError, match="IQ4_XS block scales past fp16"):
        recoded("IQ4_XS", raw).materialized()
    with pytest.raises(ValueError, match="not whole blocks of 136"):
        recoded("IQ4_XS", np.zeros((2, 135), np.uint8))
    with pytest.raises(ValueError, match="not whole blocks of 18"):
        recoded("IQ4_NL", np.zeros((2, 20), np.uint8))


@pytest.mark.parametrize("type_name", REQUANTIZED)
def test_requantized_types_are_within_q8_rounding(type_name):
    """Q2_K, Q5_1 (a minimum a block that no kernel format carries): Q8_0 blocks of their
    values, within half a Q8 step of each, and not all equal to them (a real rounding)."""
    raw = _raw(type_name, 8, 512, seed=2)
    w = recoded(type_name, raw)
    assert (w.kind, w.origin) == ("q8_0", type_name)
    source = _source(type_name, raw)
    step = (np.abs(source).reshape(8, -1, 32).max(-1) / 127).repeat(32, -1)
    err = np.abs(w.dequantize() - source)
    assert np.all(err <= step * 0.5 + 1e-3 * step + 1e-12) and err.max() > 0


def test_recode_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="not whole blocks of 110"):
        recoded("Q3_K", np.zeros((2, 100), np.uint8))
    with pytest.raises(ValueError, match="not whole blocks of 22"):
        recoded("Q5_0", np.zeros((2, 23), np.uint8))
    with pytest.raises(ValueError, match="IQ2_XS"):
        recoded("IQ2_XS", np.zeros((2, 66), np.uint8))


def test_gguf_blocks_recode_and_name_the_origin(tmp_path):
    """``gguf_blocks`` over a written file: a Q3_K and a Q5_0 tensor come back recoded and
    named by their origin; a dense (F32) tensor is left to run as dense rows."""
    w = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for tname, kind in (("blk.0.ffn_up.weight", "Q5_0"), ("blk.0.ffn_gate.weight", "Q3_K")):
        raw = _raw(kind, 8, 256, seed=3)
        writer.add_tensor(tname, raw, raw_shape=raw.shape,
                          raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.add_tensor("blk.0.ffn_down.weight", w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    blocks = gguf_blocks(path)
    assert set(blocks) == {"blk.0.ffn_up.weight", "blk.0.ffn_gate.weight"}
    up, gate = blocks["blk.0.ffn_up.weight"], blocks["blk.0.ffn_gate.weight"]
    assert describe_weights([up], up) == "gguf q8_0 (from Q5_0)"
    assert describe_weights([gate], gate) == "gguf q6_k (from Q3_K)"


# A Q3_K_M-like mix over the tiny shape: Q3_K for q, k, gate and up and the (tied)
# embedding, Q5_0 for v, a Q5_1 output projection, Q4_K for down.
MIX = {"attn_q": "Q3_K", "attn_k": "Q3_K", "ffn_gate": "Q3_K", "ffn_up": "Q3_K",
       "attn_v": "Q5_0", "attn_output": "Q5_1", "ffn_down": "Q4_K"}


def _mix(tname: str) -> str:
    parts = tname.split(".")
    return MIX[parts[2]] if parts[0] == "blk" else "Q3_K"


def test_a_q3_k_m_like_file_serves_transformers_choices(tmp_path):
    """A tiny Llama file of Q3_K / Q5_0 / Q5_1 / Q4_K tensors: the label names each recoded
    type's origin (Q5_0 runs in its own rows where every step is int8 on a kx32 build), and
    prefill plus 16 greedy steps choose transformers' argmax on the file
    (fp32 activations: up to summation order; int8: within the activations' rounding).
    Where every step is int8 on a build that repacks K-quant rows, the rewritten Q6_K rows
    are kept repacked only (the head's too: the token embedding's rows are unpacked from
    them), else beside their repacked copy."""
    def check(engine, act: str) -> None:
        weights = engine.runner.precision["weights"]
        native = engine.runner.native
        q5 = act == "int8" and bool(native.lib.rlm_kx32_rows())  # (Q5_0 in its own rows)
        for label in ("q6_k (from Q3_K)", "q5_0" if q5 else "q8_0 (from Q5_0)",
                      "q8_0 (from Q5_1)", "q4_k"):
            assert label in weights, weights
        repacked_only = act == "int8" and bool(native.lib.rlm_kx_rows())
        assert native.arena.int8_only == repacked_only
        assert (native.head.qs is None) == repacked_only  # (the tied embedding)

    _served_as_transformers_chooses(write_tiny_gguf(tmp_path / "tiny-q3mix.gguf", "tiny", _mix),
                                    check, 1e-3)


def _served_as_transformers_chooses(path, check, tol: float) -> None:
    """Prefill plus 16 greedy steps of three prompts at fp32 and int8 activations
    (``check(engine, act)`` on each engine first): every token chosen is transformers'
    argmax on the file (fp32 within ``tol``, int8 within 0.02)."""
    from radixlm.runtime.engine import Engine

    prompts = ["The capital of France is", "def fibonacci(n):", "Water boils at"]
    outs = {}
    for act in ("fp32", "int8"):
        with Engine(str(path), dtype="float32", native_activations=act,
                    max_total_tokens=2048, log_level="warning") as engine:
            check(engine, act)
            outs[act] = engine.generate(prompts, {"temperature": 0, "max_new_tokens": 16,
                                                  "ignore_eos": True})
    _chosen_are_argmax(path, prompts, outs["fp32"], tol, also=((outs["int8"], 0.02),))


def test_an_iq4_xs_file_serves_transformers_choices(tmp_path):
    """A tiny Llama file as llama.cpp's IQ4_XS mix writes it (IQ4_XS matrices and tied
    embedding, IQ4_NL down projections): the label names both origins, the int8 steps read
    kx32.c's IQ4 rows where the build has them (the embedding's unpacked from them), else
    Q8 rows, and the tokens chosen are transformers' argmax on the file (fp32 activations:
    up to the scales' fp16 rounding; int8: within the activations' rounding)."""

    def check(engine, act: str) -> None:
        weights, native = engine.runner.precision["weights"], engine.runner.native
        iq4 = act == "int8" and bool(native.lib.rlm_kx32_rows())  # (kx32.c's IQ4 rows)
        for kind in ("IQ4_XS", "IQ4_NL"):
            label = kind.lower() if iq4 else f"q8_0 (from {kind})"
            assert label in weights, weights
        assert native.arena.int8_only == iq4

    path = write_tiny_gguf(tmp_path / "tiny-iq4.gguf", "tiny",
                           lambda t: "IQ4_NL" if "ffn_down" in t else "IQ4_XS")
    _served_as_transformers_chooses(path, check, 2e-3)


@needs_compiler
@pytest.mark.parametrize("type_name", ["IQ4_NL", "IQ4_XS", "Q5_0"])
def test_iq4_rows_compute_their_q8_rewrites_bits(lib, type_name):  # noqa: F811
    """Where every step is int8 on a build with kx32 rows (512-bit VNNI without AMX), an
    IQ4 matrix is held at 18 bytes a row's block of 32 (the file's nibbles, the rewrite's
    fp16 scales: 288 a group of 16 rows' block), a Q5_0 one at its file's 22 (352: nibbles,
    fifth bits as masks, scales), and computes the bits of its Q8 rewrite's rows for steps
    of 1 to 64 tokens on 1 and 2 threads; its rows unpack (the embedding lookup) to the
    rewrite's numbers. Other builds place the Q8 rewrite."""
    import ctypes

    import torch

    from radixlm.native.arena import Arena
    from radixlm.native.ops import qmat
    from radixlm.native.qweights import FMT_IQ4, FMT_Q5, FMT_Q8

    raw = _raw(type_name, 48, 1024, seed=10)
    if type_name == "Q5_0":  # (random fifth bits: every pattern, not the quantizer's)
        raw.reshape(-1, 22)[:, 2:6] = np.random.default_rng(3).integers(
            0, 256, (raw.size // 22, 4), dtype=np.uint8)
    w = recoded(type_name, raw)
    arena = Arena([w], lib=lib, int8_only=True)
    mat, _ = arena.place(w)
    q8, keep = w.materialized(), []
    ref = qmat(q8, keep, lib)
    if lib.rlm_kx32_rows():
        fmt, size = (FMT_Q5, 22) if type_name == "Q5_0" else (FMT_IQ4, 18)
        assert (mat.fmt, arena.kind(w)) == (fmt, type_name.lower())
        assert arena.repacked_bytes == 48 * 1024 // 32 * size and not mat.qs
    else:
        assert (mat.fmt, arena.kind(w)) == (FMT_Q8, "q8_0")
    rng = torch.Generator().manual_seed(0)
    for t in (1, 2, 3, 7, 16, 64):
        x = torch.randn(t, 1024, generator=rng)
        for threads in (1, 2):
            assert torch.equal(_int8_matmul(lib, mat, x, threads),
                               _int8_matmul(lib, ref, x, threads)), (t, threads)
    rows = np.arange(48, dtype=np.int64)
    out = torch.empty(48, 1024)  # (64-byte aligned: the library stores whole vectors)
    lib.rlm_dequant_rows(ctypes.byref(mat), rows.ctypes.data, 48, out.data_ptr())
    assert np.array_equal(out.numpy(), q8.dequantize())


def test_a_pending_rewrite_is_placed_in_its_own_bytes():
    """The arena's copy path (a build that does not repack K-quant rows: no library here)
    sizes a pending Q3_K weight for its Q6_K rows and copies the rewrite in; a repacking
    arena holds it repacked only where every step is int8 (no rows kept beside)."""
    from radixlm.native import build
    from radixlm.native.arena import Arena

    raw = kquant_rows("Q3_K", 32, 512, seed=5)
    w = recoded("Q3_K", raw)
    arena = Arena([w], lib=None)
    mat, arrays = arena.place(w)
    assert arena.copied_bytes == 32 * 2 * 210 and not arena.int8_only
    assert np.array_equal(arrays[0], recode.q3_k_as_q6_k_numpy(raw))
    assert mat.qs == arrays[0].ctypes.data and not mat.qx
    native = build.load()
    if native is not None and native.rlm_kx_rows():
        for every_int8 in (True, False):
            arena = Arena([w], lib=native, int8_only=every_int8)
            mat, arrays = arena.place(w)
            assert arena.int8_only == every_int8 and bool(mat.qx)
            assert (mat.qs is None) == every_int8 and (arrays == []) == every_int8


def _int8_matmul(native, mat, x, threads: int):
    """``x @ W.T`` through the library's head job at int8 activations (the decode path)."""
    import ctypes

    import torch

    from radixlm.native.build import ACT_INT8

    out = torch.empty(x.shape[0], mat.n, dtype=torch.float32)
    ws = torch.empty(native.rlm_matmul_workspace_floats(x.shape[0], mat.k, threads))
    native.rlm_norm_head(ctypes.byref(mat), None, 1e-5, x.shape[0], x.data_ptr(), out.data_ptr(),
                      ws.data_ptr(), ACT_INT8, threads)
    return out


@needs_compiler
@pytest.mark.parametrize("n", [16, 48])
def test_q3_k_at_three_bits_gives_its_q6_k_rows_bits(lib, n):  # noqa: F811
    """Where every step is int8 on a build with kx3 rows (csrc/kx3.c: AVX2 and 512-bit), a
    Q3_K matrix is held at 3 bits a weight (1824 bytes a group of 16 rows' super-block) and
    computes the bits its Q6_K rewrite does in kx6 rows, for steps of 1 to 64 tokens on 1
    and 2 threads; its rows unpack (the embedding lookup) to gguf-py's dequantization of the
    file's blocks. A build without them (generic) keeps the Q6_K rows."""
    import ctypes

    import torch

    from radixlm.native.arena import Arena
    from radixlm.native.ops import qmat
    from radixlm.native.qweights import FMT_Q3_K

    raw = kquant_rows("Q3_K", n, 1024, seed=6, top=1e-2)
    w = recoded("Q3_K", raw)
    arena = Arena([w], lib=lib, int8_only=True)
    mat, arrays = arena.place(w)
    if not lib.rlm_kx3_rows():  # (generic or AMX int8 builds)
        assert mat.fmt != FMT_Q3_K and not arena.kx3(w)
        return
    assert mat.fmt == FMT_Q3_K and not mat.qs and mat.qx and arrays == []
    assert arena.repacked_bytes == n // 16 * 4 * 1824
    keep: list = []
    six = qmat(w.materialized(), keep, lib)  # the same numbers as Q6_K rows, kx6-repacked
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(0))
    for t in (1, 3, 8, 17, 64):
        for threads in (1, 2):
            got = _int8_matmul(lib, mat, x[:t], threads)
            assert torch.equal(got.view(torch.int32),
                               _int8_matmul(lib, six, x[:t], threads).view(torch.int32))
    rows = np.arange(n, dtype=np.int64)[::-1].copy()
    out = np.empty((n, 1024), np.float32)
    lib.rlm_dequant_rows(ctypes.byref(mat), rows.ctypes.data, n, out.ctypes.data)
    assert np.array_equal(out.view(np.uint32), _source("Q3_K", raw)[rows].view(np.uint32))



@needs_compiler
def test_q3_k_at_three_bits_on_avx512_without_vnni():
    """An AVX-512 build without VNNI (a Skylake-X host: maddubs pairs for dpbusd) holds
    Q3_K at 3 bits too and computes this host's own build's bits."""
    import torch

    from radixlm.native import build
    from radixlm.native.arena import Arena
    from radixlm.native.qweights import FMT_Q3_K

    if not {"avx512bw", "avx512vl", "avx512_vnni"} <= set(build.cpu_flags()):
        pytest.skip("needs an AVX-512 VNNI host to compare the two builds")
    native = build.load()
    if native.rlm_amx_i8():
        pytest.skip("an AMX int8 build keeps Q3_K as its Q6_K rows (no kx3 to compare)")
    plain = build.load_variant(["-march=native", "-mno-avx512vnni", "-mno-avxvnni"])
    raw = kquant_rows("Q3_K", 32, 1024, seed=8, top=1e-2)
    x = torch.randn(64, 1024, generator=torch.Generator().manual_seed(1))
    mats = []
    for build_lib in (plain, native):
        w = recoded("Q3_K", raw)
        arena = Arena([w], lib=build_lib, int8_only=True)
        mat, _ = arena.place(w)
        assert mat.fmt == FMT_Q3_K and not mat.qs
        mats.append((build_lib, mat, arena))
    for t in (1, 5, 64):
        a, b = (_int8_matmul(one, mat, x[:t], 2) for one, mat, _ in mats)
        assert torch.equal(a.view(torch.int32), b.view(torch.int32)), t
