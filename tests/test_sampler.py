"""The batched sampler on synthetic logits: statistics, filters, penalties, seeds, masks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from radixlm.kernels.ref import apply_token_bitmask
from radixlm.runtime.sampler import Sampler, SamplingInputs

V = 40


def inputs(b: int, **over) -> SamplingInputs:
    base = dict(temperatures=[1.0] * b, top_ks=[-1] * b, top_ps=[1.0] * b, min_ps=[0.0] * b,
                frequency_penalties=[0.0] * b, presence_penalties=[0.0] * b,
                repetition_penalties=[1.0] * b, output_ids=[[] for _ in range(b)],
                seen_ids=None, banned_ids=[[] for _ in range(b)],
                generators=[torch.Generator().manual_seed(i) for i in range(b)],
                top_logprobs_nums=[-1] * b)
    base.update(over)
    return SamplingInputs(**base)


def logits_from_probs(probs: list[float]) -> torch.Tensor:
    return torch.tensor([math.log(p) for p in probs])


def draw(n: int, logits: torch.Tensor, **over) -> list[int]:
    sampler = Sampler(apply_token_bitmask)
    gen = torch.Generator().manual_seed(123)
    out = []
    for _ in range(n):
        inp = inputs(1, generators=[gen], **over)
        out.append(sampler(logits.clone()[None], inp).next_ids[0])
    return out


PROBS = [0.4, 0.3, 0.2, 0.06, 0.04]


def test_temperature_one_matches_distribution():
    counts = np.bincount(draw(4000, logits_from_probs(PROBS)), minlength=5) / 4000
    assert np.allclose(counts, PROBS, atol=0.03)


def test_low_temperature_concentrates_high_flattens():
    cold = np.bincount(draw(1000, logits_from_probs(PROBS), temperatures=[0.2]), minlength=5)
    hot = np.bincount(draw(2000, logits_from_probs(PROBS), temperatures=[5.0]), minlength=5)
    assert cold[0] / 1000 > 0.75
    assert hot[4] / 2000 > 0.12  # far above 0.04


def test_top_k_top_p_min_p_support():
    lg = logits_from_probs(PROBS)
    assert set(draw(600, lg, top_ks=[2])) == {0, 1}
    assert set(draw(600, lg, top_ps=[0.65])) == {0, 1}  # 0.4 < 0.65 <= 0.7
    assert set(draw(600, lg, top_ps=[0.75])) == {0, 1, 2}
    assert set(draw(600, lg, min_ps=[0.6])) == {0, 1}  # keep p >= 0.24
    top_k2 = np.bincount(draw(3000, lg, top_ks=[2]), minlength=2)[:2] / 3000
    assert np.allclose(top_k2, [0.4 / 0.7, 0.3 / 0.7], atol=0.04)


def test_top_p_on_a_wide_flat_distribution_uses_the_full_sort():
    flat = torch.zeros(1000)  # 1000 equal tokens: top_p 0.9 keeps 900 of them (> candidates)
    seen = set(draw(3000, flat, top_ps=[0.9]))
    assert max(seen) >= 600 and len(seen) > 600


def test_greedy_rows_and_sampled_rows_do_not_mix():
    sampler = Sampler(apply_token_bitmask)
    logits = torch.randn(4, V)
    gens = [None, torch.Generator().manual_seed(0), None, torch.Generator().manual_seed(1)]
    out = sampler(logits.clone(), inputs(4, generators=gens, temperatures=[0, 1, 0, 1]))
    assert out.next_ids[0] == int(logits[0].argmax())
    assert out.next_ids[2] == int(logits[2].argmax())


def test_seed_gives_same_tokens_whatever_the_batch():
    sampler = Sampler(apply_token_bitmask)
    row = torch.randn(V)
    alone = [sampler(row.clone()[None], inputs(1, generators=[g])).next_ids[0]
             for g in [torch.Generator().manual_seed(7)] for _ in range(1)]
    gen = torch.Generator().manual_seed(7)
    others = torch.randn(3, V)
    batch = torch.cat([others[:2], row[None], others[2:]])
    mixed = sampler(batch, inputs(4, generators=[torch.Generator().manual_seed(9),
                                                 torch.Generator().manual_seed(8), gen,
                                                 torch.Generator().manual_seed(5)]))
    assert mixed.next_ids[2] == alone[0]


def test_frequency_presence_and_repetition_penalties():
    sampler = Sampler(apply_token_bitmask)
    logits = torch.zeros(3, V)
    logits[:, 5] = 1.0
    inp = inputs(3, generators=[None] * 3, frequency_penalties=[0.6, 0.0, 0.0],
                 presence_penalties=[0.0, 1.5, 0.0], repetition_penalties=[1.0, 1.0, 3.0],
                 output_ids=[[5, 5], [5], []], seen_ids=[[5, 5], [5], [5]])
    out = sampler(logits.clone(), inp)
    assert out.next_ids[0] != 5  # 1.0 - 2 * 0.6 < 0
    assert out.next_ids[1] != 5  # 1.0 - 1.5 < 0
    assert out.next_ids[2] == 5  # 1.0 / 3 still > 0: repetition only scales


def test_banned_ids_and_bitmask_stay_in_their_rows():
    sampler = Sampler(apply_token_bitmask)
    logits = torch.zeros(2, V)
    logits[:, 3] = 5.0
    mask = np.zeros((2, (V + 31) // 32), dtype=np.int32)
    mask[0, 0] = 1 << 7  # row 0 may only emit token 7
    mask[1, :] = -1  # row 1 unconstrained
    inp = inputs(2, generators=[None, None], banned_ids=[[], [3]],
                 bitmask=torch.from_numpy(mask), top_logprobs_nums=[2, 2])
    out = sampler(logits.clone(), inp)
    assert out.next_ids[0] == 7
    assert out.logprobs[0] == pytest.approx(0.0)  # the masked distribution
    assert out.next_ids[1] != 3


def test_logprobs_are_normalized_and_top_sorted():
    sampler = Sampler(apply_token_bitmask)
    logits = torch.randn(2, V)
    out = sampler(logits.clone(), inputs(2, generators=[None, None], top_logprobs_nums=[5, 0]))
    ref = torch.log_softmax(logits, -1)
    assert out.logprobs[0] == pytest.approx(ref[0].max().item(), abs=1e-5)
    assert [t for _, t in out.top_logprobs[0]] == ref[0].topk(5).indices.tolist()
    assert out.top_logprobs[1] == []
    assert sum(math.exp(lp) for lp in ref[0].tolist()) == pytest.approx(1.0, abs=1e-4)


def test_inverse_cdf_draw_matches_weights_and_never_picks_zero_weight():
    """Each draw scans a whole 49k row, so samples are kept few and made to count: a
    stratified grid u = (i + 0.5) / n gives every token exactly n * weight draws, up to one
    at each of its interval's ends (so a frequency off by more than 2 / n is a wrong map,
    not chance: tighter than +-0.01 on 20000 random draws, which this test had before), and
    random u, which may land anywhere, must never pick a zero-weight token."""
    from radixlm.runtime.sampler import draw_inverse_cdf

    # 49152 + 3 entries: several blocks, a ragged last block, most weight zero
    weights = torch.zeros(2, 49155)
    weights[0, [7, 300, 49154]] = torch.tensor([1.0, 3.0, 6.0])
    weights[1, 1000:1010] = 1.0
    n_grid, n_rand = 1000, 2000
    grid = (torch.arange(n_grid, dtype=torch.float64) + 0.5) / n_grid
    u = torch.cat([grid, torch.rand(n_rand, generator=torch.Generator().manual_seed(0)).double()])
    picks0 = draw_inverse_cdf(weights[:1].expand(len(u), -1), u)
    picks1 = draw_inverse_cdf(weights[1:].expand(len(u), -1), u)
    freq = {int(t): c / n_grid
            for t, c in zip(*np.unique(picks0[:n_grid].numpy(), return_counts=True))}
    assert set(freq) == {7, 300, 49154}
    for token, p in ((7, 0.1), (300, 0.3), (49154, 0.6)):
        assert abs(freq[token] - p) <= 2 / n_grid, (token, freq)
    assert set(picks0.tolist()) == {7, 300, 49154}  # random u too: never a zero weight
    assert np.bincount(picks1[:n_grid].numpy() - 1000).tolist() == [n_grid // 10] * 10
    # random u: P(some token of the ten unseen in 2000 draws) < 10 * 0.9**2000 ~ 1e-90
    assert set(picks1[n_grid:].tolist()) == set(range(1000, 1010))
    edges = torch.tensor([0.0, 0.1, 0.39, 0.4, 0.99, 1.0], dtype=torch.float64)  # 1.0: rounding
    got = draw_inverse_cdf(weights[:1].expand(len(edges), -1), edges).tolist()
    assert got == [7, 300, 300, 49154, 49154, 49154]


def test_neighbouring_seeds_start_with_unrelated_draws():
    """One uniform per token: generators for seeds s, s+1, ... must not start alike (raw
    Mersenne Twister seeding gives 0.03, 0.16, 0.05 for seeds 1234..1236)."""
    from radixlm.runtime.model_runner import mix_seed

    firsts = [torch.rand(1, generator=torch.Generator().manual_seed(mix_seed(s))).item()
              for s in range(1234, 1234 + 200)]
    hist = np.histogram(firsts, bins=4, range=(0, 1))[0]
    assert hist.min() >= 30, hist  # ~50 per quarter
    assert mix_seed(-1) >= 0 and mix_seed(0) != mix_seed(1)


def test_a_row_with_no_allowed_token_raises_instead_of_drawing_garbage():
    logits = torch.full((1, V), float("-inf"))
    with pytest.raises(ValueError, match="not finite"):
        Sampler(apply_token_bitmask)(logits, inputs(1))
