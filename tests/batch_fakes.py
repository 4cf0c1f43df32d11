"""A ForwardBatch for attention-backend tests, built from a schedule step without a scheduler."""

from __future__ import annotations

from collections.abc import Callable

import torch

from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode


def extend_batch(pool, mode: ForwardMode, work: list[tuple[int, int]], lens: dict | list,
                 alloc: Callable[[int], list[int]], owners: list[int]) -> ForwardBatch:
    """``work``: (pool row, new tokens) in batch order. Takes slots from ``alloc(n)``,
    writes them into the rows of ``pool.req_to_token`` after each row's ``lens[row]`` tokens
    (advanced here), and returns the step's batch (``owners``: a request id per work item).
    The batch's ``prefix_lens_cpu`` / ``extend_start_loc`` place each item's tokens."""
    locs, positions, prefix, extend, starts, t = [], [], [], [], [], 0
    for row, n in work:
        p = lens[row]
        new = alloc(n)
        pool.req_to_token[row, p:p + n] = torch.tensor(new, dtype=torch.int32)
        locs += new
        positions += list(range(p, p + n))
        prefix.append(p)
        extend.append(n)
        starts.append(t)
        t += n
        lens[row] = p + n
    seq = [p + n for p, n in zip(prefix, extend)]

    def tensor(values):
        return torch.tensor(values, dtype=torch.int64)

    return ForwardBatch(
        mode=mode, input_ids=tensor([0] * t), positions=tensor(positions),
        out_cache_loc=tensor(locs), req_pool_indices=tensor([r for r, _ in work]),
        seq_lens=tensor(seq), prefix_lens=tensor(prefix), extend_lens=tensor(extend),
        extend_start_loc=tensor(starts), logits_indices=tensor([0]),
        seq_lens_cpu=seq, prefix_lens_cpu=prefix, extend_lens_cpu=extend, owner_ids=owners)
