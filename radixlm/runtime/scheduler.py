"""Continuous batching on one thread.

Each step is either an EXTEND batch (new requests, prefill chunks, resumed or
jump-forwarded requests: anything with more than one token lacking K/V) under the token
budget ``chunked_prefill_size``, or, when there is none, a DECODE step for every running
request. When decode runs out of KV slots (after evicting the cache), the newest requests
are retracted: their K/V goes to the cache or is freed and they wait to be recomputed.
Nothing admitted is lost: it finishes, is retracted and resumed, or is aborted on purpose.

Admission bound: `num_queued` counts requests admitted but not yet started (in the inbox,
waiting for a grammar, or in the waiting queue) plus places reserved for requests about to
be submitted; the engine checks and raises it under `admission_lock`, so concurrent
submitters can never exceed `max_queued_requests` together.

Failures: a request whose step or grammar build raises ends with a 500-style abort; if the
thread itself dies, every request it held (and any still in its inbox) ends the same way and
`dead` says why, so no caller waits forever.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable

import numpy as np

from radixlm.runtime.forward_batch import ForwardMode
from radixlm.runtime.kv_manager import KVManager
from radixlm.runtime.model_runner import ModelRunner, ScheduleBatch, StepOutput
from radixlm.runtime.outputs import make_output
from radixlm.runtime.request import Req, ReqStatus
from radixlm.runtime.schedule_policy import (
    order_by_priority,
    order_waiting,
    preemption_victim,
    shares_uncached_prefix,
)

logger = logging.getLogger(__name__)

# Admission keeps this share of the running requests' remaining output budget free, so
# that decode rarely has to retract.
NEW_TOKEN_RATIO = 0.3
# A decoding request hands its K/V to the prefix cache every this many output tokens, so
# that concurrent requests can share what it generated.
DECODE_INSERT_INTERVAL = 64
# A step that extends only short continuations (jump-forward, at most this many tokens in
# all) also decodes the running requests (their one-token rows attend as one batch; 8%
# faster than separate steps at batch 32 on a key-heavy schema).
MIXED_MAX_TOKENS = 256


def _internal_error(message: str) -> dict:
    """The finish reason of a request that failed because of us (the server answers 500)."""
    return {"type": "abort", "message": message, "error": "internal_error", "status_code": 500}


class Scheduler:
    def __init__(self, config, runner: ModelRunner, tokenizer, grammar_backend=None) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.runner = runner
        self.grammar_backend = grammar_backend
        self.kv = KVManager(runner.pool.capacity, config.max_running_requests + 1,
                            config.disable_radix_cache, config.radix_eviction_policy)
        self.inbox: queue.Queue = queue.Queue()
        self.grammar_pending: list[Req] = []
        self.waiting: list[Req] = []
        self.running: list[Req] = []  # decoding: exactly one token lacks K/V
        self.extending: list[Req] = []  # hold a row, more than one token lacks K/V
        self.by_rid: dict[str, Req] = {}
        self.bitmask_words = (runner.vocab_size + 31) // 32
        self.stats = {"prompt_tokens_total": 0, "cached_tokens_total": 0,
                      "generation_tokens_total": 0, "forced_tokens_total": 0,
                      "num_requests_total": 0, "num_retractions_total": 0,
                      "prefill_tokens_total": 0, "num_steps_total": 0}
        self.admission_lock = threading.Lock()
        self.num_queued = 0  # admitted and not yet started, or reserved (under the lock)
        self.dead: BaseException | None = None  # set (under the lock) if the thread died
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="radixlm-scheduler", daemon=True)

    # ------------------------------------------------------------------ thread API
    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(("wake", None))
        self.thread.join(timeout=30)

    def submit(self, req: Req) -> None:
        self.inbox.put(("add", req))

    def abort(self, rid: str) -> None:
        self.inbox.put(("abort", rid))

    def call(self, fn: Callable[[], object], timeout: float = 60.0):
        """Run ``fn`` on the scheduler thread between steps and return its result."""
        done: queue.Queue = queue.Queue(maxsize=1)
        self.inbox.put(("call", (fn, done)))
        ok, value = done.get(timeout=timeout)
        if not ok:
            raise value
        return value

    @property
    def num_active(self) -> int:
        return len(self.running) + len(self.extending)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.extending or self.grammar_pending)

    def all_reqs_holding_kv(self) -> list[Req]:
        return [r for r in self.by_rid.values() if r.row is not None]

    def is_alive(self) -> bool:
        return self.dead is None and self.thread.is_alive()

    def _unqueue(self, req: Req) -> None:
        """`req` started or finished: give back its place in the admission bound."""
        if req.queued:
            req.queued = False
            with self.admission_lock:
                self.num_queued -= 1

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        reason = {"type": "abort", "message": "engine shut down"}
        try:
            while not self._stop.is_set():
                try:
                    self._drain_inbox(block=not self.has_work())
                    self._poll_grammars()
                    self.step()
                except Exception:  # the loop must survive anything
                    logger.error("scheduler loop error:\n%s", traceback.format_exc())
        except BaseException as exc:  # the thread dies: say so, fail everything it held
            logger.critical("scheduler thread died:\n%s", traceback.format_exc())
            with self.admission_lock:
                self.dead = exc
            reason = {"type": "abort", "message": f"engine died: {type(exc).__name__}: {exc}",
                      "error": "engine_dead", "status_code": 500}
        finally:
            self._fail_all(reason)

    def _fail_all(self, reason: dict) -> None:
        """End every request held or still in the inbox with `reason` (shutdown, death)."""
        for req in list(self.by_rid.values()):
            self._finish(req, dict(reason), insert=False)
        while True:
            try:
                kind, payload = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self._finish(payload, dict(reason), insert=False)
            elif kind == "call":
                payload[1].put((False, RuntimeError(reason["message"])))

    def _drain_inbox(self, block: bool) -> None:
        try:
            msg = self.inbox.get(timeout=0.05) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = msg
            if kind == "add":
                self._add(payload)
            elif kind == "abort":
                self._abort(payload)
            elif kind == "call":
                fn, done = payload
                try:
                    done.put((True, fn()))
                except Exception as e:  # report to the caller
                    done.put((False, e))
            try:
                msg = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _add(self, req: Req) -> None:
        self.by_rid[req.rid] = req
        self.stats["num_requests_total"] += 1
        if req.grammar_future is not None:
            req.status = ReqStatus.GRAMMAR_PENDING
            self.grammar_pending.append(req)
        else:
            req.status = ReqStatus.WAITING
            self.waiting.append(req)

    def _poll_grammars(self) -> None:
        for req in [r for r in self.grammar_pending if r.grammar_future.done()]:
            self.grammar_pending.remove(req)
            try:
                req.grammar = req.grammar_future.result()
            except ValueError as e:
                self._finish(req, {"type": "abort", "message": f"invalid constraint: {e}",
                                   "error": "invalid_constraint"}, insert=False)
                continue
            except Exception as e:  # the build crashed: our failure, not the request's
                logger.error("grammar build for %s crashed: %r", req.rid, e)
                self._finish(req, _internal_error(f"grammar build failed: {e!r}"), insert=False)
                continue
            req.status = ReqStatus.WAITING
            self.waiting.append(req)

    def _abort(self, rid: str) -> None:
        req = self.by_rid.get(rid)
        if req is not None and not req.finished:
            self._finish(req, {"type": "abort", "message": "aborted by request"})

    # ------------------------------------------------------------------ one step
    def step(self) -> None:
        sb = self._schedule_extend() or self._schedule_decode()
        if sb is None:
            return
        try:
            out = self._forward(sb)
        except Exception as e:
            logger.error("step failed:\n%s", traceback.format_exc())
            self._isolate_failure(sb, e)
            return
        self.stats["num_steps_total"] += 1
        self._process(sb, out)

    def _forward(self, sb: ScheduleBatch) -> StepOutput:
        sampled = [r for r, s in zip(sb.reqs, sb.sample) if s]
        bitmask = self._fill_bitmask(sampled)
        inputs = (self.runner.sampling_inputs(sampled, [self.runner.generator(r)
                                                        for r in sampled], bitmask)
                  if sampled else None)
        return self.runner.forward(sb, inputs)

    def _isolate_failure(self, sb: ScheduleBatch, error: Exception) -> None:
        """A step raised: run its requests one by one (their slots are still allocated, so
        each recomputes the same positions) and abort only those that fail alone."""
        for i, req in enumerate(sb.reqs):
            if req.finished:
                continue
            one = ScheduleBatch(sb.mode, [req], [sb.prefix_lens[i]], [sb.extend_lens[i]],
                                [sb.sample[i]])
            failure = error if len(sb.reqs) == 1 else None
            if failure is None:
                try:
                    out = self._forward(one)
                except Exception as e:
                    logger.error("request %s fails alone:\n%s", req.rid, traceback.format_exc())
                    failure = e
            if failure is not None:
                self._finish(req, _internal_error(f"internal error: {failure!r}"), insert=False)
                continue
            self.stats["num_steps_total"] += 1
            self._process(one, out)

    def _fill_bitmask(self, sampled: list[Req]):
        rows = [i for i, r in enumerate(sampled) if r.grammar is not None]
        if not rows:
            return None
        mask = np.full((len(sampled), self.bitmask_words), -1, dtype=np.int32)
        pairs = [(sampled[i].grammar, i) for i in rows]
        if self.grammar_backend is not None:  # may fill the batch in parallel
            self.grammar_backend.fill_bitmasks(pairs, mask)
        else:
            for grammar, i in pairs:
                grammar.fill_bitmask(mask, i)
        return mask

    # ------------------------------------------------------------------ scheduling
    def _reserve(self, reqs: list[Req]) -> int:
        return int(NEW_TOKEN_RATIO * sum(
            max(r.params.max_new_tokens - len(r.output_ids), 0) for r in reqs))

    def _schedule_extend(self) -> ScheduleBatch | None:
        budget = self.config.chunked_prefill_size
        picked: list[Req] = []
        prefix_lens, extend_lens, sample = [], [], []

        def take(req: Req, n: int) -> None:  # after its n slots were allocated
            picked.append(req)
            prefix_lens.append(req.kv_len - n)
            extend_lens.append(n)
            sample.append(req.kv_len == req.fill_len and req.params.max_new_tokens > 0
                          and len(req.output_ids) < req.params.max_new_tokens)

        for req in list(self.extending):  # chunked prefills and jump-forwards first
            n = min(req.pending_len, budget)
            if n <= 0 or not self.kv.extend(req, n):
                break
            self.extending.remove(req)
            take(req, n)
            budget -= n
        full = self.num_active + len(picked) >= self.config.max_running_requests
        waiting = [] if (full and not self._preemptive) or budget <= 0 else self.waiting
        for req, cached in order_waiting(waiting, self.config.schedule_policy, self.kv.cache):
            if budget <= 0:
                break
            if (self.num_active + len(picked) >= self.config.max_running_requests
                    and not self._preempt_for(req)):
                break
            if shares_uncached_prefix(req, picked, self.kv.cache, cached):
                continue
            n = self._try_admit(req, budget, picked)
            while n == 0 and self._preempt_for(req):  # no room: retract outranked requests
                n = self._try_admit(req, budget, picked)
            if n <= 0:
                break
            take(req, n)
            budget -= n
        if not picked:
            return None
        self.stats["prefill_tokens_total"] += sum(extend_lens)
        if all(r.output_ids for r in picked) and sum(extend_lens) <= MIXED_MAX_TOKENS:
            # Only short continuations (jump-forward): decode the running requests in the
            # same step instead of stalling them for it.
            for req in list(self.running):
                if not self.kv.extend(req, 1):
                    break
                take(req, 1)
        return ScheduleBatch(ForwardMode.EXTEND, picked, prefix_lens, extend_lens, sample)

    def _try_admit(self, req: Req, budget: int, picked: list[Req]) -> int:
        """Admit waiting ``req`` with up to ``budget`` new tokens: the number admitted, 0
        when KV slots or a row are lacking, -1 when it must wait for a step of its own
        (a chunked prefill goes first in no shared batch)."""
        if not self.kv.admit(req, req.max_cacheable_prefix):
            return 0
        matched = req.kv_len
        n = min(req.pending_len, budget)
        if n < req.pending_len and picked:
            self.kv.release(req, insert=False)
            return -1
        reserve = self._reserve(self.running + self.extending + picked)
        alone = not (self.running or self.extending or picked)
        if (not alone and self.kv.available - n < reserve) or not self.kv.extend(req, n):
            self.kv.release(req, insert=False)
            return 0
        if req.num_retractions == 0:
            req.cached_tokens = matched
            self.stats["cached_tokens_total"] += matched
            self.stats["prompt_tokens_total"] += len(req.input_ids)
        self.waiting.remove(req)
        self._unqueue(req)
        req.status = ReqStatus.RUNNING
        return n

    @property
    def _preemptive(self) -> bool:
        return self.config.schedule_policy == "priority" and self.config.priority_preemption

    def _preempt_for(self, req: Req) -> bool:
        """Priority preemption: retract the running request ``req`` outranks the most (by
        more than the threshold); False when preemption is off or none is outranked."""
        if not self._preemptive:
            return False
        victim = preemption_victim(req, self.running,
                                   self.config.priority_preemption_threshold)
        if victim is None:
            return False
        self._retract(victim, reason=f"preempted by {req.rid} (priority {req.priority} > "
                                     f"{victim.priority})")
        return True

    def _schedule_decode(self) -> ScheduleBatch | None:
        if not self.running:
            return None
        if self.config.schedule_policy == "priority":
            order = order_by_priority(self.running)
        else:
            order = sorted(self.running, key=lambda r: r.created_at)
        end, i = len(order), 0
        while i < end:  # first in order get a slot; the last are retracted to make room
            if self.kv.extend(order[i], 1):
                i += 1
                continue
            end -= 1
            self._retract(order[end])
        batch = order[:end]
        if not batch:
            return None
        n = len(batch)
        return ScheduleBatch(ForwardMode.DECODE, batch, [r.kv_len - 1 for r in batch], [1] * n,
                             [True] * n)

    def _retract(self, req: Req, reason: str = "for lack of KV slots") -> None:
        """Give back a running request's K/V (to the cache) and queue it for recompute."""
        self.running.remove(req)
        if req.kv_len > req.fill_len - 1:  # its slot for this step was already taken
            self.kv.truncate(req, req.fill_len - 1)
        self.kv.release(req, insert=True)
        req.status = ReqStatus.WAITING
        req.num_retractions += 1
        self.stats["num_retractions_total"] += 1
        self.waiting.insert(0, req)
        logger.info("retracted %s (%d tokens) %s", req.rid, req.fill_len, reason)

    # ------------------------------------------------------------------ results
    def _process(self, sb: ScheduleBatch, out: StepOutput) -> None:
        for i, req in enumerate(sb.reqs):
            if req.finished:  # aborted while the step ran
                continue
            try:
                self._record_fill_logprobs(req, out.fill_logprobs.get(i, []))
                if req.kv_len == req.fill_len and not sb.sample[i]:
                    # prefill done without sampling: max_new_tokens == 0 (or budget used)
                    self._finish(req, {"type": "length", "length": len(req.output_ids)})
                    continue
                if i in out.next_ids:
                    self._on_token(req, out.next_ids[i], out.logprobs[i])
                if req.finished:
                    continue
                if sb.mode == ForwardMode.EXTEND:
                    self.kv.cache_unfinished(req, min(req.kv_len, len(req.input_ids)))
                elif len(req.output_ids) % DECODE_INSERT_INTERVAL == 0:
                    self.kv.cache_unfinished(req, req.kv_len)  # share generated text too
                self._stream(req)
            except Exception as e:
                logger.error("request %s failed:\n%s", req.rid, traceback.format_exc())
                self._finish(req, _internal_error(f"internal error: {e!r}"), insert=False)
        self._place(sb.reqs)
        if not self.has_work():
            self.kv.check_counts(self.all_reqs_holding_kv())

    def _place(self, stepped: list[Req]) -> None:
        """Put this step's unfinished requests where their next step will find them:
        decoding if exactly one token lacks K/V, extending otherwise (one pass, O(batch))."""
        ids = {id(r) for r in stepped}
        self.running = [r for r in self.running if id(r) not in ids]
        for req in stepped:
            if not req.finished:
                (self.running if req.pending_len == 1 else self.extending).append(req)

    def _record_fill_logprobs(self, req: Req, entries: list) -> None:
        n_input = len(req.input_ids)
        for pos, lp, top in entries:
            if pos < n_input:
                req.input_token_logprobs.append((lp, req.input_ids[pos]))
                req.input_top_logprobs.append(top)
            elif pos - n_input == len(req.output_token_logprobs):
                req.output_token_logprobs.append((lp, req.output_ids[pos - n_input]))
                req.output_top_logprobs.append(top)

    def _on_token(self, req: Req, token: int, logprob) -> None:
        if req.first_token_at is None:
            req.first_token_at = time.perf_counter()
        req.output_ids.append(token)
        self.stats["generation_tokens_total"] += 1
        if req.logprob.return_logprob:
            req.output_token_logprobs.append((logprob[0], token))
            req.output_top_logprobs.append(logprob[1])
        if self._check_token_stop(req, token):
            return
        if req.grammar is not None:
            if not req.grammar.accept_token(token):
                why = getattr(req.grammar, "error", lambda: None)()  # e.g. a mask budget
                self._finish(req, {"type": "abort", "message":
                                   why or f"token {token} violates the constraint"})
                return
            if req.grammar.is_terminated():
                self._detok_and_check(req)
                self._finish(req, {"type": "stop", "matched": None})
                return
            if self.config.enable_jump_forward and self._jump_forward(req):
                return
        self._detok_and_check(req)

    def _check_token_stop(self, req: Req, token: int) -> bool:
        p = req.params
        if len(req.output_ids) >= p.min_new_tokens:
            if (token in req.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
                req.detok.update(req.output_ids[:-1])
                self._finish(req, {"type": "stop", "matched": token})
                return True
        if len(req.output_ids) >= p.max_new_tokens:
            self._detok_and_check(req)
            if not req.finished:
                self._finish(req, {"type": "length", "length": len(req.output_ids)})
            return True
        return False

    def _detok_and_check(self, req: Req) -> None:
        before = len(req.detok.text)
        req.detok.update(req.output_ids)
        if len(req.detok.text) > before and req.detok.check_stop(before):
            self._finish(req, {"type": "stop", "matched": req.detok.matched})

    def _jump_forward(self, req: Req) -> bool:
        """Apply a forced continuation; True if the request finished while doing so."""
        plan = req.grammar.jump_forward(req.output_ids)
        if plan is None or not plan.token_ids:
            return False
        if plan.rollback:
            del req.output_ids[-plan.rollback:]
            keep = len(req.output_ids)
            del req.output_token_logprobs[keep:]
            del req.output_top_logprobs[keep:]
            self.kv.truncate(req, min(req.kv_len, req.fill_len))
        room = req.params.max_new_tokens - len(req.output_ids)
        forced = plan.token_ids[:room]
        req.output_ids.extend(forced)
        req.forced_tokens += len(forced)
        self.stats["forced_tokens_total"] += len(forced)
        self._detok_and_check(req)
        if not req.finished and len(req.output_ids) >= req.params.max_new_tokens:
            self._finish(req, {"type": "length", "length": len(req.output_ids)})
        return req.finished

    def _stream(self, req: Req) -> None:
        # nothing to send before the first token (a prefill chunk is not news)
        if req.stream and not req.finished and req.output_ids:
            interval = req.params.stream_interval
            if interval and len(req.output_ids) - req.last_streamed_tokens < interval:
                return
            req.last_streamed_tokens = len(req.output_ids)
            text_len = len(req.detok.visible_text(final=False))
            if text_len != req.last_streamed_len:
                req.last_streamed_len = text_len
                req.sink.put(make_output(req, self.tokenizer, final=False))

    def _finish(self, req: Req, reason: dict, insert: bool = True) -> None:
        self._unqueue(req)
        req.finish(reason)
        req.status = ReqStatus.FINISHED
        for group in (self.running, self.extending, self.waiting, self.grammar_pending):
            if req in group:
                group.remove(req)
        if req.row is not None:
            self.kv.release(req, insert=insert)
        self.by_rid.pop(req.rid, None)
        self.runner.release_generator(req)
        if req.grammar_future is not None and not req.grammar_future.done():
            req.grammar_future.cancel()
        req.detok.flush(req.output_ids if reason.get("type") != "stop"
                        or not isinstance(reason.get("matched"), int)
                        else req.output_ids[:-1])
        req.sink.put(make_output(req, self.tokenizer, final=True))

    # ------------------------------------------------------------------ admin
    def flush_cache(self) -> bool:
        if self.has_work() or self.all_reqs_holding_kv():
            return False
        freed = self.kv.cache.all_slots()
        self.kv.cache.reset()
        self.kv.slots.free(freed)
        return True

    def snapshot(self) -> dict:
        kv = self.kv
        used = kv.slots.usable - kv.slots.num_free
        prompt = self.stats["prompt_tokens_total"]
        return {
            **self.stats,
            "num_running": len(self.running) + len(self.extending),
            "num_waiting": len(self.waiting),
            "num_grammar_pending": len(self.grammar_pending),
            "kv_used_tokens": used,
            "kv_capacity": kv.slots.usable,
            "kv_usage": used / max(kv.slots.usable, 1),
            "tree_size": kv.cache.total_size,
            "tree_evictable": kv.cache.evictable_size,
            "evicted_tokens_total": kv.evicted_total,
            "cache_hit_rate": self.stats["cached_tokens_total"] / prompt if prompt else 0.0,
        }
