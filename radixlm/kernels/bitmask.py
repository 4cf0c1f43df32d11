"""Apply a grammar's packed token bitmask to logits in Triton. Twin: ``ref.apply_token_bitmask``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _bitmask_kernel(
    logits_ptr, mask_ptr, logits_stride, mask_stride, vocab, num_words, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = cols < vocab
    word_idx = cols // 32
    words = tl.load(mask_ptr + row * mask_stride + word_idx, mask=word_idx < num_words, other=0)
    allowed = ((words >> (cols % 32)) & 1) != 0
    ptrs = logits_ptr + row * logits_stride + cols
    tl.store(ptrs, tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty),
             mask=in_vocab & ~allowed)


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set disallowed entries of ``logits [B, V]`` to -inf in place and return it.
    ``bitmask [B, ceil(V/32)]`` int32: bit ``j % 32`` of word ``j // 32`` allows token ``j``;
    tokens past ``32 * words`` are disallowed."""
    assert logits.stride(-1) == 1, "logits must have a dense last dim"
    bitmask = bitmask.to(device=logits.device, dtype=torch.int32)
    bitmask = bitmask if bitmask.stride(-1) == 1 else bitmask.contiguous()
    batch, vocab = logits.shape
    if batch == 0 or vocab == 0:
        return logits
    block = 1024
    _bitmask_kernel[(batch, triton.cdiv(vocab, block))](
        logits, bitmask, logits.stride(0), bitmask.stride(0), vocab, bitmask.shape[1],
        BLOCK=block,
    )
    return logits
