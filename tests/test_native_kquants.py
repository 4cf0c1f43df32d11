"""GGUF K-quants (Q4_K, Q5_K, Q6_K) in the native library, read in their own super-blocks:
dequantization bit-equal to gguf-py's, the matmul against its twin in every activation
mode and on every SIMD path, int8 rows the same bits at every step size."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import gguf
import native_ref as ref
import numpy as np
import pytest
import torch
from test_native import lib, needs_compiler  # noqa: F401  (the fixture over the variants)

from radixlm.native import build, ops
from radixlm.native.qweights import (
    FMT_Q4_K,
    FMT_Q5_K,
    FMT_Q6_K,
    KQUANTS,
    from_gguf_raw,
)

pytestmark = needs_compiler
TYPES = ["Q4_K", "Q5_K", "Q6_K"]


def kquant_rows(type_name: str, n: int, k: int, seed: int, top: float = 2e-3) -> np.ndarray:
    """Raw rows ``[n, k/256 * bytes]`` of random super-blocks (IQ4_NL: ``k/32`` blocks):
    every bit pattern of the quants and scales, with finite fp16 super-scales up to ``top``
    (weights up to ~500x)."""
    rng = np.random.default_rng(seed)
    size, offsets = SUPER_BLOCKS[type_name]
    nb = k // (32 if type_name == "IQ4_NL" else 256)
    raw = rng.integers(0, 256, (n, nb, size), dtype=np.uint8)
    for at in offsets:
        raw[..., at:at + 2] = (rng.uniform(top / 20, top, (n, nb)) *
                               rng.choice([1, -1], (n, nb))).astype(np.float16)[
            ..., None].view(np.uint8)
    return raw.reshape(n, -1)


# GGUF K-quant (and IQ4) type -> (bytes a super-block, offsets of its fp16 super-scales)
SUPER_BLOCKS = {"Q2_K": (84, (80, 82)), "Q3_K": (110, (108,)), "Q4_K": (144, (0, 2)),
                "Q5_K": (176, (0, 2)), "Q6_K": (210, (208,)), "IQ4_XS": (136, (0,)),
                "IQ4_NL": (18, (0,))}


def kquant_weight(type_name: str, n: int, k: int, seed: int):
    return from_gguf_raw(type_name, kquant_rows(type_name, n, k, seed))


def _dequant(lib, w, rows: np.ndarray) -> np.ndarray:  # noqa: F811
    keep: list = []
    mat = ops.qmat(w, keep)
    out = np.empty((len(rows), w.k), dtype=np.float32)
    idx = np.ascontiguousarray(rows, dtype=np.int64)
    lib.rlm_dequant_rows(ops.ctypes.byref(mat), idx.ctypes.data, len(rows), out.ctypes.data)
    return out


@pytest.mark.parametrize("type_name", TYPES)
def test_qweight_reads_the_files_super_blocks(type_name):
    raw = kquant_rows(type_name, 3, 512, seed=1)
    w = from_gguf_raw(type_name, raw)
    fmt = {"Q4_K": FMT_Q4_K, "Q5_K": FMT_Q5_K, "Q6_K": FMT_Q6_K}[type_name]
    assert (w.fmt, w.n, w.k, w.kind, w.origin) == (fmt, 3, 512, type_name.lower(), type_name)
    assert w.qs is raw and w.d is None and KQUANTS[fmt][0] == type_name
    assert np.array_equal(w.dequantize(), gguf.quants.dequantize(
        raw, gguf.GGMLQuantizationType[type_name]).reshape(3, 512))
    with pytest.raises(ValueError, match="not whole super-blocks"):
        from_gguf_raw(type_name, raw[:, :-1])


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantization_is_bit_equal_to_gguf_py(lib, type_name):  # noqa: F811
    """Every path's dequantization (the fp32 / bf16 matmuls, the embedding lookup) rounds as
    gguf-py's: one product, then one difference (never fused), bit for bit."""
    raw = kquant_rows(type_name, 7, 1024, seed=2)
    w = from_gguf_raw(type_name, raw)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(7, -1)
    got = _dequant(lib, w, np.array([6, 0, 3, 3]))
    assert np.array_equal(got.view(np.uint32), expected[[6, 0, 3, 3]].view(np.uint32))


