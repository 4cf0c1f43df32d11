"""A GGUF's weights placed while torch is being imported.

Most of an engine's start on a 2-core host is two things: importing torch (0.6-0.9 s of one
core, nearly all of it under the GIL) and placing the weights in the native arena (0.3 s for
a 1B Q4_K_M file: the map populated, the K-quant rows repacked; C code). Neither needs the
other. Where the weights will be the native path's alone (``eligible``: a GGUF on a CPU, one
rank, no re-quantization, a family the native layer runs), the engine calls ``start`` before
it imports the runtime: the arena is made and populated there, on the engine's thread, and
the rows are placed in it on a thread of their own while torch is imported; the model runner
takes them (``EarlyWeights``) instead of placing them itself.

Two things decide that split (measured on a 2-core Zen 5 VM, the 1B Q4_K_M file): fresh
memory populated beside torch's import slowed that import by as much as the populating took
(the VM's page faults are one queue), so the arena is populated first; and a placement of a
ctypes call per matrix beside the import waited for the GIL at each call (0.7 s for 113
matrices against 0.2 s alone: the import holds the GIL through long C stretches), so the
repacking is one C call (``Arena.place_all``). Start to ready (``bench_start.py``, medians
of 5): 1.12 s placing after the import, 0.97 s this way.

Everything here is torch-free: the file's blocks (``gguf_load.native_blocks``), the decoder's
plan (``native/plan.py``: the same matrices in the same order and the same activation modes as
the decoder's, which checks they agree), the arena (``native/arena.py``). The refusals the
runner makes before it allocates are made here first, with the same numbers: a damaged
vocabulary (the engine's check is awaited before the arena is made) and a model that does not
fit in the memory available (``memory.check_fits``).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from radixlm import envs
from radixlm.hostinfo import cpu_dtype_name, cpu_has_native_bf16
from radixlm.native.arena import arena_for, give_back, place_in
from radixlm.native.plan import decoder_modes, step_weights
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.gguf_load import NativeGGUF, is_gguf, native_blocks
from radixlm.runtime.grammar_setup import in_background
from radixlm.runtime.memory import available_memory, check_fits
from radixlm.runtime.models.shape import ModelConfig, kv_bytes_per_token, native_unsupported

# device files of a GPU torch could run on (CUDA, ROCm): with one present an "auto" device
# may be a GPU, and nothing is placed early
_GPU_DEVICES = ("/dev/nvidiactl", "/dev/kfd")


@dataclass
class EarlyWeights:
    """What ``start`` hands the model runner: the file's blocks and vectors (``gguf``), its
    matrices being placed in the decoder's arena by the decoder's plan (``placing``: an
    ``arena.Placed``, or the error that stopped it), the memory available before the arena
    was made (``free``, bytes: the pool is sized from it, as it would have been) and the
    dtype the plan assumed."""

    gguf: NativeGGUF
    placing: Future
    free: int
    dtype: str


def eligible(config: EngineConfig, model_path, hf_config) -> bool:
    """Whether the model runner will read this model natively on a CPU, every step from the
    file's blocks (``model_runner._reads_gguf_natively`` on a CPU device), as far as can be
    told without torch; where it cannot be told (an "auto" device on a host with a GPU),
    False."""
    if config.device not in ("cpu", "auto") or (
            config.device == "auto" and any(os.path.exists(d) for d in _GPU_DEVICES)):
        return False
    if (config.tp_size != 1 or config.quantization or config.weight_quant == "none"
            or config.kv_cache_dtype not in ("auto", "int8") or not envs.native_enabled()):
        return False
    return is_gguf(model_path) and native_unsupported(hf_config) is None


def _missing(layer: int | None, attr: str, name: str):
    raise ValueError(f"weight {name} is missing from the model file")


def _threads() -> int:
    """torch's default thread count (its intra-op pool: OMP_NUM_THREADS, else this process's
    CPUs), which the runner would place on."""
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "")))
    except ValueError:
        pass
    affinity = getattr(os, "sched_getaffinity", None)  # (Linux; elsewhere every CPU)
    return max(1, len(affinity(0)) if affinity is not None else os.cpu_count() or 1)


def start(config: EngineConfig, model_path, hf_config, context_len: int,
          checked: Future) -> EarlyWeights | None:
    """Where ``eligible``, on the calling thread: the file's blocks read, the decoder's plan
    made, the arena made and populated, and its placement started on a thread of its own,
    one thread fewer than the runner's where torch is still to be imported (that import is
    one thread's work, and the start's longest: the placement is not let slow it), file
    pages given back as the arena copies them. None where not eligible or the native
    library cannot be had (the runner then does as it would). A ValueError as the runner
    would raise it, before anything is allocated: a damaged vocabulary (``checked``: the
    engine's check, awaited here), a model that does not fit, a weight missing from the
    file, int8 activations asked on dense rows."""
    if not eligible(config, model_path, hf_config):
        return None
    from radixlm.native.build import load

    lib = load()
    if lib is None:
        return None
    gguf = native_blocks(model_path, hf_config)  # (views of the file map: nothing allocated)
    cfg = ModelConfig.from_hf(hf_config)
    dtype = cpu_dtype_name(config.dtype, None, cpu_has_native_bf16())
    weights = step_weights(gguf.blocks, cfg.num_layers, tied=True, embed_from_blocks=True,
                           missing=_missing)
    modes = decoder_modes(lib, config.activations, dtype, weights.flat, weights.head,
                          config.enable_deterministic_inference)
    per_token = kv_bytes_per_token(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype,
                                   config.kv_cache_dtype)
    checked.result()  # (a damaged vocabulary refused before anything is allocated)
    free = available_memory()
    check_fits(Path(model_path).stat().st_size, per_token, free, context_len,
               config.max_total_tokens)
    threads = _threads()
    arena = arena_for(lib, weights, modes, threads)  # (populated: before torch's import)
    beside = max(1, threads - 1) if "torch" not in sys.modules else threads
    placing = in_background(place_in, arena, weights, modes, beside, give_back)
    return EarlyWeights(gguf, placing, free, dtype)
