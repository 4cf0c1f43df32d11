"""The in-process engine: validates requests, hands them to the scheduler thread, and
returns SGLang-shaped results (see docs/ENGINE_API.md)."""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
import queue
import random
import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixlm import envs
from radixlm.formats.chat_templates import load_chat_template
from radixlm.radix import TreeView
from radixlm.runtime import early
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.detokenizer import IncrementalDetokenizer
from radixlm.runtime.grammar_setup import GrammarSetup, in_background
from radixlm.runtime.outputs import AsyncSink, LatestSink, QueueSink, normalized
from radixlm.runtime.request import LogprobOptions, Req
from radixlm.runtime.request_rules import fan_out_samples, fit_max_new_tokens
from radixlm.runtime.sampling_params import SamplingParams, check_top_logprobs_num
from radixlm.runtime.weights import (
    checked_vocabulary,
    generation_eos_ids,
    load_hf_config,
    resolve_model,
    start_tokenizer,
)

if TYPE_CHECKING:
    from radixlm.runtime.scheduler import Scheduler

logger = logging.getLogger(__name__)


def runtime_classes() -> tuple[type, type]:
    """The model runner's and the scheduler's classes: torch and the runtime imported, the
    first time in a process. An engine imports them after it has read the config, started
    its tokenizer's thread (a GGUF's vocabulary, built meanwhile) and its weights' placement
    (``early.start``: a GGUF's, placed meanwhile); importing this module imports no torch.
    Call under ``envs.gc_paused`` (it says why)."""
    from radixlm.runtime.model_runner import ModelRunner
    from radixlm.runtime.scheduler import Scheduler

    return ModelRunner, Scheduler


class QueueFullError(RuntimeError):
    """The waiting queue is at ``max_queued_requests``; retry later (HTTP 429)."""


class EngineDeadError(RuntimeError):
    """The scheduler thread has died; the engine serves nothing more (HTTP 503)."""


class Admission:
    """Places reserved in the waiting queue by ``Engine.reserve``; each request submitted
    with it uses one. ``release()`` gives back the unused ones (idempotent)."""

    def __init__(self, scheduler: Scheduler, count: int) -> None:
        self._scheduler = scheduler
        self.left = count

    def take(self, count: int) -> None:
        """Use ``count`` places (called under the scheduler's admission lock)."""
        if count > self.left:
            raise ValueError(f"the reservation has {self.left} places left, not {count}")
        self.left -= count

    def release(self) -> None:
        with self._scheduler.admission_lock:
            self._scheduler.num_queued -= self.left
            self.left = 0


def _embedding_results(results: list, single: bool, dimensions: int | None):
    """Encode results in prompt order, truncated to ``dimensions`` and renormalised."""
    if dimensions is not None:
        for out in results:
            if out["embedding"] is not None:
                out["embedding"] = normalized(out["embedding"], dimensions)
    return results[0] if single else results


@dataclass
class _Prepared:
    input_ids: list[int]
    params: SamplingParams
    logprob: LogprobOptions
    rid: str
    grammar_spec: object = None
    priority: int = 0
    reasoning: object = None  # constraints.after_reasoning.ReasoningSpec, or None
    close_within_budget: bool = False  # complete_within_max_tokens, resolved


def _token_lists(tokenizer, prompt, input_ids) -> tuple[list[list[int]], bool]:
    """The prompts as token id lists (text tokenized without special tokens), and whether
    one prompt was given (not a list); ValueError unless exactly one form is given."""
    if (prompt is None) == (input_ids is None):
        raise ValueError("give exactly one of prompt and input_ids")
    if prompt is not None:
        single = isinstance(prompt, str)
        prompts = [prompt] if single else prompt
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise ValueError("prompt must be a string or a list of strings")
        return [tokenizer.encode(p, add_special_tokens=False) for p in prompts], single
    single = bool(input_ids) and all(isinstance(t, int) for t in input_ids)
    ids_list = [input_ids] if single or not input_ids else input_ids
    if not isinstance(ids_list, list) or not all(
            isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool)
                                          for t in ids) for ids in ids_list):
        raise ValueError("input_ids must be a list of ints or a list of such lists")
    return ids_list, single


