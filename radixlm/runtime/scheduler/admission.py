"""Admission: which requests an EXTEND step computes, under the token budget.

An EXTEND step takes, in this order and while ``chunked_prefill_size`` tokens last: the
requests already extending (chunked prefills, jump-forward continuations), then waiting
requests in the policy's order, each given a row and its cached prefix. A waiting request
is admitted only if the K/V left after its tokens still covers ``NEW_TOKEN_RATIO`` of the
running requests' remaining output budget (alone it is always admitted), so that decode
rarely has to retract; a prefill that needs chunking goes first in no shared batch.
While requests are decoding, an EXTEND step also decodes them (a token each), and a prompt
that needs chunking comes ``mixed_prefill_size`` tokens a step: a long prompt arriving holds
the running streams for one short chunk at a time, not for its whole prefill, while prompts
that fit the step's budget still come whole.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from radixlm.runtime.kv_manager import KVManager
from radixlm.runtime.request import Req, ReqStatus
from radixlm.runtime.schedule_policy import order_waiting, shares_uncached_prefix
from radixlm.runtime.scheduler.postprocess import internal_error
from radixlm.runtime.scheduler.retraction import Retraction
from radixlm.runtime.scheduler.state import SchedulerState
from radixlm.runtime.step import ForwardMode, ScheduleBatch

logger = logging.getLogger(__package__)

# Admission keeps this share of the running requests' remaining output budget free, so
# that decode rarely has to retract.
NEW_TOKEN_RATIO = 0.3


class Admission:
    """Intake of new requests, grammar polling, and the choice of an EXTEND step.

    Owns: nothing of its own.
    May mutate: ``state.by_rid`` and ``state.stats`` (intake, admitted prompt and cached
    tokens, prefill tokens), ``state.grammar_pending`` -> ``state.waiting`` (grammar ready),
    ``state.waiting`` and ``state.extending`` (the picked leave them), the picked requests'
    K/V through ``kv``; through ``retraction`` it may retract outranked running requests,
    and through ``finish`` end requests whose grammar failed.
    Returns: ``schedule_extend`` an EXTEND ``ScheduleBatch`` whose slots are allocated (its
    requests are in no queue, except running ones decoded alongside) or None.
    Invariants: an admitted request is RUNNING, holds a row and has given back its place in
    the admission bound (``unqueue``); one that could not be admitted holds no row and
    stays in ``waiting`` where it was; a waiting request is admitted only while fewer than
    ``max_running_requests`` requests hold a row (or after preempting one for it).
    """

    def __init__(self, config, state: SchedulerState, kv: KVManager, retraction: Retraction,
                 finish: Callable[..., None], unqueue: Callable[[Req], None]) -> None:
        """``finish(req, reason, insert=True)`` ends a request; ``unqueue(req)`` gives back
        its place in the admission bound."""
        self.config = config
        self.state = state
        self.kv = kv
        self.retraction = retraction
        self._finish = finish
        self._unqueue = unqueue

    def add(self, req: Req) -> None:
        """A submitted request arrives: to ``grammar_pending`` or ``waiting``."""
        state = self.state
        state.by_rid[req.rid] = req
        state.stats["num_requests_total"] += 1
        if req.grammar_future is not None:
            req.status = ReqStatus.GRAMMAR_PENDING
            state.grammar_pending.append(req)
        else:
            req.status = ReqStatus.WAITING
            state.waiting.append(req)

    def poll_grammars(self) -> None:
        """Move the requests whose grammar is built to ``waiting``; end those whose build
        failed (a bad constraint, or a crash: ours)."""
        pending = self.state.grammar_pending
        for req in [r for r in pending if r.grammar_future.done()]:
            pending.remove(req)
            try:
                req.grammar = req.grammar_future.result()
            except ValueError as e:
                self._finish(req, {"type": "abort", "message": f"invalid constraint: {e}",
                                   "error": "invalid_constraint"}, insert=False)
                continue
            except Exception as e:  # the build crashed: our failure, not the request's
                logger.error("grammar build for %s crashed: %r", req.rid, e)
                self._finish(req, internal_error(f"grammar build failed: {e!r}"), insert=False)
                continue
            req.status = ReqStatus.WAITING
            self.state.waiting.append(req)

    def _reserve(self, reqs: list[Req]) -> int:
        return int(NEW_TOKEN_RATIO * sum(
            max(r.params.max_new_tokens - len(r.output_ids), 0) for r in reqs))

    def schedule_extend(self) -> ScheduleBatch | None:
        state, preempt = self.state, self.retraction
        budget = self.config.chunked_prefill_size
        # while requests decode (in this step too), a prompt longer than the step's budget
        # comes a short chunk a step
        cap = self.config.mixed_prefill_size if state.running else budget
        picked: list[Req] = []
        prefix_lens, extend_lens, sample = [], [], []

        def take(req: Req, n: int) -> None:  # after its n slots were allocated
            picked.append(req)
            prefix_lens.append(req.kv_len - n)
            extend_lens.append(n)
            sample.append(req.kv_len == req.fill_len and req.params.max_new_tokens > 0
                          and len(req.output_ids) < req.params.max_new_tokens)

        for req in list(state.extending):  # chunked prefills and jump-forwards first
            n = min(req.pending_len, budget, cap)
            if n <= 0 or not self.kv.extend(req, n):
                break
            state.extending.remove(req)
            take(req, n)
            budget -= n
        full = state.num_active + len(picked) >= self.config.max_running_requests
        waiting = [] if (full and not preempt.preemptive) or budget <= 0 else state.waiting
        for req, cached in order_waiting(waiting, self.config.schedule_policy, self.kv.cache):
            if budget <= 0:
                break
            if (state.num_active + len(picked) >= self.config.max_running_requests
                    and not preempt.preempt_for(req)):
                break
            if shares_uncached_prefix(req, picked, self.kv.cache, cached):
                continue
            n = self._try_admit(req, budget, cap, picked)
            while n == 0 and preempt.preempt_for(req):  # no room: retract outranked requests
                n = self._try_admit(req, budget, cap, picked)
            if n <= 0:
                break
            take(req, n)
            budget -= n
        if not picked:
            return None
        state.stats["prefill_tokens_total"] += sum(extend_lens)
        # the running requests decode in the same step instead of waiting for it (a
        # jump-forward's continuation too: their one-token rows attend as one batch, 8%
        # faster than separate steps at batch 32 on a key-heavy schema)
        for req in list(state.running):
            if not self.kv.extend(req, 1):
                break
            take(req, 1)
        return ScheduleBatch(ForwardMode.EXTEND, picked, prefix_lens, extend_lens, sample)

    def _try_admit(self, req: Req, budget: int, cap: int, picked: list[Req]) -> int:
        """Admit waiting ``req`` with up to ``budget`` new tokens, at most ``cap`` if it
        needs chunking: the number admitted, 0 when KV slots or a row are lacking, -1 when
        it must wait for a step of its own (a chunked prefill goes first in no shared
        batch)."""
        if not self.kv.admit(req, req.max_cacheable_prefix):
            return 0
        matched = req.kv_len
        n = min(req.pending_len, budget)
        if n < req.pending_len:
            if picked:
                self.kv.release(req, insert=False)
                return -1
            n = min(n, cap)
        state = self.state
        reserve = self._reserve(state.running + state.extending + picked)
        alone = not (state.running or state.extending or picked)
        if (not alone and self.kv.available - n < reserve) or not self.kv.extend(req, n):
            self.kv.release(req, insert=False)
            return 0
        if req.num_retractions == 0:
            req.cached_tokens = matched
            state.stats["cached_tokens_total"] += matched
            state.stats["prompt_tokens_total"] += len(req.input_ids)
            if self.kv.tiers is not None:
                req.cached_tokens_details = dict(self.kv.last_hits)
        state.waiting.remove(req)
        self._unqueue(req)
        req.status = ReqStatus.RUNNING
        return n
