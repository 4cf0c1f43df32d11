"""Which device and dtype an engine (or a tensor-parallel rank) runs on.

Below both the model runner and the tensor-parallel workers, which each pick them from the
same settings.
"""

from __future__ import annotations

import torch

from radixlm.hostinfo import cpu_flags
from radixlm.runtime.config import EngineConfig


def pick_device_dtype(config: EngineConfig) -> tuple[torch.device, torch.dtype]:
    device = torch.device("cuda" if config.device == "auto" and torch.cuda.is_available()
                          else ("cpu" if config.device == "auto" else config.device))
    if config.dtype != "auto":
        return device, getattr(torch, config.dtype)
    if device.type == "cuda":
        return device, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return device, torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def cpu_has_native_bf16() -> bool:
    """bf16 dot products in hardware (the flags RADIXLM_CPU_ISA leaves)."""
    flags = set(cpu_flags())
    return "avx512_bf16" in flags or "amx_bf16" in flags