def _is_token_ids(value) -> bool:
    """A list of ints, or a non-empty list of such lists (SGLang's ``encode`` takes token
    ids as its prompt)."""
    if not isinstance(value, list) or not value:
        return False
    return (all(isinstance(t, int) for t in value)
            or all(isinstance(x, list) and all(isinstance(t, int) for t in x) for x in value))


def _priority(config: EngineConfig, value) -> int:
    """A request's scheduling priority (0 when unset); only the priority policy takes
    a non-zero one (another policy would silently ignore it)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"priority must be an int, got {value!r}")
    if value and config.schedule_policy != "priority":
        raise ValueError(f"priority={value} needs schedule_policy='priority' (the server's "
                         f"--schedule-policy priority); this engine runs "
                         f"{config.schedule_policy!r}")
    return -value if config.low_priority_values_first else value


def _iter_stream(q: queue.Queue, rid: str, abort) -> Iterator[dict]:
    """A synchronous stream's chunks from ``q``; ``abort(rid)`` if left unfinished."""
    finished = False
    try:
        while not finished:
            item = q.get()
            item.pop("index", None)
            finished = item["meta_info"]["finish_reason"] is not None
            yield item
    finally:
        if not finished:
            abort(rid)


async def _aiter_latest(sink: LatestSink, rid: str, abort) -> AsyncIterator[dict]:
    """An async stream's chunks (the latest one each time); ``abort(rid)`` if left
    unfinished."""
    finished = False
    try:
        while not finished:
            item = await sink.get()
            item.pop("index", None)
            finished = item["meta_info"]["finish_reason"] is not None
            yield item
    finally:
        if not finished:
            abort(rid)


def _eos_ids(tokenizer, hf_config, model_path) -> frozenset[int]:
    """The ids that end a generation: the tokenizer's, the config's, generation_config's."""
    ids = set()
    for value in (tokenizer.eos_token_id, getattr(hf_config, "eos_token_id", None),
                  generation_eos_ids(model_path)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)


def _text_side(config: EngineConfig, model_path, hf_config, checked: Future) -> tuple:
    """The engine's tokenizer (its chat template as configured) and its end-of-turn ids:
    made on a thread of their own while the weights load (a GGUF's vocabulary ~0.3-0.5 s;
    the weights are mostly C code, the GIL released). ``checked`` completes once the
    vocabulary's early check has run (a GGUF's byte-level vocabulary built, its merges
    checked: ``checked_vocabulary``), with the ValueError where it refused the file: the
    engine waits for it before its runner allocates anything."""
    path = config.tokenizer_path or model_path
    try:
        backend = checked_vocabulary(path)
    except BaseException as exc:
        checked.set_exception(exc)
        raise
    checked.set_result(None)
    tokenizer = start_tokenizer(path, backend)
    if config.chat_template is not None:
        tokenizer.chat_template = load_chat_template(config.chat_template)
    return tokenizer, _eos_ids(tokenizer, hf_config, model_path)


