"""Which device and dtype an engine (or a tensor-parallel rank) runs on.

Below both the model runner and the tensor-parallel workers, which each pick them from the
same settings.
"""

from __future__ import annotations

import torch

from radixlm.hostinfo import cpu_flags
from radixlm.runtime.config import EngineConfig


def pick_device_dtype(config: EngineConfig, checkpoint: str | None = None
                      ) -> tuple[torch.device, torch.dtype]:
    """The device, and the dtype: ``config.dtype``, or for ``auto`` on a CPU the
    checkpoint's own (``checkpoint``: the dtype a safetensors config states) where the host
    computes it natively: fp32 stays fp32, bf16 is bf16 on a CPU with native bf16 and fp32
    elsewhere, fp16 is fp32 (exact); a checkpoint without one (a GGUF: its precision is its
    blocks) runs bf16 where native, else fp32. CUDA: bf16 where supported, else fp16."""
    device = torch.device("cuda" if config.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if config.device == "auto" else config.device))
    if config.dtype != "auto":
        return device, getattr(torch, config.dtype)
    if device.type == "cuda":
        return device, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if checkpoint in ("float32", "float16"):
        return device, torch.float32
    return device, torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def cpu_has_native_bf16() -> bool:
    """bf16 dot products in hardware (the flags RADIXLM_CPU_ISA leaves)."""
    flags = set(cpu_flags())
    return "avx512_bf16" in flags or "amx_bf16" in flags
