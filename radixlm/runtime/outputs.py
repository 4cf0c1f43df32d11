"""Result dicts in the shape of SGLang's ``/generate`` and the sinks that carry them."""

from __future__ import annotations

import asyncio
import queue
import time

import numpy as np

from radixlm.runtime.request import Req


def _with_text(entries, tokenizer, want_text: bool) -> list:
    if not want_text:
        return [(lp, tid, None) for lp, tid in entries]
    return [(lp, tid, tokenizer.decode([tid])) for lp, tid in entries]


def _tops(tops, tokenizer, want_text: bool) -> list:
    return [None if t is None else _with_text(t, tokenizer, want_text) for t in tops]


def spec_meta(req: Req) -> dict:
    """Speculative decoding's per-request counters under SGLang's meta_info names:
    verification steps, draft tokens verified and accepted, their ratio, and
    ``spec_accept_length``: completion tokens per verification step (SGLang's formula)."""
    verify, drafted = req.spec_verify_ct, req.spec_draft_token_num
    return {
        "spec_verify_ct": verify,
        "spec_draft_token_num": drafted,
        "spec_accept_token_num": req.spec_accept_token_num,
        "spec_accept_rate": req.spec_accept_token_num / drafted if drafted else 0.0,
        "spec_accept_length": len(req.output_ids) / verify if verify else 1.0,
    }


def normalized(vector, dimensions: int | None = None) -> list[float]:
    """``vector``'s first ``dimensions`` entries (all: None) scaled to unit L2 norm, as
    float32 values (a zero vector stays zero)."""
    v = np.asarray(vector, dtype=np.float64)[:dimensions].astype(np.float32)
    norm = float(np.linalg.norm(v.astype(np.float64)))
    return (v / np.float32(norm) if norm > 0 else v).tolist()


def embed_output(req: Req) -> dict:
    """An encode request's result (SGLang's ``/encode`` shape): the mean of its prompt's
    final-normed hidden states, L2-normalised (None if it did not finish its prompt)."""
    n = len(req.input_ids)
    done = req.embed_sum is not None and (req.finish_reason or {}).get("type") == "length"
    meta = {"id": req.rid, "prompt_tokens": n, "cached_tokens": req.cached_tokens,
            "finish_reason": req.finish_reason,
            "e2e_latency": time.perf_counter() - req.created_at}
    return {"embedding": normalized(req.embed_sum / n) if done else None, "meta_info": meta,
            "index": 0}


def make_output(req: Req, tokenizer, final: bool) -> dict:
    """The request's result so far (cumulative ``text``/``output_ids``); an encode request's
    is ``embed_output``'s."""
    if req.embed:
        return embed_output(req)
    text = req.detok.visible_text(final=final)
    meta = {
        "id": req.rid,
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "finish_reason": req.finish_reason if final else None,
        "e2e_latency": time.perf_counter() - req.created_at,
    }
    if req.first_token_at is not None:
        meta["ttft"] = req.first_token_at - req.created_at
    if req.cached_tokens_details is not None:  # hierarchical cache: cached_tokens by tier
        meta["cached_tokens_details"] = dict(req.cached_tokens_details)
    if req.forced_tokens:
        meta["forced_tokens"] = req.forced_tokens
    if req.close_within_budget:  # complete_within_max_tokens: was the close forced, where
        meta["closed_by_budget"] = req.closed_at is not None
        if req.closed_at is not None:
            meta["closed_at"] = req.closed_at
    if req.speculative:
        meta.update(spec_meta(req))
    if req.reproducible is not None:  # a seeded request: reproducible on this engine?
        meta["reproducible"] = req.reproducible
    if req.logprob.return_logprob:
        want = req.logprob.return_text_in_logprobs
        start = req.logprob_start
        inputs = list(req.input_token_logprobs)
        tops = list(req.input_top_logprobs)
        if start == 0 and start < len(req.input_ids):
            inputs = [(None, req.input_ids[0])] + inputs
            tops = [None] + tops
        meta["input_token_logprobs"] = _with_text(inputs, tokenizer, want)
        meta["input_top_logprobs"] = _tops(tops, tokenizer, want)
        meta["output_token_logprobs"] = _with_text(req.output_token_logprobs, tokenizer, want)
        meta["output_top_logprobs"] = _tops(req.output_top_logprobs, tokenizer, want)
    return {"text": text, "output_ids": list(req.output_ids), "meta_info": meta, "index": 0}


class QueueSink:
    """Thread-safe sink for synchronous callers; ``index`` tags results of a batch."""

    def __init__(self, q: queue.Queue, index: int) -> None:
        self.q, self.index = q, index

    def put(self, item: dict) -> None:
        item["index"] = self.index
        self.q.put(item)


class AsyncSink:
    """Delivers results into an ``asyncio.Queue`` owned by another thread's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, q: asyncio.Queue, index: int) -> None:
        self.loop, self.q, self.index = loop, q, index

    def put(self, item: dict) -> None:
        item["index"] = self.index
        try:
            self.loop.call_soon_threadsafe(self.q.put_nowait, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening
            pass


class LatestSink:
    """A stream's sink that keeps only the newest result: results are cumulative, so a slow
    consumer loses nothing by skipping to the latest, and the buffer stays one item however
    long it does not read."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._latest: dict | None = None
        self._ready = asyncio.Event()

    def put(self, item: dict) -> None:
        try:
            self.loop.call_soon_threadsafe(self._set, item)
        except RuntimeError:  # the caller's loop is closed: nobody is listening
            pass

    def _set(self, item: dict) -> None:
        if self._latest is None or self._latest["meta_info"]["finish_reason"] is None:
            self._latest = item  # never replace the final result
        self._ready.set()

    async def get(self) -> dict:
        """The newest result not yet returned (waits for one)."""
        await self._ready.wait()
        self._ready.clear()
        item, self._latest = self._latest, None
        assert item is not None
        return item
