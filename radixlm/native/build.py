"""Compile the C library (``csrc/``) for this host on first use and load it with ctypes.

The library is built with ``-march=native`` on the machine that runs it, so the kernels
use what this CPU has (AVX-512 VNNI, AVX-VNNI, AVX2, or plain C elsewhere): the choice is
made at run time, per host. ``csrc/cpu_ops.c`` includes the parts (one translation unit,
see ``csrc/rlm.h``), so one compiler call builds it. The shared object is cached under the
user cache dir, keyed by every source file and the header, the compiler and the CPU's
feature flags (a cache dir shared between different hosts never hands one host another's
build; editing any source rebuilds). No compiler, a failed build or ``RADIXLM_NATIVE=0``:
``load()`` returns None and the engine runs the reference torch path; the reason is logged
once.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from radixlm import envs
from radixlm.hostinfo import cpu_flags
from radixlm.hostinfo import host_cpu_flags as host_cpu_flags  # (re-exported)
from radixlm.hostinfo import host_info as _cpu_host_info
from radixlm.hostinfo import host_line as host_line  # (re-exported, beside host_info)

logger = logging.getLogger(__name__)
CSRC = Path(__file__).with_name("csrc")
SOURCE = CSRC / "cpu_ops.c"  # the unit the compiler is given; it includes the others


def sources() -> list[Path]:
    """Every file the library is built from (the unit, its parts and the header)."""
    return sorted(p for p in CSRC.iterdir() if p.suffix in (".c", ".h"))


def int8_decode_preferred(flags: list[str] | None = None) -> bool:
    """Whether small steps (one-token steps first of all; plan.INT8_MAX_ROWS) of a
    block-quantized model run int8 activation blocks by default: where the CPU multiplies
    u8 x s8 bytes in SIMD, AVX2's ``maddubs`` or VNNI's ``dpbusd`` (llama.cpp's rule; the
    vendor does not matter). ``flags``: the CPU's (default: this host's, less what
    RADIXLM_CPU_ISA caps away).

    Measured (SmolLM2-135M Q4_1, 2 cores, 256 cached positions): an AMD EPYC Zen 3 with
    AVX2 alone, single-stream decode 52.4 tok/s fp32 -> 87.9 int8 (llama.cpp 60.4-75.0); a
    Zen 4 with AVX512-VNNI, a one-token step 6.4 -> 4.4 ms; an Intel Xeon with AVX512-VNNI
    and AMX (a busy shared VM: paired fp32 / int8 runs, their quietest quarter), 7.1 ->
    5.8 ms (fp32 model), 0.91x (bf16 model), and capped at AVX2 8.1 -> 6.9 ms
    (benchmarks/bench_decode_step.py --activations fp32,int8)."""
    have = set(cpu_flags() if flags is None else flags)
    return "avx2" in have or bool({"avx512_vnni", "avx_vnni"} & have)


_ARCH = {"avx2": ["-mavx2", "-mfma", "-mf16c"], "generic": ["-mno-avx"]}


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _build(cc: str, target: Path, arch: list[str] | None = None) -> None:
    """Compile to ``target`` (atomically). ``arch``: target flags; default ``-march=native``
    on x86-64 (tests also build AVX2-only and generic variants to check every path)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    if arch is None:
        isa = envs.cpu_isa()
        if isa != "native":
            arch = _ARCH[isa]
        else:
            arch = ["-march=native"] if platform.machine() in ("x86_64", "AMD64") else []
    base = [cc, "-O3", *arch, "-shared", "-fPIC", str(SOURCE), "-o", tmp, "-lm"]
    try:
        for extra in (["-pthread"], []):
            proc = subprocess.run(base[:2] + extra + base[2:], capture_output=True, text=True,
                                  timeout=300)
            if proc.returncode == 0:
                os.replace(tmp, target)
                return
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def _variant(arch: tuple[str, ...]) -> ctypes.CDLL:
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler")
    tag = hashlib.sha256(" ".join(arch).encode()).hexdigest()[:8]
    target = (envs.cache_dir() / "native" / f"variants-{build_key(cc, _version(cc))}"
              / f"cpu_ops-{tag}.so")
    if not target.exists():
        _build(cc, target, list(arch))
    lib = ctypes.CDLL(str(target))
    _declare(lib)
    return lib


def load_variant(arch: list[str]) -> ctypes.CDLL:
    """A build for explicit flags (e.g. ``["-mavx2", "-mfma"]``, or ``["-march=native",
    "-DRLM_PROFILE"]`` for stage timers), for tests that run the AVX2 or generic code paths
    on a host that would pick another, and for the step-profile benchmark. Built once per
    version of the sources (the cache dir, under ``load()``'s key) and loaded once a process."""
    return _variant(tuple(arch))


