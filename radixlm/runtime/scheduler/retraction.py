"""Retraction and preemption: making room by sending running requests back to wait.

A DECODE step gives every running request one more KV slot, first in order (arrival, or
priority under the priority policy); when the slots run out even after evicting the
prefix cache, the last in that order are retracted. Under the priority policy with
preemption on, admission may also retract the running request a waiting one outranks
the most. A retracted request's K/V goes to the prefix cache, so resuming it recomputes
only what the cache lost meanwhile; nothing retracted is lost.
"""

from __future__ import annotations

import logging

from radixlm.runtime.kv_manager import KVManager
from radixlm.runtime.request import Req, ReqStatus
from radixlm.runtime.schedule_policy import order_by_priority, preemption_victim
from radixlm.runtime.scheduler.state import SchedulerState
from radixlm.runtime.step import ForwardMode, ScheduleBatch

logger = logging.getLogger(__package__)


class Retraction:
    """Decode slot allocation (retracting the newest), and priority preemption victims.

    Owns: nothing of its own.
    May mutate: ``state.running`` (removes the retracted), ``state.waiting`` (retracted
    requests go to its front), ``state.stats["num_retractions_total"]``, the requests'
    K/V through ``kv``.
    Returns: ``schedule_decode`` a DECODE ``ScheduleBatch`` (each request's slot for the new
    token already allocated; its requests stay in ``running``) or None; ``preempt_for``
    whether it retracted a request.
    Invariants: a retracted request holds no row, is WAITING with ``num_retractions`` one
    higher, and every slot it held is free or in the cache.
    """

    def __init__(self, config, state: SchedulerState, kv: KVManager) -> None:
        self.config = config
        self.state = state
        self.kv = kv

    def schedule_decode(self) -> ScheduleBatch | None:
        running = self.state.running
        if not running:
            return None
        if self.config.schedule_policy == "priority":
            order = order_by_priority(running)
        else:
            order = sorted(running, key=lambda r: r.created_at)
        end, i = len(order), 0
        while i < end:  # first in order get a slot; the last are retracted to make room
            if self.kv.extend(order[i], 1):
                i += 1
                continue
            end -= 1
            self.retract(order[end])
        batch = order[:end]
        if not batch:
            return None
        n = len(batch)
        return ScheduleBatch(ForwardMode.DECODE, batch, [r.kv_len - 1 for r in batch], [1] * n,
                             [True] * n)

    @property
    def preemptive(self) -> bool:
        """Whether a waiting request may retract running ones it outranks."""
        return self.config.schedule_policy == "priority" and self.config.priority_preemption

    def preempt_for(self, req: Req) -> bool:
        """Priority preemption: retract the running request ``req`` outranks the most (by
        more than the threshold); False when preemption is off or none is outranked."""
        if not self.preemptive:
            return False
        victim = preemption_victim(req, self.state.running,
                                   self.config.priority_preemption_threshold)
        if victim is None:
            return False
        self.retract(victim, reason=f"preempted by {req.rid} (priority {req.priority} > "
                                    f"{victim.priority})")
        return True

    def retract(self, req: Req, reason: str = "for lack of KV slots") -> None:
        """Give back a running request's K/V (to the cache) and queue it for recompute."""
        self.state.running.remove(req)
        if req.kv_len > req.fill_len - 1:  # its slot for this step was already taken
            self.kv.truncate(req, req.fill_len - 1)
        self.kv.release(req, insert=True)
        req.status = ReqStatus.WAITING
        req.num_retractions += 1
        self.state.stats["num_retractions_total"] += 1
        self.state.waiting.insert(0, req)
        logger.info("retracted %s (%d tokens) %s", req.rid, req.fill_len, reason)
