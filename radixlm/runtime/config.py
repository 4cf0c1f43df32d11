"""Engine configuration: one frozen dataclass; derived values are properties."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2-135m-instruct"
    tokenizer_path: str | None = None  # default: the model's own tokenizer
    # Chat template override: a registered name (lang/chat_template.py) or a file (.jinja,
    # or .json with a "chat_template" key); default: the tokenizer's own.
    chat_template: str | None = None
    served_model_name: str | None = None  # model id the APIs report; default: `model`
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32
    device: str = "auto"  # auto | cpu | cuda
    attention_backend: str = "auto"  # auto | torch | triton
    # CPU decode weights. auto: the native library runs small steps on the GGUF's own
    # Q4_0/Q4_1/Q8_0 blocks (other sources as Q8 blocks); without it, torch's int4 kernel
    # for bf16 models from a Q4_1 GGUF. int4: 4-bit blocks for every source. none: the
    # reference path (dense weights, no native library).
    weight_quant: str = "auto"
    # Native CPU steps (radixlm/native): how matmuls read activations against the block
    # weights. fp32: exact, the reference path's numbers. int8: per-block rounding
    # (llama.cpp's way, ~0.5% error). bf16: activations and dequantized weights rounded to
    # bf16, fp32 sums (a torch bf16 linear's numbers). auto: fp32, and bf16 on AMX tiles for
    # steps of 16+ tokens when the model runs in bf16 (the default on bf16 hosts).
    native_activations: str = "auto"
    # torch attention backend: memory for the dense per-row K/V mirror that lets decode
    # read K/V in place (None: max(KV pool size, 2 GiB); 0: off, gather every step).
    kv_mirror_mb: int | None = None
    context_length: int | None = None  # default: the model's max_position_embeddings
    max_total_tokens: int | None = None  # KV pool capacity; default from mem_fraction
    mem_fraction: float = 0.15  # share of (free) memory for the KV pool when not given
    max_running_requests: int = 64
    max_queued_requests: int | None = None  # None: unbounded waiting queue
    chunked_prefill_size: int = 1024  # max new tokens in one prefill step
    schedule_policy: str = "lpm"  # lpm | fcfs | priority
    # priority policy: higher `priority` first (lower first with low_priority_values_first);
    # with priority_preemption a waiting request may retract a running one whose priority
    # is lower by more than priority_preemption_threshold.
    low_priority_values_first: bool = False
    priority_preemption: bool = False
    priority_preemption_threshold: int = 0
    disable_radix_cache: bool = False
    radix_eviction_policy: str = "lru"  # lru | lfu
    enable_jump_forward: bool = True
    grammar_compile_workers: int = 2
    grammar_backend: str = "llguidance"  # llguidance | outlines (constrained decoding)
    random_seed: int = 0
    log_level: str = "info"
    # Scale-out: tensor-parallel ranks of this engine (torch.distributed; the engine starts
    # the other ranks itself) and data-parallel replicas (a server-level option: one
    # Engine is one replica, so here it is always 1).
    tp_size: int = 1
    dp_size: int = 1

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be auto|bfloat16|float16|float32, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto|cpu|cuda, got {self.device!r}")
        if self.weight_quant not in ("auto", "int4", "none"):
            raise ValueError(f"weight_quant must be auto|int4|none, got {self.weight_quant!r}")
        if self.native_activations not in ("auto", "fp32", "int8", "bf16"):
            raise ValueError("native_activations must be auto|fp32|int8|bf16, got "
                             f"{self.native_activations!r}")
        if self.radix_eviction_policy not in ("lru", "lfu"):
            raise ValueError("radix_eviction_policy must be lru|lfu, got "
                             f"{self.radix_eviction_policy!r}")
        if self.grammar_backend not in ("llguidance", "outlines"):
            raise ValueError("grammar_backend must be llguidance|outlines, got "
                             f"{self.grammar_backend!r}")
        if self.schedule_policy not in ("lpm", "fcfs", "priority"):
            raise ValueError("schedule_policy must be lpm|fcfs|priority, got "
                             f"{self.schedule_policy!r}")
        if self.priority_preemption_threshold < 0:
            raise ValueError("priority_preemption_threshold must be >= 0")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.chunked_prefill_size < 1:
            raise ValueError("chunked_prefill_size must be >= 1")
        if self.max_total_tokens is not None and self.max_total_tokens < 2:
            raise ValueError("max_total_tokens must be >= 2")
        if self.context_length is not None and self.context_length < 2:
            raise ValueError("context_length must be >= 2")
        if not 0 < self.mem_fraction < 1:
            raise ValueError("mem_fraction must be in (0, 1)")
        if self.tp_size < 1 or self.dp_size < 1:
            raise ValueError("tp_size and dp_size must be >= 1")
        if self.dp_size > 1:
            raise ValueError("dp_size > 1 is served by `radixlm serve --dp-size N` (N engine "
                             "replicas behind sglang-router); one Engine is one replica")

    @classmethod
    def from_kwargs(cls, **kwargs) -> EngineConfig:
        """Build from keyword arguments; ``None`` means default, unknown keys are an error.
        SGLang's names are accepted too (see server_args.py)."""
        from radixlm.runtime.server_args import to_engine_kwargs

        kwargs = to_engine_kwargs(kwargs)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise ValueError(f"unknown engine option(s): {', '.join(unknown)}")
        return cls(**{k: v for k, v in kwargs.items() if v is not None})