def _version(cc: str) -> list[str]:
    """The compiler's version line (part of the build key)."""
    return subprocess.run([cc, "--version"], capture_output=True, text=True,
                          timeout=30).stdout.splitlines()[:1]


def build_key(cc: str, version: list[str]) -> str:
    """The cache key of this host's build: every source file (name and text), the compiler
    and its version, the machine and the CPU flags the paths are chosen from."""
    texts = [f"{p.name}\n{p.read_text()}" for p in sources()]
    return hashlib.sha256("\n".join([*texts, cc, *version, platform.machine(),
                                     *cpu_flags()]).encode()).hexdigest()[:20]


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The native library, built for this host if needed; None (logged once) when it
    cannot be had."""
    if not envs.native_enabled():
        logger.info("native CPU ops off (RADIXLM_NATIVE=0): reference torch path")
        return None
    cc = _compiler()
    if cc is None:
        logger.warning("native CPU ops unavailable: no C compiler found (set CC); "
                       "running the reference torch path")
        return None
    try:
        target = envs.cache_dir() / "native" / f"cpu_ops-{build_key(cc, _version(cc))}.so"
        if not target.exists():
            logger.info("building native CPU ops for this host (once)")
            _build(cc, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        logger.warning("native CPU ops unavailable (%s): running the reference torch path",
                       exc)
        return None
    _declare(lib)
    logger.info("native CPU ops loaded (%s)", lib.rlm_isa().decode())
    return lib


class QMat(ctypes.Structure):
    _fields_ = [("fmt", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32),
                ("qs", ctypes.c_void_p), ("d", ctypes.c_void_p), ("m", ctypes.c_void_p),
                ("qx", ctypes.c_void_p)]


class RepackMany(ctypes.Structure):
    """One matrix of ``rlm_repack_many`` (csrc/layer.c): rows to repack (K-quant rows, or
    with ``blocks32`` Q8 / Q4 rows and their strides, as ``rlm_repack_kx32`` takes them),
    where, and the span of a file map to give back after."""

    _fields_ = [("src", ctypes.c_void_p), ("d", ctypes.c_void_p), ("m", ctypes.c_void_p),
                ("fmt", ctypes.c_int32), ("n", ctypes.c_int32), ("k", ctypes.c_int32),
                ("blocks32", ctypes.c_int32), ("qrow", ctypes.c_int64),
                ("qblk", ctypes.c_int64), ("drow", ctypes.c_int64), ("dblk", ctypes.c_int64),
                ("mrow", ctypes.c_int64), ("mblk", ctypes.c_int64), ("dst", ctypes.c_void_p),
                ("drop", ctypes.c_void_p), ("drop_len", ctypes.c_int64)]


class QCat(ctypes.Structure):
    """The row-concatenation of up to 3 matrices, each in its own format (csrc/rlm.h)."""

    _fields_ = [("count", ctypes.c_int32), ("part", QMat * 3)]


def qcat(mats: list[QMat]) -> QCat:
    if not 1 <= len(mats) <= 3:
        raise ValueError(f"a concatenation has 1 to 3 parts, not {len(mats)}")
    return QCat(len(mats), (QMat * 3)(*mats))


class Layer(ctypes.Structure):
    _fields_ = [("hidden", ctypes.c_int32), ("n_heads", ctypes.c_int32),
                ("n_kv_heads", ctypes.c_int32), ("head_dim", ctypes.c_int32),
                ("inter", ctypes.c_int32), ("eps", ctypes.c_float),
                ("attn_scale", ctypes.c_float), ("in_norm", ctypes.c_void_p),
                ("post_norm", ctypes.c_void_p), ("qkv_bias", ctypes.c_void_p),
                ("q_norm", ctypes.c_void_p), ("k_norm", ctypes.c_void_p),
                ("rope_pairs", ctypes.c_int32), ("qkv", QCat), ("o", QMat),
                ("gate_up", QCat), ("down", QMat), ("attn_out_norm", ctypes.c_void_p),
                ("mlp_out_norm", ctypes.c_void_p), ("act", ctypes.c_int32),
                ("window", ctypes.c_int32), ("rope_table", ctypes.c_int32),
                ("rot_half", ctypes.c_int32), ("softcap", ctypes.c_float)]


ACT_SILU, ACT_GELU_TANH = 0, 1  # Layer.act (csrc/rlm.h)


ACT_INT8, ACT_F32, ACT_BF16 = 0, 1, 2  # Step.act_mode (see csrc/rlm.h)


class Step(ctypes.Structure):
    _fields_ = [("T", ctypes.c_int32), ("kv_dtype", ctypes.c_int32),
                ("nthreads", ctypes.c_int32), ("max_ctx", ctypes.c_int32),
                ("act_mode", ctypes.c_int32), ("cos", ctypes.c_void_p), ("sin", ctypes.c_void_p),
                ("out_loc", ctypes.c_void_p), ("rows", ctypes.c_void_p),
                ("pos", ctypes.c_void_p), ("req_to_token", ctypes.c_void_p),
                ("r2t_stride", ctypes.c_int64), ("ws", ctypes.c_void_p),
                ("k_scales", ctypes.c_void_p), ("v_scales", ctypes.c_void_p),
                ("cos_b", ctypes.c_void_p), ("sin_b", ctypes.c_void_p)]


def _declare(lib: ctypes.CDLL) -> None:
    p, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_float
    lib.rlm_isa.restype = ctypes.c_char_p
    lib.rlm_bf16.restype = ctypes.c_int32
    lib.rlm_amx.restype = ctypes.c_int32
    lib.rlm_amx_i8.restype = ctypes.c_int32
    lib.rlm_amx_kq.restype = ctypes.c_int32
    lib.rlm_bf16_min_rows.restype = ctypes.c_int32
    lib.rlm_workspace_floats.argtypes = [ctypes.POINTER(Layer), i32, i32, i32]
    lib.rlm_workspace_floats.restype = i64
    lib.rlm_matmul_workspace_floats.argtypes = [i32, i32, i32]
    lib.rlm_matmul_workspace_floats.restype = i64
    lib.rlm_layers.argtypes = [ctypes.POINTER(Layer), i32, p, p, ctypes.POINTER(Step), p]
    lib.rlm_layers.restype = None
    lib.rlm_profile.argtypes = [p, i32]
    lib.rlm_profile.restype = i32
    lib.rlm_norm_head.argtypes = [ctypes.POINTER(QMat), p, f32, i32, p, p, p, i32, i32]
    lib.rlm_norm_head.restype = None
    lib.rlm_act_mul.argtypes = [p, p, i32, p, i32]
    lib.rlm_act_mul.restype = None
    lib.rlm_kx_rows.restype = i32
    lib.rlm_kx_bytes.argtypes = [i32, i32, i32]
    lib.rlm_kx_bytes.restype = i64
    lib.rlm_repack_many.argtypes = [ctypes.POINTER(RepackMany), i32, i32]
    lib.rlm_repack_many.restype = None
    lib.rlm_kx3_rows.restype = i32
    lib.rlm_kx32_rows.restype = i32
    lib.rlm_kq_unpack_row.argtypes = [ctypes.POINTER(QMat), i64, i32, p, p, p]
    lib.rlm_kq_unpack_row.restype = None
    lib.rlm_q3k_as_q6k.argtypes = [p, i64, p, i32]
    lib.rlm_q3k_as_q6k.restype = None
    lib.rlm_iq4_values.argtypes = [p, i64, i32, i32, i32, p, i32]
    lib.rlm_iq4_values.restype = None
    lib.rlm_q5_0_values.argtypes = [p, i64, p, p, i32]
    lib.rlm_q5_0_values.restype = None
    lib.rlm_iq4xs_scales.argtypes = [p, i64, p, i32]
    lib.rlm_iq4xs_scales.restype = None
    lib.rlm_dequant_rows.argtypes = [ctypes.POINTER(QMat), p, i32, p]
    lib.rlm_dequant_rows.restype = None
    lib.rlm_quantize_rows.argtypes = [p, i32, i32, p, p, p]
    lib.rlm_quantize_rows.restype = None
    lib.rlm_quantize_rows_k.argtypes = [p, i32, i32, p, p, p]
    lib.rlm_quantize_rows_k.restype = None
    lib.rlm_attention.argtypes = [p, i32, i32, i32, i32, f32, p, p, p, i64, p, p, i32, i32, p,
                                  p, p, f32]
    lib.rlm_attention.restype = None
    lib.rlm_store_kv.argtypes = [p, i32, i32, i32, p, p, p, i32]
    lib.rlm_store_kv.restype = None
    lib.rlm_apply_bitmask.argtypes = [p, i64, i32, i64, p, i64]
    lib.rlm_apply_bitmask.restype = None


def host_info() -> dict:
    """The host report every benchmark prints (``radixlm.hostinfo.host_info``) with the
    native library's line: the ISA of this host's build, or why there is none."""
    try:
        lib = load()
        native = lib.rlm_isa().decode() if lib is not None else "unavailable"
    except Exception as exc:  # noqa: BLE001 - a report, never a failure
        native = f"unavailable ({exc})"
    return _cpu_host_info(native)
