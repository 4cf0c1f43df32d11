"""A GGUF's weights placed while torch is being imported.

An engine's start on a 2-core host is mostly two things: importing torch (1.1-1.6 s of one
core, the interpreter's) and placing the weights in the native arena (the map populated and
the K-quant rows repacked: 0.4 s for a 1B Q4_K_M file, C code that releases the GIL). Neither
needs the other, so where the weights will be the native path's alone (``eligible``: a GGUF
on a CPU, one rank, no re-quantization, a family the native layer runs) the engine starts
``place_early`` on a thread of its own before it imports the runtime, and the model runner
takes the placed weights (``EarlyWeights``) instead of placing them itself.

Everything here is torch-free: the file's blocks (``gguf_load.native_blocks``), the
decoder's plan (``native/plan.py``: the same matrices in the same order, the same activation
modes, so the runner checks they agree), the arena (``native/arena.py``). The refusals the
runner makes before it allocates are made here first, with the same numbers: a damaged
vocabulary (the engine's check is awaited before the arena is made) and a model that does
not fit in the memory available (``memory.check_fits``).
"""

from __future__ import annotations

import logging
import os
import sys
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from radixlm import envs
from radixlm.hostinfo import cpu_dtype_name, cpu_has_native_bf16
from radixlm.native.arena import Placed, give_back, place_ahead
from radixlm.native.plan import decoder_modes, step_weights
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.gguf_load import NativeGGUF, is_gguf, native_blocks
from radixlm.runtime.grammar_setup import in_background
from radixlm.runtime.memory import available_memory, check_fits
from radixlm.runtime.models.shape import ModelConfig, kv_bytes_per_token, native_unsupported

logger = logging.getLogger(__name__)

# device files of a GPU torch could run on (CUDA, ROCm): with one present an "auto" device
# may be a GPU, and nothing is placed early
_GPU_DEVICES = ("/dev/nvidiactl", "/dev/kfd")


@dataclass
class EarlyWeights:
    """What ``place_early`` hands the model runner: the file's blocks and vectors
    (``gguf``), its matrices placed in the decoder's arena by the decoder's plan
    (``placed``), the memory available before the arena was made (``free``, bytes: the
    pool is sized from it, as it would have been) and the dtype the plan assumed."""

    gguf: NativeGGUF
    placed: Placed
    free: int
    dtype: str


def eligible(config: EngineConfig, model_path, hf_config) -> bool:
    """Whether the model runner will read this model natively on a CPU, every step from
    the file's blocks (``model_runner._reads_gguf_natively`` on a CPU device), as far as can
    be told without torch; where it cannot be told (an "auto" device on a host with a GPU),
    False."""
    if config.device not in ("cpu", "auto") or (
            config.device == "auto" and any(os.path.exists(d) for d in _GPU_DEVICES)):
        return False
    if (config.tp_size != 1 or config.quantization or config.weight_quant == "none"
            or config.kv_cache_dtype not in ("auto", "int8") or not envs.native_enabled()):
        return False
    return is_gguf(model_path) and native_unsupported(hf_config) is None


def start(config: EngineConfig, model_path, hf_config, context_len: int,
          checked: Future) -> Future | None:
    """``place_early`` on a thread of its own where ``eligible`` (None otherwise); its
    result (None where the native library cannot be had) or its error in the future.
    ``checked``: the engine's vocabulary check, awaited before anything is allocated."""
    if not eligible(config, model_path, hf_config):
        return None
    threads = _threads(importing="torch" not in sys.modules)
    return in_background(place_early, config, model_path, hf_config, context_len, checked,
                         threads)


def _missing(layer: int | None, attr: str, name: str):
    raise ValueError(f"weight {name} is missing from the model file")


def _threads(importing: bool) -> int:
    """The threads to place on: torch's default (its intra-op pool: OMP_NUM_THREADS, else
    this process's CPUs), one fewer while torch is being imported (that import is one
    thread's work, and the start's longest: the placement is not let slow it)."""
    try:
        n = max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        n = max(1, len(os.sched_getaffinity(0)))
    return max(1, n - 1) if importing else n


def place_early(config: EngineConfig, model_path, hf_config, context_len: int,
                checked: Future, threads: int) -> EarlyWeights | None:
    """The file's blocks read and its matrices placed as the native decoder places them
    (``NativeDecoder`` with ``every_step``: file pages given back as the arena copies
    them), on ``threads`` threads; None where the native library cannot be had (the runner
    then runs the torch path). A ValueError as the runner would raise it: a model that does
    not fit, a weight missing from the file, int8 activations asked on dense rows."""
    from radixlm.native.build import load

    lib = load()
    if lib is None:
        return None
    gguf = native_blocks(model_path, hf_config)  # (the file's structure checked first)
    checked.result()  # (a damaged vocabulary refused before anything is allocated)
    cfg = ModelConfig.from_hf(hf_config)
    dtype = cpu_dtype_name(config.dtype, None, cpu_has_native_bf16())
    per_token = kv_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype,
                                   config.kv_cache_dtype)
    free = available_memory()
    check_fits(Path(model_path).stat().st_size, per_token, free, context_len,
               config.max_total_tokens)
    weights = step_weights(gguf.blocks, cfg.num_layers, tied=True, embed_from_blocks=True,
                           missing=_missing)
    modes = decoder_modes(lib, config.activations, dtype, weights.flat, weights.head,
                          config.enable_deterministic_inference)
    placed = place_ahead(lib, weights, modes, threads, release=give_back)
    logger.debug("%s placed beside torch's import", Path(model_path).name)
    return EarlyWeights(gguf, placed, free, dtype)
