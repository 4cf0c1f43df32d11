"""SGLang's server-argument names, mapped onto ours. Pure Python (no torch).

A user switching from SGLang keeps their launch command and their `Engine(...)` /
`Runtime(...)` keywords. Three kinds of SGLang names exist here:

- renamed: the same setting under another radixlm name (`model_path` -> `model`,
  `mem_fraction_static` -> `mem_fraction`, ...); both spellings work;
- without meaning here (`IGNORED`): CUDA-graph sizes, download/load options, logging
  knobs, ... Accepted, with one warning naming each that was set;
- switches for what radixlm always does (`ALWAYS_ON`: `enable_mixed_chunk`, running
  requests decode in the steps that prefill others): accepted, nothing to change;
- everything else unknown is an error (argparse's, or ValueError from `EngineConfig`).

Names SGLang and radixlm spell the same (`context_length`, `schedule_policy`, ...) need no
entry. Server-only settings (`host`, `port`, `api_key`) mean nothing to an in-process Engine
and are ignored there with the same warning.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("radixlm")

# SGLang name -> radixlm EngineConfig field.
RENAMED = {
    "model_path": "model",
    "mem_fraction_static": "mem_fraction",
    "tp": "tp_size",
    "dp": "dp_size",
    "priority_scheduling_preemption_threshold": "priority_preemption_threshold",
    "schedule_low_priority_values_first": "low_priority_values_first",
}

# SGLang flags with no meaning in radixlm: name -> takes a value (False: a bare switch).
IGNORED: dict[str, bool] = {
    "trust_remote_code": False, "skip_server_warmup": False, "load_format": True,
    "download_dir": True, "revision": True, "page_size": True,
    "disable_cuda_graph": False, "cuda_graph_max_bs": True, "cuda_graph_bs": True,
    "disable_cuda_graph_padding": False, "enable_torch_compile": False,
    "torch_compile_max_bs": True, "disable_overlap_schedule": False,
    "enable_metrics": False, "enable_cache_report": False, "log_requests": False,
    "log_requests_level": True, "show_time_cost": False, "decode_log_interval": True,
    "watchdog_timeout": True, "base_gpu_id": True, "gpu_id_step": True, "enable_p2p_check": False,
    "disable_custom_all_reduce": False, "triton_attention_reduce_in_fp32": False,
    "sampling_backend": True, "schedule_conservativeness": True, "max_prefill_tokens": True,
    "stream_interval": True, "cpu_offload_gb": True, "tokenizer_mode": True,
    "enable_memory_saver": False, "disable_outlines_disk_cache": False,
    "file_storage_path": True, "enable_dp_attention": False, "mm_attention_backend": True,
    "prefill_attention_backend": True, "decode_attention_backend": True,
    # HiCache's GPU-side knobs (how host copies move over PCIe, their memory layout, when
    # they are written and prefetched): on a CPU host tier they mean nothing
    "hicache_io_backend": True, "hicache_mem_layout": True, "hicache_write_policy": True,
    "hicache_storage_prefetch_policy": True,
}

# SGLang switches for what radixlm always does: accepted without a warning.
ALWAYS_ON = ("enable_mixed_chunk",)

# Server-only settings: meaningful to `radixlm serve`, not to an in-process Engine.
SERVER_ONLY = ("host", "port", "api_key", "request_timeout", "max_body_bytes",
               "shutdown_timeout")


def warn_ignored(names: list[str]) -> None:
    """One warning naming the SGLang options that were set but mean nothing here."""
    if names:
        logger.warning("ignored (no meaning in radixlm): %s",
                       ", ".join(sorted(set(names))))


def to_engine_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """SGLang-spelled keyword arguments -> EngineConfig keyword arguments.

    Renamed names are translated (giving both spellings of one setting is a ValueError);
    ignored and server-only names are dropped with one warning; the rest pass through for
    `EngineConfig.from_kwargs` to accept or reject."""
    out: dict[str, Any] = {}
    ignored = []
    for name, value in kwargs.items():
        if name in ALWAYS_ON:
            continue
        if name in IGNORED or name in SERVER_ONLY:
            if value not in (None, False):
                ignored.append(name)
            continue
        if name == "enable_priority_scheduling":  # handled below
            continue
        target = RENAMED.get(name, name)
        if out.get(target) is not None and value is not None:
            raise ValueError(f"{name} and {target} are the same setting; give one")
        if value is not None or target not in out:
            out[target] = value
    if kwargs.get("enable_priority_scheduling"):  # SGLang's switch for the priority policy
        if out.get("schedule_policy") not in (None, "fcfs", "priority"):
            raise ValueError("enable_priority_scheduling conflicts with "
                             f"schedule_policy={out['schedule_policy']!r}")
        out["schedule_policy"] = "priority"
    warn_ignored(ignored)
    return out
