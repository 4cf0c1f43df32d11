"""The tensors of one model step, built by the model runner from scheduler bookkeeping.

``ForwardBatch`` is the only thing the model and the attention backends see of requests.
Every tensor lives on the model's device; ``*_cpu`` fields are the same values as Python
lists for code that must not synchronize with the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from radixlm.runtime.step import ForwardMode as ForwardMode  # (re-exported: with the batch)


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64, new tokens back to back
    positions: torch.Tensor  # [T] int64
    out_cache_loc: torch.Tensor  # [T] int64, pool slot receiving each new token's K/V
    req_pool_indices: torch.Tensor  # [B] int64, rows of req_to_token
    seq_lens: torch.Tensor  # [B] int64, tokens with K/V after this step (prefix + new)
    prefix_lens: torch.Tensor  # [B] int64, tokens already cached before this step
    extend_lens: torch.Tensor  # [B] int64, new tokens this step (all 1 in DECODE)
    extend_start_loc: torch.Tensor  # [B] int64, first row of each request in the T rows
    logits_indices: torch.Tensor  # [L] int64, rows of T whose logits are computed
    seq_lens_cpu: list[int] = field(default_factory=list)
    prefix_lens_cpu: list[int] = field(default_factory=list)
    extend_lens_cpu: list[int] = field(default_factory=list)
    # Unique id of the request on each row (a row is reused by later requests).
    owner_ids: list[int] = field(default_factory=list)
    # Speculative verification: the tokens of the step without its draft tokens. The native
    # library picks its activation rounding by this count instead of num_tokens, so that
    # a verified token is computed as a decode step of the batch would compute it.
    act_rows: int | None = None
    # Rows of T whose last hidden state the model returns in ``hidden`` (encode requests'
    # positions); None: none.
    hidden_indices: torch.Tensor | None = None
    # Filled by the model: ``[len(hidden_indices), hidden]`` fp32, the residual stream after
    # the last layer (before the final norm) at those rows.
    hidden: torch.Tensor | None = None
    # Filled by the attention backend in init_forward_metadata; opaque to everyone else.
    attn_metadata: Any = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu) if self.seq_lens_cpu else 0