@pytest.mark.parametrize("type_name", TYPES)
@pytest.mark.parametrize("act", ["int8", "fp32", "bf16"])
@pytest.mark.parametrize("n,k,t", [(1, 256, 1), (37, 512, 3), (130, 1024, 9), (6, 2048, 40)])
def test_kquant_matmul_matches_twin(lib, type_name, act, n, k, t):  # noqa: F811
    """The matmul against the dequantized super-blocks (int8: the activations rounded as
    the kernel rounds them). 40 tokens cross the int8 path's tile of 32 tokens."""
    w = kquant_weight(type_name, n, k, seed=n + k + t)
    x = torch.randn(t, k)
    out = ops.norm_matmul(lib, x, w, act=act)
    expected = ref.qmatmul(x, w, act="fp32" if act == "bf16" and not lib.rlm_bf16() else act)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("type_name", TYPES)
def test_int8_rows_are_the_same_bits_at_every_step_size(lib, type_name):  # noqa: F811
    """A token's sums run in one order whatever shares its step (alone, a few tokens, more
    than a tile; from 8 tokens AMX int8 tiles where the host has them, 45 rows = a 16-row
    tile and a tail on the 512-bit path per thread): the same bits, the base for
    batch-invariant outputs."""
    w = kquant_weight(type_name, 45, 768, seed=5)
    x = torch.randn(70, 768)
    alone = torch.cat([ops.norm_matmul(lib, x[i:i + 1], w, act="int8") for i in range(70)])
    for t in (2, 3, 5, 8, 16, 17, 33, 64, 70):
        together = torch.cat([ops.norm_matmul(lib, x[i:i + t], w, act="int8")
                              for i in range(0, 70, t)])
        assert torch.equal(together, alone), t


@pytest.mark.parametrize("type_name", TYPES)
def test_repacked_rows_are_the_files_rows(lib, type_name):  # noqa: F811
    """K-quant rows repacked 16 side by side (the 512-bit int8 kernel's layout, QMat.qx)
    hold the file's numbers: every row unpacks to the same bytes and scales as from the
    file's super-blocks (what the AMX int8 tiles read), and the matmul gives the same bits
    read either way at every step size, the rows past the last whole group of 16 from the
    file's rows."""
    w = kquant_weight(type_name, 45, 768, seed=11)
    keep: list = []
    mat = ops.qmat(w, keep, lib)
    if not lib.rlm_kx_rows():  # (AVX2 and plain C builds read the file's rows only)
        assert not mat.qx
        return
    assert mat.qx
    def aligned(count: int, dtype) -> np.ndarray:  # (the unpacking stores whole vectors)
        raw = np.zeros(count * np.dtype(dtype).itemsize + 64, np.uint8)
        start = -raw.ctypes.data % 64
        return raw[start:start + count * np.dtype(dtype).itemsize].view(dtype)

    for n in range(32):
        got, want = ([aligned(768, np.uint8), aligned(48, np.float32), aligned(24, np.float32)]
                     for _ in range(2))
        for repacked, out in ((1, got), (0, want)):
            lib.rlm_kq_unpack_row(ops.ctypes.byref(mat), n, repacked,
                                  *[a.ctypes.data for a in out])
        for a, b in zip(got, want):
            assert np.array_equal(a, b), n
    x = torch.randn(40, 768)
    for t in (1, 2, 7, 8, 9, 40):
        assert torch.equal(ops.norm_matmul(lib, x[:t], w, act="int8"),
                           ops.norm_matmul(lib, x[:t], w, act="int8", repack=False)), t


@pytest.mark.parametrize("type_name", TYPES)
def test_int8_rows_are_the_same_bits_on_every_build(lib, type_name):  # noqa: F811
    """Every build (512-bit, AVX2 with its repacked rows, plain C) sums a token's products
    with a K-quant row in one order: the same bits as this host's native build, repacked
    rows and the file's rows past the last group of 16 alike."""
    native = build.load()
    w = kquant_weight(type_name, 45, 768, seed=13)
    x = torch.randn(40, 768)
    for t in (1, 5, 40):
        assert torch.equal(ops.norm_matmul(lib, x[:t], w, act="int8"),
                           ops.norm_matmul(native, x[:t], w, act="int8")), t


