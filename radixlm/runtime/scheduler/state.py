"""The queues and counters the scheduler's parts share. Plain Python.

Every request the scheduler holds is in ``by_rid`` and in exactly one queue, by status:

- ``grammar_pending``: its grammar is still compiling (GRAMMAR_PENDING);
- ``waiting``: ready, holds no K/V row (WAITING; also retracted requests, at the front);
- ``extending``: holds a row and more than one token lacks K/V (a chunked prefill, a
  jump-forward continuation);
- ``running``: holds a row and exactly one token lacks K/V (decoding).

While a step runs, the requests it extends from ``waiting`` or ``extending`` are in no queue
and those it decodes stay in ``running``; postprocessing then places every unfinished
request of the step again. Only the scheduler thread reads or writes this state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.runtime.request import Req


def new_stats() -> dict[str, int]:
    """The scheduler's counters (monotonic totals, as ``Engine.get_stats`` reports them)."""
    return {"prompt_tokens_total": 0, "cached_tokens_total": 0,
            "generation_tokens_total": 0, "forced_tokens_total": 0,
            "num_requests_total": 0, "num_retractions_total": 0,
            "prefill_tokens_total": 0, "num_steps_total": 0}


@dataclass(eq=False)
class SchedulerState:
    """What the parts move requests between. Admission moves grammar_pending -> waiting ->
    (batch); retraction moves running -> waiting; postprocessing moves (batch) -> running |
    extending, and any queue -> gone when a request finishes."""

    grammar_pending: list[Req] = field(default_factory=list)
    waiting: list[Req] = field(default_factory=list)
    running: list[Req] = field(default_factory=list)  # decoding: exactly one token lacks K/V
    extending: list[Req] = field(default_factory=list)  # hold a row, more than one lacks K/V
    by_rid: dict[str, Req] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=new_stats)

    @property
    def num_active(self) -> int:
        """Requests holding a K/V row between steps (decoding or extending)."""
        return len(self.running) + len(self.extending)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.extending or self.grammar_pending)

    def all_reqs_holding_kv(self) -> list[Req]:
        return [r for r in self.by_rid.values() if r.row is not None]