class Engine:
    def __init__(self, model: str | None = None, **kwargs) -> None:
        """`model`: an alias, HF directory or .gguf file (default: the embedded model).
        Keyword arguments are EngineConfig fields, or SGLang's server-argument names
        (`model_path=`, `mem_fraction_static=`, ...; see runtime/server_args.py)."""
        self.config = EngineConfig.from_kwargs(model=model, **kwargs)
        if self.config.node_rank > 0:
            raise ValueError(f"node_rank={self.config.node_rank} runs tensor-parallel ranks "
                             "only, no engine: start it with `radixlm serve --node-rank N` "
                             "(node 0 runs the Engine)")
        envs.configure_malloc()  # process-wide, so only where a model will run
        logging.basicConfig(level=self.config.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.model_name = self.config.served_model_name or self.config.model
        with envs.gc_paused():  # (frozen at its end: envs.gc_paused)
            self.model_path = resolve_model(self.config.model)
            self.hf_config = load_hf_config(self.model_path)
            self.context_len = min(self.config.context_length
                                   or self.hf_config.max_position_embeddings,
                                   self.hf_config.max_position_embeddings)
            checked: Future = Future()
            text = in_background(_text_side, self.config, self.model_path, self.hf_config,
                                 checked)
            placing = early.start(self.config, self.model_path, self.hf_config,
                                  self.context_len, checked)
            ModelRunner, Scheduler = runtime_classes()  # (torch: meanwhile ``text``, ``placing``)
            checked.result()  # (a damaged vocabulary refused before the runner allocates)
            # with tp_size > 1 this starts the other ranks (bad sizes fail before that)
            self.runner = ModelRunner(self.config, self.model_path, self.context_len,
                                      early=placing)
            try:
                self.tokenizer, self.eos_ids = text.result()
                self.scheduler = Scheduler(self.config, self.runner, self.tokenizer)
            except BaseException:
                self.runner.shutdown()
                raise
            envs.trim_malloc(0)  # (what the setup thread's arenas freed: theirs alone)
        self._rng = random.Random(self.config.random_seed)
        self._ids = itertools.count()
        self._closed = False
        self.scheduler.start()
        # the grammar backend after ready (grammar_setup.py says why)
        self._grammar = GrammarSetup(self.tokenizer, self.config, self.eos_ids,
                                     self.runner.vocab_size, self.scheduler)

    @property
    def grammar_backend(self):
        """The constrained-decoding backend; None where unavailable. Made on a thread after
        the engine is ready: a first use within ~1 s of the start waits for it."""
        return self._grammar.backend

    # ------------------------------------------------------------------ validation
    def _prepare(self, prompt, input_ids, sampling_params, return_logprob, logprob_start_len,
                 top_logprobs_num, return_text_in_logprobs, rid,
                 priority=None) -> tuple[list[_Prepared], bool]:
        ids_list, single = _token_lists(self.tokenizer, prompt, input_ids)
        if not ids_list:
            raise ValueError("the batch is empty")
        n = len(ids_list)

        def per_item(value, name):
            if not isinstance(value, list):
                return [value] * n
            if len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries for {n} prompts")
            return value

        params_l = per_item(sampling_params, "sampling_params")
        lp_l = per_item(return_logprob, "return_logprob")
        start_l = per_item(logprob_start_len, "logprob_start_len")
        top_l = per_item(top_logprobs_num, "top_logprobs_num")
        rid_l = per_item(rid, "rid") if rid is not None else [None] * n
        prio_l = per_item(priority, "priority")
        if rid is not None and single and isinstance(rid, list):
            raise ValueError("rid must be a string for a single prompt")
        prepared: list[_Prepared] = []
        for i, ids in enumerate(ids_list):
            raw = params_l[i]
            params = SamplingParams.from_dict(dict(raw) if isinstance(raw, dict) else raw)
            self._check_lengths(ids, params, explicit=isinstance(raw, dict)
                                and raw.get("max_new_tokens") is not None)
            lp = LogprobOptions(bool(lp_l[i]), int(start_l[i] if start_l[i] is not None else -1),
                                int(top_l[i] or 0), bool(return_text_in_logprobs))
            check_top_logprobs_num(lp.top_logprobs_num)
            spec, reasoning = self._grammar_spec(params, ids)
            close = params.complete_within_max_tokens
            close = (self.config.complete_within_max_tokens if close is None else close) \
                and spec is not None
            prio = _priority(self.config, prio_l[i])
            base_rid = rid_l[i] or uuid.uuid4().hex
            for sub_rid, seed in fan_out_samples(base_rid, params.n, params.seed):
                sub = params if params.n == 1 or seed is None else params.with_seed(seed)
                prepared.append(_Prepared(list(ids), sub, lp, sub_rid, spec, prio, reasoning,
                                          close))
        return prepared, single and len(prepared) == 1

    def _check_lengths(self, ids: list[int], params: SamplingParams, explicit: bool) -> None:
        if not ids:
            raise ValueError("prompt is empty (0 tokens)")
        vocab = self.runner.vocab_size
        if any(t < 0 or t >= vocab for t in ids):
            raise ValueError(f"input_ids contain a token id outside [0, {vocab})")
        if params.logit_bias and any(int(t) >= vocab for t in params.logit_bias):
            raise ValueError(f"logit_bias has a token id outside [0, {vocab})")
        params.max_new_tokens = fit_max_new_tokens(len(ids), params.max_new_tokens,
                                                   self.context_len, strict=explicit)
        capacity = self.scheduler.kv.slots.usable
        if len(ids) + params.max_new_tokens > capacity:
            raise ValueError(f"prompt ({len(ids)}) + max_new_tokens ({params.max_new_tokens}) "
                             f"exceeds the KV pool ({capacity} tokens)")

    def _grammar_spec(self, params: SamplingParams, ids: list[int]):
        """(the request's constraint spec or None, its grammar-after-reasoning spec or None:
        with a reasoning parser, a constraint starts at the end of the thinking block)."""
        budget = params.thinking_budget
        constrained = bool(params.constraint_kinds())
        if not constrained and budget is None and self.config.reasoning_parser is None:
            return None, None  # (the grammar backend not waited for)
        if budget is not None and self._grammar.reasoning is None:
            if self.config.reasoning_parser is not None:
                raise ValueError("thinking_budget is unavailable: constrained decoding is off "
                                 f"for this model ({self._grammar.error})")
            raise ValueError("thinking_budget needs a reasoning parser: start the engine with "
                             "reasoning_parser=... (--reasoning-parser)")
        if budget is not None and budget > params.max_new_tokens:
            raise ValueError(f"thinking_budget={budget} is above max_new_tokens="
                             f"{params.max_new_tokens} (what is left of the context)")
        spec = None
        if constrained:
            if self.grammar_backend is None:
                raise ValueError(f"constraints are unavailable: {self._grammar.error}")
            from radixlm.constraints import spec_from_sampling_params

            spec = spec_from_sampling_params(params, self.config.json_whitespace)
            self.grammar_backend.validate(spec)
        reasoning = self._grammar.reasoning
        if reasoning is None or not reasoning.needed(spec is not None, budget):
            return spec, None
        return spec, reasoning.plan(spec, self.tokenizer, ids, budget,
                                    eos_ends=not params.ignore_eos)

    def _make_req(self, p: _Prepared, sink, stream: bool) -> Req:
        params = p.params
        detok = IncrementalDetokenizer(
            self.tokenizer, skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens, stop=params.stop,
            stop_regex=params.stop_regex, no_stop_trim=params.no_stop_trim)
        req = Req(rid=p.rid, input_ids=p.input_ids, params=params, logprob=p.logprob,
                  detok=detok, sink=sink, stream=stream, eos_ids=self.eos_ids,
                  seed=params.seed if params.seed is not None else self._rng.getrandbits(62),
                  priority=p.priority,
                  speculative=self.scheduler.speculation.drafter is not None,
                  reproducible=self.batch_invariant if params.seed is not None else None)
        if p.reasoning is not None:
            req.grammar_future = self._grammar.reasoning.compile_async(p.reasoning)
        elif p.grammar_spec is not None:
            req.grammar_future = self.grammar_backend.compile_async(p.grammar_spec)
        if p.close_within_budget:
            from radixlm.constraints.budget import checked_for_budget

            req.close_within_budget = True
            req.grammar_future = checked_for_budget(req.grammar_future, params.max_new_tokens)
        return req

    def _check_room(self, count: int, limit: int | None) -> None:
        """Raise unless ``count`` more requests fit (call under the admission lock)."""
        s = self.scheduler
        if self._closed:
            raise RuntimeError("engine is shut down")
        if s.dead is not None:
            raise EngineDeadError(f"the engine has died ({type(s.dead).__name__}: {s.dead})")
        bound = self.config.max_queued_requests
        if limit is not None:
            bound = limit if bound is None else min(bound, limit)
        if bound is not None and count > bound:  # no retry can ever fit it: a bad request
            raise ValueError(f"this call needs {count} places in the waiting queue (a batch "
                             f"or n fan-out) but it holds at most {bound}; split the call")
        if bound is not None and s.num_queued + count > bound:
            raise QueueFullError(f"waiting queue is full ({s.num_queued} queued, limit {bound}; "
                                 f"{count} more asked)")

    def reserve(self, count: int, limit: int | None = None) -> Admission:
        """Reserve ``count`` places in the waiting queue at once, or none: QueueFullError
        when they do not fit under ``max_queued_requests`` (or ``limit``, if smaller).
        Pass the result as ``admission=`` to submit requests in those places."""
        with self.scheduler.admission_lock:
            self._check_room(count, limit)
            self.scheduler.num_queued += count
        return Admission(self.scheduler, count)

    def _admit(self, reqs: list[Req], admission: Admission | None = None) -> None:
        """Submit ``reqs`` all or none, each holding a place until it starts running."""
        s = self.scheduler
        with s.admission_lock:
            if admission is not None:
                if s.dead is not None or self._closed:
                    self._check_room(0, None)  # raises
                admission.take(len(reqs))
            else:
                self._check_room(len(reqs), None)
                s.num_queued += len(reqs)
            for req in reqs:
                req.queued = True
                s.submit(req)

    def is_alive(self) -> bool:
        """False once the scheduler thread has died (or the engine was shut down)."""
        return not self._closed and self.scheduler.is_alive()

    # ------------------------------------------------------------------ public API
    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                 logprob_start_len=-1, top_logprobs_num=0, return_text_in_logprobs=False,
                 stream: bool = False, rid=None, priority=None,
                 admission: Admission | None = None):
        """Run to completion (or stream); see docs/ENGINE_API.md for shapes. ``priority``
        (an int, or one per prompt) orders requests under the priority policy;
        ``admission``: places from ``reserve()`` the requests take (else checked here)."""
        prepared, single = self._prepare(prompt, input_ids, sampling_params, return_logprob,
                                         logprob_start_len, top_logprobs_num,
                                         return_text_in_logprobs, rid, priority)
        q: queue.Queue = queue.Queue()
        reqs = [self._make_req(p, QueueSink(q, i), stream) for i, p in enumerate(prepared)]
        if stream:
            if len(reqs) != 1:
                raise ValueError("stream=True takes a single prompt with n=1")
            self._admit(reqs, admission)
            return _iter_stream(q, reqs[0].rid, self.abort)
        self._admit(reqs, admission)
        results: list[dict | None] = [None] * len(reqs)
        remaining = len(reqs)
        while remaining:
            item = q.get()
            if item["meta_info"]["finish_reason"] is not None:
                results[item.pop("index")] = item
                remaining -= 1
        return results[0] if single else results

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None,
                             return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
                             return_text_in_logprobs=False, stream: bool = False, rid=None,
                             priority=None, admission: Admission | None = None):
        """Like ``generate`` without waiting on the event loop for the result: a text prompt
        is tokenized on a worker thread (a long one would otherwise hold the caller's loop;
        the HTTP server passes ``input_ids`` it tokenized off the loop itself);
        ``stream=True`` returns an async iterator of chunks, buffering only the latest
        cumulative chunk while the consumer is slow."""
        args = (prompt, input_ids, sampling_params, return_logprob, logprob_start_len,
                top_logprobs_num, return_text_in_logprobs, rid, priority)
        if prompt is not None:
            prepared, single = await asyncio.to_thread(self._prepare, *args)
        else:
            prepared, single = self._prepare(*args)
        loop = asyncio.get_running_loop()
        if stream:
            if len(prepared) != 1:
                raise ValueError("stream=True takes a single prompt with n=1")
            sink = LatestSink(loop)
            reqs = [self._make_req(prepared[0], sink, stream)]
            self._admit(reqs, admission)
            return _aiter_latest(sink, reqs[0].rid, self.abort)
        q: asyncio.Queue = asyncio.Queue()
        reqs = [self._make_req(p, AsyncSink(loop, q, i), stream) for i, p in enumerate(prepared)]
        self._admit(reqs, admission)
        results: list[dict | None] = [None] * len(reqs)
        remaining = len(reqs)
        try:
            while remaining:
                item = await q.get()
                if item["meta_info"]["finish_reason"] is not None:
                    results[item.pop("index")] = item
                    remaining -= 1
        except asyncio.CancelledError:
            for req in reqs:
                self.abort(req.rid)
            raise
        return results[0] if single else results

    # ------------------------------------------------------------------ embeddings
    def encode(self, prompt=None, input_ids=None, dimensions: int | None = None, rid=None,
               admission: Admission | None = None):
        """Embeddings (SGLang's ``Engine.encode``): ``prompt`` a string, a list of them, token
        ids or a list of token-id lists (or those ids as ``input_ids``). Each prompt is
        prefilled like any request and produces no token; its result is ``{"embedding":
        [float, ...], "meta_info": {"id", "prompt_tokens", "cached_tokens",
        "finish_reason", "e2e_latency"}}``: the mean over its positions of the final-normed
        last hidden states, L2-normalised (``dimensions``: the first that many entries,
        renormalised). One prompt -> dict, a list -> list[dict]."""
        q: queue.Queue = queue.Queue()
        reqs, single = _prepare_encode(self, prompt, input_ids, dimensions, rid,
                                       lambda i: QueueSink(q, i))
        self._admit(reqs, admission)
        results: list[dict | None] = [None] * len(reqs)
        for _ in reqs:
            item = q.get()
            results[item.pop("index")] = item
        return _embedding_results(results, single, dimensions)

    async def async_encode(self, prompt=None, input_ids=None, dimensions: int | None = None,
                           rid=None, admission: Admission | None = None):
        """``encode`` without blocking the event loop (text is tokenized on a worker
        thread); cancelling it aborts the requests."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        args = (self, prompt, input_ids, dimensions, rid, lambda i: AsyncSink(loop, q, i))
        if prompt is not None and not _is_token_ids(prompt):
            reqs, single = await asyncio.to_thread(_prepare_encode, *args)
        else:
            reqs, single = _prepare_encode(*args)
        self._admit(reqs, admission)
        results: list[dict | None] = [None] * len(reqs)
        try:
            for _ in reqs:
                item = await q.get()
                results[item.pop("index")] = item
        except asyncio.CancelledError:
            for req in reqs:
                self.abort(req.rid)
            raise
        return _embedding_results(results, single, dimensions)

    def abort(self, rid: str) -> None:
        self.scheduler.abort(rid)

    def flush_cache(self, tier: str | None = None) -> bool:
        """Drop the prefix cache (every tier), or only ``tier``: ``"device"`` (the KV
        pool's prefixes move on as eviction would move them), ``"host"`` or ``"storage"``
        (the hierarchical cache's tiers). The device tier and a full flush refuse (False)
        while requests are in flight; ValueError for a tier this engine lacks."""
        s = self.scheduler
        return bool(s.call(lambda: s.flush_cache(tier)))

    def get_stats(self) -> dict:
        """Counters and gauges; read without waiting for the scheduler thread (each value
        is consistent on its own, not necessarily with the others)."""
        return {**self.scheduler.snapshot(), "tp_size": self.config.tp_size,
                "dp_size": self.config.dp_size, "batch_invariant": self.batch_invariant}

    @property
    def batch_invariant(self) -> bool:
        """Whether outputs are batch-invariant: a token's logits the same bits whatever
        its batch, chunking, cache state or verify step (``ModelRunner.batch_invariant``:
        every step native with one activation mode that rounds alike at every size)."""
        return self.runner.batch_invariant

    def radix_tree_view(self, max_nodes: int = 256, max_ids: int = 16,
                        timeout: float = 10.0) -> TreeView:
        """A bounded snapshot of the prefix cache for display (radix.TreeView: at most
        ``max_nodes`` nodes with at most ``max_ids`` token ids each, no KV slots), taken on
        the scheduler thread between two steps; ``queue.Empty`` after ``timeout`` s."""
        s = self.scheduler
        return s.call(lambda: s.kv.cache.view(max_nodes, max_ids), timeout=timeout)

    def check_integrity(self) -> None:
        """Raise AssertionError unless every KV slot is in exactly one place."""
        s = self.scheduler
        s.call(lambda: s.kv.check_integrity(s.all_reqs_holding_kv()))

    @property
    def fatal_error(self) -> str | None:
        """Why the engine can no longer serve (a tensor-parallel rank died), or None while
        healthy. The server's /health answers 503 with it."""
        return self.runner.fatal_error

    def shutdown(self) -> None:
        """Stop the scheduler (aborting what is in flight), the grammar workers and the
        other tensor-parallel ranks. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.scheduler.stop()
        if self.grammar_backend is not None:  # (waits for it if still being made)
            self.grammar_backend.shutdown()
        self.runner.shutdown()
        # this engine's objects were frozen with everything else alive at its start: give
        # them back to the collector, so cycles among them can go with the engine
        gc.unfreeze()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass


def _prepare_encode(engine: Engine, prompt, input_ids, dimensions, rid,
                    sink) -> tuple[list[Req], bool]:
    """``engine``'s encode requests for the prompts (text, token ids, or lists of either),
    checked: ValueError naming the problem before anything is queued; ``sink(i)``: prompt
    i's sink."""
    if prompt is not None and input_ids is None and _is_token_ids(prompt):
        prompt, input_ids = None, prompt
    ids_list, single = _token_lists(engine.tokenizer, prompt, input_ids)
    if not ids_list:
        raise ValueError("input is empty (no prompts)")
    hidden = engine.runner.model.cfg.hidden_size
    if dimensions is not None and (isinstance(dimensions, bool)
                                   or not isinstance(dimensions, int)
                                   or not 1 <= dimensions <= hidden):
        raise ValueError(f"dimensions={dimensions!r} must be an integer in [1, {hidden}] "
                         "(the model's hidden size)")
    rids = rid if isinstance(rid, list) else [rid] * len(ids_list)
    if len(rids) != len(ids_list) or (rid is not None and not isinstance(rid, list)
                                      and len(ids_list) > 1):
        raise ValueError("rid must be one string per prompt")
    vocab, capacity = engine.runner.vocab_size, engine.scheduler.kv.slots.usable
    reqs = []
    for i, ids in enumerate(ids_list):
        where = "input" if single else f"input[{i}]"
        if not ids:
            raise ValueError(f"{where} is empty (0 tokens)")
        if any(t < 0 or t >= vocab for t in ids):
            raise ValueError(f"{where} contains a token id outside [0, {vocab})")
        if len(ids) > min(engine.context_len, capacity):
            raise ValueError(f"{where} has {len(ids)} tokens; the context is "
                             f"{engine.context_len} (KV pool {capacity})")
        p = _Prepared(list(ids), SamplingParams(max_new_tokens=0), LogprobOptions(),
                      rids[i] or uuid.uuid4().hex)
        reqs.append(engine._make_req(p, sink(i), False))
        reqs[-1].embed = True
    return reqs, single