def test_avx512_without_vnni_gives_this_hosts_bits(tmp_path):
    """An AVX-512 build without VNNI (maddubs pairs instead of dpbusd) sums the same
    integers: the same bits as this host's own build."""
    if not {"avx512bw", "avx512vl", "avx512_vnni"} <= set(build.cpu_flags()):
        pytest.skip("needs an AVX-512 VNNI host to compare the two builds")
    plain = build.load_variant(["-march=native", "-mno-avx512vnni", "-mno-avxvnni"])
    native = build.load()
    x = torch.randn(5, 1024)
    for type_name in TYPES:
        w = kquant_weight(type_name, 19, 1024, seed=9)
        assert torch.equal(ops.norm_matmul(plain, x, w, act="int8"),
                           ops.norm_matmul(native, x, w, act="int8")), type_name


# ------------------------------------------------------------------ a K-quant file served
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import make_gguf  # noqa: E402

# A Q4_K_M-like mix over the tiny shape (2 layers, hidden 256, FFN 512, tied head): every
# K-quant type in a layer, Q4_K beside Q6_K in one q | k | v concatenation, a Q8_0 matrix.
MIX = {"attn_v": "Q6_K", "ffn_down": ("Q5_K", "Q6_K"), "attn_output": "Q8_0"}


TOP = 1e-4  # super-scales: weights of ~0.05, a model whose int8 rounding stays small
TOP_SCALE = {"Q3_K": 10,  # (3-bit values under 6-bit scales: ~30x smaller weights at one d)
             "IQ4_XS": 0.25, "IQ4_NL": 2}  # (values to 127 under scales to 32, or none)


def _type_of(tname: str) -> str:
    parts = tname.split(".")
    kind = MIX.get(parts[2], "Q4_K") if parts[0] == "blk" else "Q4_K"
    return kind if isinstance(kind, str) else kind[int(parts[1]) % 2]


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen", "tiny-qwen3", "tiny-gemma3",
                                        "tiny-phi3"])
def kquant_gguf(request, tmp_path_factory) -> Path:
    """A random-weight GGUF of a tiny shape (Llama with a tied head; Qwen2 with q/k/v biases
    and its own head; Qwen3 with q/k head norms, heads of 128, q twice the hidden size;
    Gemma 3 with sandwich norms, gelu-tanh, scaled embeddings, heads of 256 under windows
    of 8; Phi-3 with q | k | v and gate | up stored fused) in K-quant super-blocks (random
    bytes: every bit pattern of quants and scales), with the embedded tokenizer."""
    path = tmp_path_factory.mktemp("kq") / f"{request.param}-kmix.gguf"
    return write_tiny_gguf(path, request.param, _type_of)


