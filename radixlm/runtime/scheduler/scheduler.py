"""Continuous batching on one thread, composed of parts.

Each step is either an EXTEND batch (new requests, prefill chunks, resumed or
jump-forwarded requests: anything with more than one token lacking K/V) under the token
budget ``chunked_prefill_size`` (while requests decode, they decode in that step too and a
prompt that needs chunking comes ``mixed_prefill_size`` tokens a step), chosen by
`Admission`, or, when there is none, a DECODE step for every running request, whose slots
`Retraction` allocates (retracting the newest when decode runs out of KV slots after
evicting the cache: their K/V goes to the cache or is freed and they wait to be
recomputed). `Speculation` may then give the batch's requests drafts to verify in the same
step (where the measured step times say they pay), runs the model and settles the
verification's K/V; `Postprocessor` applies the results. Nothing admitted is lost: it
finishes, is retracted and resumed, or is aborted on purpose. The parts share one
`SchedulerState` and reach each other only through what they are given.

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
import traceback
from collections.abc import Callable

from radixlm import envs
from radixlm.runtime.hicache import create_tiers
from radixlm.runtime.kv_manager import KVManager
from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.request import Req
from radixlm.runtime.scheduler.admission import Admission
from radixlm.runtime.scheduler.inbox import Inbox
from radixlm.runtime.scheduler.postprocess import Postprocessor, internal_error
from radixlm.runtime.scheduler.retraction import Retraction
from radixlm.runtime.scheduler.speculation import Speculation
from radixlm.runtime.scheduler.state import SchedulerState
from radixlm.runtime.speculative import create_drafter
from radixlm.runtime.step import ScheduleBatch

logger = logging.getLogger(__package__)


def _state_view(name: str) -> property:
    """Read-only ``scheduler.<name>``: the shared state's ``name`` (engine, tests)."""
    return property(lambda self: getattr(self.state, name), doc=f"``state.{name}``")


class Scheduler:
    """The scheduler thread: its API for other threads, the loop, and one step.

    Owns: the thread, the inbox, the KV manager (``kv``), the shared ``state`` and the
    admission bound (``admission_lock``, ``num_queued``, ``dead``).
    Other threads may call ``start``, ``stop``, ``submit``, ``abort``, ``call``,
    ``is_alive``, ``snapshot`` and, under ``admission_lock``, read and change
    ``num_queued``; everything else runs on the scheduler thread (``call`` gets there).
    """

    waiting = _state_view("waiting")
    running = _state_view("running")
    extending = _state_view("extending")
    grammar_pending = _state_view("grammar_pending")
    by_rid = _state_view("by_rid")
    stats = _state_view("stats")
    num_active = _state_view("num_active")
    has_work = _state_view("has_work")
    all_reqs_holding_kv = _state_view("all_reqs_holding_kv")

    def __init__(self, config, runner: ModelRunner, tokenizer, grammar_backend=None) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.runner = runner
        self.grammar_backend = grammar_backend
        self.kv = KVManager(runner.pool.capacity, config.max_running_requests + 1,
                            config.disable_radix_cache, config.radix_eviction_policy,
                            tiers=create_tiers(config, runner.pool, runner.model_dir))
        self.state = SchedulerState()
        self.admission_lock = threading.Lock()
        self.num_queued = 0  # admitted and not yet started, or reserved (under the lock)
        self.dead: BaseException | None = None  # set (under the lock) if the thread died
        self.postprocessor = Postprocessor(config, self.state, self.kv, runner, tokenizer,
                                           unqueue=self._unqueue)
        finish = self.postprocessor.finish
        self.retraction = Retraction(config, self.state, self.kv)
        self.admission = Admission(config, self.state, self.kv, self.retraction,
                                   finish=finish, unqueue=self._unqueue)
        self.inbox = Inbox(self.state, add=self.admission.add, finish=finish)
        self.speculation = Speculation(config, self.state, self.kv, runner, grammar_backend,
                                       create_drafter(config, self.kv.cache,
                                                      native_steps=runner.native is not None,
                                                      tokenizer=tokenizer))
        self.postprocessor.on_finish = self.speculation.release
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="radixlm-scheduler", daemon=True)

    # ------------------------------------------------------------------ thread API
    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put("wake", None)
        self.thread.join(timeout=30)
        self.kv.close()

    def submit(self, req: Req) -> None:
        self.inbox.put("add", req)

    def abort(self, rid: str) -> None:
        self.inbox.put("abort", rid)

    def call(self, fn: Callable[[], object], timeout: float = 60.0):
        """Run ``fn`` on the scheduler thread between steps and return its result."""
        done: queue.Queue = queue.Queue(maxsize=1)
        self.inbox.put("call", (fn, done))
        ok, value = done.get(timeout=timeout)
        if not ok:
            raise value
        return value

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
                    idle = not self.state.has_work()
                    if idle:  # freed step memory goes back to the OS while nothing runs
                        envs.trim_malloc()
                    self.inbox.drain(block=idle)
                    self.admission.poll_grammars()
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
            self.inbox.fail_all(reason)

    # ------------------------------------------------------------------ one step
    def step(self) -> None:
        sb = self.admission.schedule_extend() or self.retraction.schedule_decode()
        if sb is None:
            return
        spec = self.speculation
        try:
            spec.attach(sb)
            out = spec.forward(sb)
        except Exception as e:
            logger.error("step failed:\n%s", traceback.format_exc())
            spec.withdraw(sb)
            self._isolate_failure(sb, e)
            return
        spec.settle(sb, out)
        self.state.stats["num_steps_total"] += 1
        self.postprocessor.process(sb, out)
        spec.after(sb, out)

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
                    out = self.speculation.forward(one)
                except Exception as e:
                    logger.error("request %s fails alone:\n%s", req.rid, traceback.format_exc())
                    failure = e
            if failure is not None:
                self.postprocessor.finish(req, internal_error(f"internal error: {failure!r}"),
                                          insert=False)
                continue
            self.state.stats["num_steps_total"] += 1
            self.postprocessor.process(one, out)

    # ------------------------------------------------------------------ admin
    def flush_cache(self, tier: str | None = None) -> bool:
        """Empty the prefix cache, or one tier of it (``KVManager.flush``); False while
        requests are in flight (the device tier and a full flush only)."""
        busy = self.state.has_work() or bool(self.state.all_reqs_holding_kv())
        return self.kv.flush(tier, busy)

    def snapshot(self) -> dict:
        kv, state = self.kv, self.state
        used = kv.slots.usable - kv.slots.num_free
        prompt = state.stats["prompt_tokens_total"]
        return {
            **state.stats,
            "num_running": len(state.running) + len(state.extending),
            "num_waiting": len(state.waiting),
            "num_grammar_pending": len(state.grammar_pending),
            "kv_used_tokens": used,
            "kv_capacity": kv.slots.usable,
            "kv_usage": used / max(kv.slots.usable, 1),
            "tree_size": kv.cache.total_size,
            "tree_evictable": kv.cache.evictable_size,
            "evicted_tokens_total": kv.evicted_total,
            "cache_hit_rate": state.stats["cached_tokens_total"] / prompt if prompt else 0.0,
            "hicache": kv.tier_stats(),
        }
