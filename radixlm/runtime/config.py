"""Engine configuration: one frozen dataclass; derived values are properties."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from radixlm import envs
from radixlm.runtime.speculative.base import normalize_algorithm

# Block types `quantization` accepts (what the native library runs: radixlm.native.qweights).
QUANTIZATIONS = ("q8_0", "q4_0", "q4_1")


def parse_host_port(text: str, what: str) -> tuple[str, int]:
    """("host", port) from "host:port" ("[v6addr]:port" for IPv6); ValueError naming `what`
    otherwise."""
    host, sep, port = str(text).rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{what} must be HOST:PORT with a port in 1..65535, got {text!r}")
    return host, int(port)


def master_address() -> tuple[str, int] | None:
    """torch.distributed's MASTER_ADDR/MASTER_PORT as (host, port); None unless both set."""
    addr, port = envs.torch_master_addr()
    if not addr or not port:
        return None
    return parse_host_port(f"{addr}:{port}", "MASTER_ADDR:MASTER_PORT")


# --kv-cache-dtype choices (SGLang's names, and int8); which a device stores:
# runtime.kv_pool.supported_kv_cache_dtypes.
KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3", "fp8_e5m2")

# Bounds of the speculative-decoding settings (a native step holds at most 64 tokens).
MAX_DRAFT_TOKENS = 32
MAX_NGRAM_WINDOW = 64
# Storage backends of the hierarchical cache (SGLang also has mooncake, hf3fs, nixl, ...).
HICACHE_STORAGE_BACKENDS = ("file",)


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
    # Block quantization of a checkpoint's linears at load (SGLang's --quantization; the
    # names are llama.cpp's block types): q8_0 | q4_0 | q4_1 (the LM head q8_0), or None:
    # the checkpoint runs at its own precision (dense rows natively too). The native CPU
    # path runs the blocks; other paths run their dequantized values. A GGUF model runs its
    # own blocks: asking to quantize one that is already quantized is an error.
    quantization: str | None = None
    # Which CPU path runs and what it fills in. auto: the native library (small steps;
    # a GGUF's own blocks, other weights dense, or `quantization`'s blocks); without it,
    # torch's int4 kernel for bf16 models from a Q4_1 GGUF. int4: 4-bit blocks (Q4_1's
    # rule) for every weight the source has no blocks for (quantization="q4_1" on a
    # safetensors checkpoint). none: the reference path (dense torch, no native library).
    weight_quant: str = "auto"
    # Native CPU steps (radixlm/native): how matmuls read activations. fp32: exact, the
    # reference path's numbers. int8: per-block rounding (llama.cpp's way, ~0.5% error;
    # block weights only). bf16: activations and weights rounded to bf16, fp32 sums (a torch
    # bf16 linear's numbers). auto: int8 on every step of a block-quantized model where
    # the CPU has u8 x s8 SIMD (AVX2 maddubs or VNNI; AMX int8 tiles for big steps), so a
    # token's numbers do not depend on its batch, chunking or cache state; otherwise as
    # mixed. mixed: int8 for steps under 8 tokens, on a bf16 model bf16 for the larger
    # steps (AMX tiles or AVX512-BF16 dot products), fp32 otherwise: the fastest big steps,
    # not batch-invariant (native.plan.activation_modes). With dtype="float32" asked,
    # auto means fp32 on every step: the precision asked for is the precision run
    # (``activations``).
    native_activations: str = "auto"
    # SGLang's --enable-deterministic-inference: a token's numbers the same bits whatever
    # the step it runs in (its batch, the chunking of its prompt, a cache hit on any tier,
    # a retraction, speculation's verify steps). The native library runs every step with
    # one activation mode (native.plan.activation_modes); the CPU torch path (models or
    # settings the library does not take: weight_quant="none", tensor parallel, other
    # families) runs its linears in calls of one shape and a fixed-order attention
    # (runtime/models/invariant.py, runtime/attention/invariant.py). A setup that cannot
    # be made batch-invariant (CUDA, Triton attention, a native mode whose kernels round
    # by step size) is a startup error naming it.
    enable_deterministic_inference: bool = False
    # torch attention backend: memory for the dense per-row K/V mirror that lets decode
    # read K/V in place (None: max(KV pool size, 2 GiB); 0: off, gather every step).
    kv_mirror_mb: int | None = None
    # K/V storage in the pool (SGLang's --kv-cache-dtype). auto: the model's dtype. int8:
    # one int8 per value and a bf16 scale per (token, KV head) row (symmetric absmax):
    # about half the bytes of bf16, so the same memory holds ~1.9x the tokens; the native
    # library reads it in registers, the torch / Triton paths dequantize on read. Rounding
    # to int8 magnifies the ~1e-6 differences between step sizes, so speculative or
    # chunked steps may part from plain decoding on near-ties (logprobs within ~0.03).
    # fp8_e4m3 / fp8_e5m2: refused with the list this device supports (no fp8 path yet).
    kv_cache_dtype: str = "auto"
    context_length: int | None = None  # default: the model's max_position_embeddings
    max_total_tokens: int | None = None  # KV pool capacity; default from mem_fraction
    mem_fraction: float = 0.15  # share of (free) memory for the KV pool when not given
    max_running_requests: int = 64
    max_queued_requests: int | None = None  # None: unbounded waiting queue
    chunked_prefill_size: int = 1024  # max new tokens in one prefill step
    # while requests decode (they decode in every prefill step too), a prompt longer than
    # a step's budget comes this many tokens a step: a long prompt arriving holds each
    # running stream for one such chunk (~1 s at 1B on 2 cores), not for its whole prefill
    # (a 4,000-token prompt at 1B: 12 s); prompts that fit the budget still come whole
    mixed_prefill_size: int = 256
    schedule_policy: str = "lpm"  # lpm | fcfs | priority
    # priority policy: higher `priority` first (lower first with low_priority_values_first);
    # with priority_preemption a waiting request may retract a running one whose priority
    # is lower by more than priority_preemption_threshold.
    low_priority_values_first: bool = False
    priority_preemption: bool = False
    priority_preemption_threshold: int = 0
    disable_radix_cache: bool = False
    radix_eviction_policy: str = "lru"  # lru | lfu
    # Hierarchical cache (SGLang's HiCache names): evicted radix nodes move to a host tier
    # in the KV pool's storage format instead of being dropped, and come back on a match.
    # Host tier size: hicache_size GB when > 0, else hicache_ratio x the KV pool. With
    # hicache_storage_backend "file", whole 64-token blocks are also written through to
    # files under hicache_storage_dir (at most hicache_storage_size GB), found again by
    # their content (model + KV layout + tokens), also after a restart.
    enable_hierarchical_cache: bool = False
    hicache_ratio: float = 2.0
    hicache_size: float = 0
    hicache_storage_backend: str | None = None  # None | file
    hicache_storage_dir: str | None = None
    hicache_storage_size: float = 8.0
    enable_jump_forward: bool = True
    # Constrained requests that do not say otherwise (`complete_within_max_tokens`) close
    # their document within max_new_tokens (constraints.budget)
    complete_within_max_tokens: bool = False
    grammar_compile_workers: int = 2
    grammar_backend: str = "llguidance"  # llguidance | outlines (constrained decoding)
    # JSON whitespace where a request names no whitespace_pattern (SGLang's options; see
    # json_whitespace): a regex between tokens, or none at all
    constrained_json_whitespace_pattern: str | None = None
    constrained_json_disable_any_whitespace: bool = False
    # Tool-call format of the model (formats/tool_parsers; SGLang's --tool-call-parser
    # names); None: the one its chat template shows, else qwen25's <tool_call> blocks
    tool_call_parser: str | None = None
    # Speculative decoding (SGLang's names): NGRAM drafts continuations from n-gram
    # matches (runtime/speculative) and verifies them in one model step, exactly (greedy
    # and sampled outputs as without it); "none": off; unset: NGRAM where the native CPU
    # library runs the steps, off elsewhere (speculative.base.resolve_algorithm). Each
    # step sizes the drafts from measured step times and each request's acceptance so far,
    # so they are skipped where they do not pay (large batches, text that repeats nothing).
    speculative_algorithm: str | None = None
    speculative_num_draft_tokens: int = 8  # most draft tokens per request and step
    # shortest / longest suffix matched (tokens; 2..8 measured best on replays of the
    # speculative benchmark's tasks, benchmarks/bench_speculative.py)
    speculative_ngram_min_match_window_size: int = 2
    speculative_ngram_max_match_window_size: int = 8
    random_seed: int = 0
    log_level: str = "info"
    # Reasoning models (SGLang's names): the format of the thinking block
    # (radixlm.constraints.reasoning.REASONING_PARSERS; None: no reasoning parser). With
    # one, constraints apply from the end of the thinking block and requests may set a
    # thinking_budget; with strict thinking, the format's excluded tokens (end of turn,
    # tool-call tags) are forbidden inside the block and the answer may not be empty.
    reasoning_parser: str | None = None
    enable_strict_thinking: bool = False
    # Scale-out: tensor-parallel ranks of this engine (torch.distributed; the engine starts
    # the other ranks itself) and data-parallel replicas (a server-level option: one
    # Engine is one replica, so here it is always 1).
    tp_size: int = 1
    dp_size: int = 1
    # Multi-host tensor parallel: the tp_size ranks spread evenly over `nnodes` hosts.
    # Node 0 runs the engine (scheduler, HTTP) and ranks 0..tp_size/nnodes-1; node r > 0
    # runs only its ranks. `dist_init_addr` is "host:port" of the rendezvous on node 0
    # (SGLang's flag); None: torch.distributed's MASTER_ADDR/MASTER_PORT.
    nnodes: int = 1
    node_rank: int = 0
    dist_init_addr: str | None = None

    @property
    def json_whitespace(self) -> str | None:
        """The whitespace of JSON output where a request names none: ``""`` (none at all,
        ``{"a":1,"b":2}``) with ``constrained_json_disable_any_whitespace``, else
        ``constrained_json_whitespace_pattern`` (a regex between tokens), else None: the
        default style ``{"a": 1, "b": 2}``, which spends no model decision on whitespace
        (jump-forward skips every separator) and keeps the space a chat model's natural
        token after ``"key":`` starts with."""
        if self.constrained_json_disable_any_whitespace:
            return ""
        return self.constrained_json_whitespace_pattern

    @property
    def activations(self) -> str:
        """``native_activations`` as the native steps run it: ``auto`` is ``fp32`` where
        ``dtype="float32"`` was asked (fp32 activations on every step, as the reference
        path; a GGUF's default int8 small steps would not be the precision asked for), else
        as given."""
        if self.native_activations == "auto" and self.dtype == "float32":
            return "fp32"
        return self.native_activations

    def __post_init__(self) -> None:
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be auto|bfloat16|float16|float32, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto|cpu|cuda, got {self.device!r}")
        if self.weight_quant not in ("auto", "int4", "none"):
            raise ValueError(f"weight_quant must be auto|int4|none, got {self.weight_quant!r}")
        self._check_quantization()
        if self.native_activations not in ("auto", "mixed", "fp32", "int8", "bf16"):
            raise ValueError("native_activations must be auto|mixed|fp32|int8|bf16, got "
                             f"{self.native_activations!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {' | '.join(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")
        if self.radix_eviction_policy not in ("lru", "lfu"):
            raise ValueError("radix_eviction_policy must be lru|lfu, got "
                             f"{self.radix_eviction_policy!r}")
        if self.grammar_backend not in ("llguidance", "outlines"):
            raise ValueError("grammar_backend must be llguidance|outlines, got "
                             f"{self.grammar_backend!r}")
        if self.schedule_policy not in ("lpm", "fcfs", "priority"):
            raise ValueError("schedule_policy must be lpm|fcfs|priority, got "
                             f"{self.schedule_policy!r}")
        if self.constrained_json_whitespace_pattern is not None:
            if self.constrained_json_disable_any_whitespace:
                raise ValueError("constrained_json_whitespace_pattern and "
                                 "constrained_json_disable_any_whitespace exclude each other")
            from radixlm.constraints.schema import check_whitespace_pattern

            check_whitespace_pattern(self.constrained_json_whitespace_pattern)
        if self.tool_call_parser is not None:
            from radixlm.formats.tool_parsers import check_parser_name

            check_parser_name(self.tool_call_parser)
        self._check_reasoning()
        if self.priority_preemption_threshold < 0:
            raise ValueError("priority_preemption_threshold must be >= 0")
        if self.max_running_requests < 1:
            raise ValueError("max_running_requests must be >= 1")
        if self.chunked_prefill_size < 1:
            raise ValueError("chunked_prefill_size must be >= 1")
        if self.mixed_prefill_size < 1:
            raise ValueError("mixed_prefill_size must be >= 1")
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
        self._check_nodes()
        self._check_speculative()
        self._check_hicache()
        self._check_deterministic()

    def _check_deterministic(self) -> None:
        """The settings whose kernels the flag cannot make batch-invariant, refused with it:
        the GPU (Triton attention, cuBLAS) is unchecked; the native CPU path and the CPU
        torch path (fixed-shape linears, fixed-order attention) are."""
        if not self.enable_deterministic_inference:
            return
        why = ("attention_backend='triton' (its kernels split the keys by the step's shape; "
               "use 'torch' or auto)" if self.attention_backend == "triton" else
               "device='cuda' (only the CPU's kernels are batch-invariant here)"
               if self.device == "cuda" else None)
        if why is not None:
            raise ValueError(f"enable_deterministic_inference cannot honour {why}")

    def _check_hicache(self) -> None:
        if self.hicache_ratio <= 0 or self.hicache_size < 0:
            raise ValueError("hicache_ratio must be > 0 and hicache_size >= 0 (GB; 0: use "
                             f"the ratio), got {self.hicache_ratio} and {self.hicache_size}")
        backend = self.hicache_storage_backend
        if backend is not None and backend not in HICACHE_STORAGE_BACKENDS:
            raise ValueError(f"hicache_storage_backend {backend!r} is not supported here "
                             f"(supported: {', '.join(HICACHE_STORAGE_BACKENDS)})")
        if (backend is None) != (self.hicache_storage_dir is None):
            raise ValueError("hicache_storage_backend 'file' and hicache_storage_dir DIR go "
                             "together (--hicache-storage-backend file --hicache-storage-dir "
                             "DIR)")
        if backend is not None and not os.path.isdir(self.hicache_storage_dir):
            raise ValueError(f"hicache storage dir {self.hicache_storage_dir!r} does not exist "
                             "or is not a directory (create it first)")
        if self.hicache_storage_size <= 0:
            raise ValueError(f"hicache_storage_size must be > 0 GB, got "
                             f"{self.hicache_storage_size}")
        if not self.enable_hierarchical_cache:
            if backend is not None:
                raise ValueError("hicache_storage_backend needs enable_hierarchical_cache "
                                 "(--enable-hierarchical-cache)")
            return
        if self.disable_radix_cache:
            raise ValueError("enable_hierarchical_cache needs the radix cache "
                             "(drop disable_radix_cache)")
        if self.tp_size > 1:
            raise ValueError("enable_hierarchical_cache is not supported with tp_size > 1")

    def _check_speculative(self) -> None:
        object.__setattr__(self, "speculative_algorithm",
                           normalize_algorithm(self.speculative_algorithm))
        lo, hi = 1, MAX_DRAFT_TOKENS
        if not lo <= self.speculative_num_draft_tokens <= hi:
            raise ValueError(f"speculative_num_draft_tokens must be in {lo}..{hi}, got "
                             f"{self.speculative_num_draft_tokens}")
        small = self.speculative_ngram_min_match_window_size
        large = self.speculative_ngram_max_match_window_size
        if not 1 <= small <= large <= MAX_NGRAM_WINDOW:
            raise ValueError("need 1 <= speculative_ngram_min_match_window_size <= "
                             f"speculative_ngram_max_match_window_size <= {MAX_NGRAM_WINDOW}, "
                             f"got {small} and {large}")

    def _check_reasoning(self) -> None:
        if self.reasoning_parser is not None:
            from radixlm.constraints.reasoning import get_format

            get_format(self.reasoning_parser)  # an unknown name lists the choices
        elif self.enable_strict_thinking:
            raise ValueError("enable_strict_thinking needs a reasoning_parser "
                             "(--reasoning-parser)")

    def _check_nodes(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"nnodes must be >= 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank={self.node_rank} is out of range for "
                             f"nnodes={self.nnodes} (valid: 0..{self.nnodes - 1})")
        if self.tp_size % self.nnodes:
            raise ValueError(f"tp_size={self.tp_size} is not divisible by nnodes={self.nnodes}: "
                             "every node runs tp_size/nnodes tensor-parallel ranks")
        if self.dist_init_addr is not None:
            parse_host_port(self.dist_init_addr, "dist_init_addr")
        elif self.nnodes > 1 and master_address() is None:
            raise ValueError(f"nnodes={self.nnodes} needs the rendezvous address of node 0: "
                             "dist_init_addr HOST:PORT (--dist-init-addr), or MASTER_ADDR and "
                             "MASTER_PORT in the environment")

    def _check_quantization(self) -> None:
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)} (or "
                             f"unset: the checkpoint's own precision), got "
                             f"{self.quantization!r}")
        if self.weight_quant == "int4" and self.quantization not in (None, "q4_0", "q4_1"):
            raise ValueError(f"weight_quant='int4' (4-bit blocks) conflicts with "
                             f"quantization={self.quantization!r}; give one")

    @property
    def tp_per_node(self) -> int:
        """Tensor-parallel ranks each node runs."""
        return self.tp_size // self.nnodes

    @property
    def rendezvous(self) -> tuple[str, int] | None:
        """(host, port) where the tensor-parallel ranks meet: dist_init_addr, else
        MASTER_ADDR/MASTER_PORT, else None (one host: rank 0 picks a free local port)."""
        if self.dist_init_addr is not None:
            return parse_host_port(self.dist_init_addr, "dist_init_addr")
        return master_address()

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