def write_tiny_gguf(path: Path, shape_name: str, type_of) -> Path:
    """A random-weight GGUF of ``make_gguf``'s tiny shape ``shape_name`` at ``path``, each
    matrix of the type ``type_of(tensor name)`` names (K-quants: random super-blocks of
    ``kquant_rows``; Q8_0 / Q5_0 / Q5_1: gguf-py's quantization of random weights), norms
    of ones, the embedded tokenizer."""
    shape = make_gguf.SHAPES[shape_name]
    writer = gguf.GGUFWriter(str(path), shape.arch)
    for key, value in (("block_count", shape.layers), ("context_length", shape.context),
                       ("embedding_length", shape.hidden),
                       ("feed_forward_length", shape.ffn), ("head_count", shape.heads),
                       ("head_count_kv", shape.kv_heads),
                       ("rope_dimension_count", shape.head_dim),
                       ("key_length", shape.head_dim), ("value_length", shape.head_dim),
                       ("rope_freq_base", shape.rope_theta),
                       ("layer_norm_rms_epsilon", shape.norm_eps)):
        getattr(writer, f"add_{key.replace('layer_norm_rms_epsilon', 'layer_norm_rms_eps')}")(
            value)
    make_gguf.add_family_keys(writer, shape)
    vocab = make_gguf._copy_tokenizer(writer, make_gguf.embedded_gguf())
    for i, (tname, dims) in enumerate(make_gguf.tensor_specs(shape, vocab)):
        if len(dims) == 1:
            writer.add_tensor(tname, np.ones(dims, dtype=np.float32))
            continue
        kind = type_of(tname)
        if kind not in SUPER_BLOCKS:
            raw = gguf.quants.quantize(np.random.default_rng(i).standard_normal(dims).astype(
                np.float32) * 0.05, gguf.GGMLQuantizationType[kind])
        else:
            raw = kquant_rows(kind, dims[0], dims[1], seed=i, top=TOP * TOP_SCALE.get(kind, 1))
        writer.add_tensor(tname, raw, raw_shape=raw.shape,
                          raw_dtype=gguf.GGMLQuantizationType[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@functools.cache
def _reference(path: Path):
    """transformers' GGUF reader on the file at fp32: its model and tokenizer, made once per
    file (the tests of both activation modes check against the same file; ~5 s a load)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def _chosen_are_argmax(path: Path, prompts: list[str], outs: list[dict], tol: float,
                       also: tuple[tuple[list[dict], float], ...] = ()) -> None:
    """transformers' GGUF reader (fp32) on the file, teacher-forced on the engine's tokens:
    each token the engine chose is the reference's argmax within ``tol`` (greedy equality
    that a near-tie between two tokens cannot flip); ``also``: more runs' (outs, tol)."""
    model, tok = _reference(path)
    runs = [(prompt, out, tol) for prompt, out in zip(prompts, outs)]
    runs += [(prompt, out, t) for more, t in also for prompt, out in zip(prompts, more)]
    for prompt, out, tol in runs:
        ids = tok(prompt).input_ids
        full = torch.tensor([ids + out["output_ids"]])
        with torch.inference_mode():
            logits = model(full).logits[0, len(ids) - 1:-1]
        spread = logits.max(-1).values - logits.median(-1).values
        assert float(spread.min()) > 20 * tol  # (a check that could tell a wrong token)
        for step, token in enumerate(out["output_ids"]):
            gap = float(logits[step].max() - logits[step, token])
            assert gap <= tol, (prompt, step, gap)


@pytest.mark.parametrize("act,tol", [("fp32", 1e-3), ("int8", 0.02)])
def test_a_kquant_file_runs_in_its_own_super_blocks(kquant_gguf, act, tol):
    """The file's Q4_K / Q5_K / Q6_K / Q8_0 tensors are the weights the steps read (no Q8
    re-encoding: the label names the file's types), prefill and 16 decode steps; the tokens
    chosen are transformers' argmax on the file (fp32 activations: up to summation order;
    int8: within llama.cpp's activation rounding)."""
    from radixlm.runtime.engine import Engine

    prompts = ["The capital of France is", "def fibonacci(n):", "Water boils at"]
    with Engine(str(kquant_gguf), dtype="float32", native_activations=act,
                max_total_tokens=2048, log_level="warning") as engine:
        weights = engine.runner.precision["weights"]
        assert {"q4_k", "q5_k", "q6_k", "q8_0"} <= set(weights.replace(",", " ").split())
        assert "(from Q" not in weights and engine.runner.native.max_rows is None  # as is
        arena = engine.runner.native.arena  # K-quant rows read where the file map has them
        lib = engine.runner.native.lib
        kx = lib.rlm_kx_rows()  # (Q4_K rows repacked for int8 steps)
        assert (arena.repacked_bytes > 0) == bool(kx)
        # Q8_0: copied, or repacked where every step is int8 on a build that reads it so
        kx8 = act == "int8" and bool(lib.rlm_kx32_rows())
        plain = arena.copied_bytes - arena.repacked_bytes
        assert arena.int8_only == kx8 and (plain > 0) != kx8
        assert arena.held_bytes + arena.repacked_bytes > 4 * plain
        outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": 16,
                                         "ignore_eos": True})
    _chosen_are_argmax(kquant_gguf, prompts, outs, tol)


@pytest.mark.parametrize("shape", ["tiny", "tiny-gemma3"])
def test_an_f16_file_runs_natively(shape, tmp_path):
    """An F16 GGUF (dense rows, head included: no torch weights beside them) is read as a
    GGUF and runs every step natively; the tokens chosen are transformers' argmax on the
    file (fp32 activations)."""
    from radixlm.runtime.engine import Engine

    path = tmp_path / f"{shape}-f16.gguf"
    make_gguf.write_gguf(path, make_gguf.SHAPES[shape], "F16")
    prompts = ["The capital of France is", "def fibonacci(n):"]
    with Engine(str(path), dtype="float32", max_total_tokens=1024,
                log_level="warning") as engine:
        assert engine.runner.gguf_native and engine.runner.native.max_rows is None
        assert engine.runner.precision["activations"] == "fp32"
        outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": 12,
                                         "ignore_eos": True})
    _chosen_are_argmax(path, prompts, outs, 1e-3)
