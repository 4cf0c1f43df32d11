"""Which slice of each weight a tensor-parallel rank holds (Megatron-style).

Column-parallel (output rows split): q/k/v and gate/up. Row-parallel (input columns
split, one all-reduce after): o_proj and down_proj. Vocab-parallel: the embedding and the
LM head, split by vocabulary rows (padded with zero rows to a multiple of the group size).

Attention is split by whole GQA groups (a K/V head with the query heads that read it).
When tp <= num_kv_heads, rank r holds the contiguous groups ``[kv*r//tp, kv*(r+1)//tp)``:
an even split when tp divides the K/V heads, else shares that differ by one group (the
default SmolLM2-135M has 9 query / 3 K/V heads, so tp=2 holds 2 + 1 groups; SGLang would
refuse it). When tp > num_kv_heads each K/V head is replicated on ``tp / num_kv_heads``
ranks that split its query heads evenly, as SGLang does. The MLP's intermediate dimension
is split the same balanced way. Norms are replicated.
"""

from __future__ import annotations

import copy
import os

import torch

from radixlm.runtime.models.shape import ModelConfig

FUSED_CHECKPOINTS = ("phi3",)  # model types whose projections come fused


def _span(n: int, rank: int, tp_size: int) -> range:
    """Rank `rank`'s share of `n` items split `tp_size` ways (sizes differ by at most 1)."""
    return range(n * rank // tp_size, n * (rank + 1) // tp_size)


def check_tp_size(hf_config, tp_size: int, device_type: str | None = "cpu",
                  nnodes: int = 1) -> None:
    """Raise ValueError (naming the numbers that do not fit) unless the model can be split
    `tp_size` ways and this host can run its tp_size/nnodes ranks on `device_type` (None:
    check the shapes only). Call it before starting any process."""
    cfg = ModelConfig.from_hf(hf_config)
    if tp_size < 1:
        raise ValueError(f"tp_size must be >= 1, got {tp_size}")
    if tp_size > 1 and cfg.model_type in FUSED_CHECKPOINTS:
        raise ValueError(f"tensor parallel does not support {cfg.model_type} (its checkpoint "
                         "fuses qkv_proj and gate_up_proj); use tp_size=1")
    heads, kv = cfg.num_heads, cfg.num_kv_heads
    if tp_size > kv:
        if tp_size % kv or (heads // kv) % (tp_size // kv):
            raise ValueError(
                f"tp_size={tp_size} cannot split num_attention_heads={heads} / "
                f"num_key_value_heads={kv}: above the K/V head count, tp_size must be a "
                f"multiple of it that divides the {heads // kv} query heads of each group "
                f"(valid: 1..{kv}" + "".join(
                    f", {kv * m}" for m in range(2, heads // kv + 1) if (heads // kv) % m == 0)
                + ")")
    if tp_size > cfg.intermediate_size:
        raise ValueError(f"tp_size={tp_size} exceeds intermediate_size={cfg.intermediate_size}")
    local = tp_size // nnodes  # ranks this host runs
    per_host = f" ({local} per node over {nnodes} nodes)" if nnodes > 1 else ""
    if device_type == "cuda":
        have = torch.cuda.device_count()
        if local > have:
            raise ValueError(f"tp_size={tp_size}{per_host} needs {local} CUDA devices on this "
                             f"host; {have} visible")
    elif device_type == "cpu" and local > (os.cpu_count() or 1):
        raise ValueError(f"tp_size={tp_size}{per_host} exceeds this host's {os.cpu_count()} "
                         "CPU cores")


def kv_heads_of_rank(num_kv_heads: int, rank: int, tp_size: int) -> range:
    """The K/V heads rank `rank` holds (one replicated head when tp > num_kv_heads)."""
    if tp_size <= num_kv_heads:
        return _span(num_kv_heads, rank, tp_size)
    head = rank // (tp_size // num_kv_heads)
    return range(head, head + 1)


def q_heads_of_rank(num_heads: int, num_kv_heads: int, rank: int, tp_size: int) -> range:
    """The query heads rank `rank` holds: those of its whole GQA groups, or its even share
    of one group's query heads when that group's K/V head is replicated."""
    group = num_heads // num_kv_heads
    if tp_size <= num_kv_heads:
        kv = kv_heads_of_rank(num_kv_heads, rank, tp_size)
        return range(kv.start * group, kv.stop * group)
    per = num_heads // tp_size
    return range(rank * per, (rank + 1) * per)


def local_hf_config(hf_config, rank: int, tp_size: int):
    """A copy of the HF config describing rank `rank`'s share: its attention heads, its
    K/V heads and its slice of the MLP (the model code then builds the rank's layers as if
    they were a whole model)."""
    cfg = ModelConfig.from_hf(hf_config)
    local = copy.deepcopy(hf_config)
    local.num_attention_heads = len(q_heads_of_rank(cfg.num_heads, cfg.num_kv_heads, rank,
                                                    tp_size))
    local.num_key_value_heads = len(kv_heads_of_rank(cfg.num_kv_heads, rank, tp_size))
    local.intermediate_size = len(_span(cfg.intermediate_size, rank, tp_size))
    local.head_dim = cfg.head_dim
    return local


def vocab_shard(weight: torch.Tensor, rank: int, tp_size: int) -> torch.Tensor:
    """Rows `[rank * n, (rank + 1) * n)` of `weight` padded with zero rows to `n * tp`."""
    vocab = weight.shape[0]
    per = -(-vocab // tp_size)
    part = weight[rank * per:(rank + 1) * per]
    if part.shape[0] < per:
        part = torch.cat([part, part.new_zeros(per - part.shape[0], *part.shape[1:])])
    return part.contiguous()


def _rows(w: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return w[start:stop].contiguous()


def shard_state_dict(state: dict[str, torch.Tensor], hf_config, rank: int,
                     tp_size: int) -> dict[str, torch.Tensor]:
    """Rank `rank`'s slice of every weight in a Llama-family HF state dict."""
    cfg = ModelConfig.from_hf(hf_config)
    d = cfg.head_dim
    q = q_heads_of_rank(cfg.num_heads, cfg.num_kv_heads, rank, tp_size)
    q0, q1 = q.start * d, q.stop * d
    kv = kv_heads_of_rank(cfg.num_kv_heads, rank, tp_size)
    k0, k1 = kv.start * d, kv.stop * d
    inter = _span(cfg.intermediate_size, rank, tp_size)
    i0, i1 = inter.start, inter.stop
    out = {}
    for name, w in state.items():
        leaf = name.split(".layers.", 1)[-1].split(".", 1)[-1] if ".layers." in name else name
        if leaf.startswith("self_attn.q_proj."):
            out[name] = _rows(w, q0, q1)
        elif leaf.startswith(("self_attn.k_proj.", "self_attn.v_proj.")):
            out[name] = _rows(w, k0, k1)
        elif leaf == "self_attn.o_proj.weight":
            out[name] = w[:, q0:q1].contiguous()
        elif leaf.startswith(("mlp.gate_proj.", "mlp.up_proj.")):
            out[name] = _rows(w, i0, i1)
        elif leaf == "mlp.down_proj.weight":
            out[name] = w[:, i0:i1].contiguous()
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            out[name] = vocab_shard(w, rank, tp_size)
        elif "norm" in leaf:
            out[name] = w  # norms: replicated
        else:  # e.g. Phi-3's fused qkv_proj / gate_up_proj, a row-parallel bias
            raise ValueError(f"tensor parallel cannot shard {name!r} "
                             f"({cfg.model_type}); use tp_size=1")
    return out
