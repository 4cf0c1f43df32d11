"""When drafts pay: running step times by tokens per step, and the draft budget of a step.

A model step on a CPU is mostly bound by reading the weights, so a step of a few more
tokens costs little more than a one-token step; at a large batch the step is bound by
arithmetic and every extra token costs its share. The scheduler records the time of every
step under its number of tokens (plain steps and steps that verify drafts apart, since
they may run other kernels), and before each step asks ``plan_budgets`` how many draft
tokens each request may get: the split that maximizes the expected tokens per second of
the step, where a request's ``k``-th draft token is accepted with probability
``rate ** k`` (``rate``: its acceptance rate so far), or none where no split beats the
plain step by ``MIN_GAIN``. Plain Python.
"""

from __future__ import annotations

import bisect
import heapq

# Smoothing of the running step times (weight of the newest step).
EMA_WEIGHT = 0.2
# Until a step with drafts was measured: an extra token of a step costs this share of the
# smallest plain step's time per token (a one-token step: measured 0.1-0.25 on a 2-core
# Xeon for 2-8 tokens).
PRIOR_TOKEN_SHARE = 0.25
# A split with drafts must promise this much more throughput than the plain step.
MIN_GAIN = 1.05
# At most this many (request, draft position) candidates are weighed per step.
MAX_CANDIDATES = 512


class _Table:
    """Running mean seconds by step size, with the sizes kept sorted for look-ups."""

    def __init__(self) -> None:
        self.seconds: dict[int, float] = {}
        self.sizes: list[int] = []

    def record(self, tokens: int, seconds: float) -> None:
        old = self.seconds.get(tokens)
        if old is None:
            bisect.insort(self.sizes, tokens)
            self.seconds[tokens] = seconds
        else:
            self.seconds[tokens] = old + EMA_WEIGHT * (seconds - old)

    def at(self, x: int, slope: float) -> float | None:
        """Measured, interpolated, or extrapolated seconds of a step of ``x`` tokens: past
        the largest size with the slope of the last two (never under half of ``slope``:
        noise may make it flat), or ``slope`` where only one size was measured."""
        sec, sizes = self.seconds, self.sizes
        if x in sec:
            return sec[x]
        if not sizes:
            return None
        j = bisect.bisect_left(sizes, x)
        if 0 < j < len(sizes):
            lo, hi = sizes[j - 1], sizes[j]
            return sec[lo] + (sec[hi] - sec[lo]) * (x - lo) / (hi - lo)
        if j == len(sizes):
            lo = sizes[-1]
            if len(sizes) > 1:
                prev = sizes[-2]
                slope = max(slope / 2, (sec[lo] - sec[prev]) / (lo - prev))
            return sec[lo] + slope * (x - lo)
        hi = sizes[0]
        return max(sec[hi] - slope * (hi - x), sec[hi] * x / hi)


class StepCosts:
    """Seconds per step by tokens per step, for plain steps and for steps with drafts.

    ``record`` after every step; ``estimate(tokens, drafted)``: the running mean where a
    step of that size and kind was measured, else a linear interpolation between the
    nearest measured sizes of that kind (extrapolated past the largest), else the same
    from the other kind. None until a step was measured."""

    def __init__(self) -> None:
        self.plain = _Table()
        self.drafted = _Table()

    def record(self, tokens: int, drafted: bool, seconds: float) -> None:
        (self.drafted if drafted else self.plain).record(tokens, seconds)

    def estimate(self, tokens: int, drafted: bool) -> float | None:
        first, second = ((self.drafted, self.plain) if drafted else (self.plain, self.drafted))
        base = self.plain if self.plain.sizes else self.drafted
        if not base.sizes:
            return None
        smallest = base.sizes[0]
        slope = PRIOR_TOKEN_SHARE * base.seconds[smallest] / smallest
        value = first.at(tokens, slope)
        return value if value is not None else second.at(tokens, slope)


def plan_budgets(costs: StepCosts, base_tokens: int, base_emitted: int,
                 rates: list[float], limits: list[int], max_extra: int) -> list[int]:
    """Draft tokens per candidate request for a step of ``base_tokens`` tokens that emits
    ``base_emitted`` tokens without drafts. ``rates[i]``: candidate ``i``'s expected
    acceptance rate per draft token (0..1); ``limits[i]``: the most draft tokens it may
    get; ``max_extra``: the most for the whole step. All zeros unless the best split
    promises ``MIN_GAIN`` times the plain step's tokens per second."""
    budgets = [0] * len(rates)
    base_cost = costs.estimate(base_tokens, drafted=False)
    if base_cost is None or base_emitted <= 0:
        return budgets
    # (request, k-th draft token) by decreasing gain: accepted with probability rate^k
    heap = [(-r, i, 1) for i, r in enumerate(rates) if limits[i] > 0 and r > 0]
    heapq.heapify(heap)
    emitted, tokens = float(base_emitted), base_tokens
    best, best_len, taken = base_emitted / base_cost, 0, []
    while heap and len(taken) < min(max_extra, MAX_CANDIDATES):
        neg_gain, i, k = heapq.heappop(heap)
        emitted, tokens = emitted - neg_gain, tokens + 1
        taken.append(i)
        cost = costs.estimate(tokens, drafted=True)
        if emitted / cost > best:
            best, best_len = emitted / cost, len(taken)
        # a token pays where its gain exceeds emitted * (marginal cost) / cost; the gains
        # only fall from here, so once one is far under that at the average marginal cost
        # so far, no longer split can win
        marginal = (cost - base_cost) / (tokens - base_tokens)
        if -neg_gain * cost < 0.2 * emitted * marginal:
            break
        if k < limits[i]:
            heapq.heappush(heap, (neg_gain * rates[i], i, k + 1))
    if best < MIN_GAIN * base_emitted / base_cost:
        return budgets
    for i in taken[:best_len]:
        budgets[i] += 1
    return budgets
