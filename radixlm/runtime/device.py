"""Which device and dtype an engine (or a tensor-parallel rank) runs on.

Below both the model runner and the tensor-parallel workers, which each pick them from the
same settings.
"""

from __future__ import annotations

import torch

from radixlm.hostinfo import cpu_dtype_name
from radixlm.hostinfo import cpu_has_native_bf16 as cpu_has_native_bf16  # (re-exported)
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
    if device.type == "cuda" and config.dtype == "auto":
        return device, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cuda":
        return device, getattr(torch, config.dtype)
    return device, getattr(torch, cpu_dtype_name(config.dtype, checkpoint,
                                                  cpu_has_native_bf16()))
