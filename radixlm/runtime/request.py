"""A request's bookkeeping: tokens, KV ownership, logprobs, finish state. No torch here.

KV ownership. ``kv_slots[i]`` is the pool slot holding the K/V of token ``i`` of
``fill_ids`` (prompt followed by output), for ``i < kv_len``. The first
``cache_owned_len`` of them belong to the prefix cache (held by the lock on
``cache_node``); the rest belong to the request and are freed or handed to the cache when
it finishes. ``row`` is the request's row of ``req_to_token``; entries before
``row_synced`` are up to date on the device.

An encode request (``embed``) has no output: it is prefilled like any request and ends
there, its result the mean of the final-normed hidden states over its prompt positions.
It takes no cached prefix (``max_cacheable_prefix`` 0): a cache hit skips positions whose
hidden states nothing kept, and recomputing them costs what computing them does. Its K/V
still goes to the prefix cache when it ends, for the requests that come after.
``embed_sum`` holds the sum over the positions computed so far (one entry per hidden
dimension, float64; a chunked prefill adds one chunk at a time).
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.detokenizer import IncrementalDetokenizer
from radixlm.runtime.sampling_params import SamplingParams

_uids = itertools.count(1)


class ReqStatus(enum.Enum):
    GRAMMAR_PENDING = "grammar_pending"
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class LogprobOptions:
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False


@dataclass(eq=False)
class Req:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    logprob: LogprobOptions
    detok: IncrementalDetokenizer
    sink: Any  # OutputSink
    stream: bool = False
    seed: int = 0
    # scheduling priority under the `priority` policy (higher runs first; the engine flips
    # the sign when `low_priority_values_first`)
    priority: int = 0
    eos_ids: frozenset[int] = frozenset()
    output_ids: list[int] = field(default_factory=list)
    status: ReqStatus = ReqStatus.WAITING
    # KV state
    row: int | None = None
    kv_slots: list[int] = field(default_factory=list)
    row_synced: int = 0
    cache_node: Any = None
    cache_owned_len: int = 0
    # constraint
    grammar: Any = None
    grammar_future: Any = None
    # complete_within_max_tokens: the output closes its document within max_new_tokens;
    # closed_at: the output tokens written before the close was forced (None: not forced)
    close_within_budget: bool = False
    closed_at: int | None = None
    # logprobs: (logprob | None, token_id) and top lists of (logprob, token_id)
    input_token_logprobs: list = field(default_factory=list)
    input_top_logprobs: list = field(default_factory=list)
    output_token_logprobs: list = field(default_factory=list)
    output_top_logprobs: list = field(default_factory=list)
    # outcome and stats
    finish_reason: dict | None = None
    cached_tokens: int = 0
    # hierarchical cache: cached_tokens by tier ({"device", "host", "storage"}), else None
    cached_tokens_details: dict | None = None
    forced_tokens: int = 0
    num_retractions: int = 0
    created_at: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    last_streamed_len: int = -1
    queued: bool = False  # holds a place in the admission bound (scheduler.num_queued)
    last_streamed_tokens: int = 0  # output length at the last stream check (stream_interval)
    # speculative decoding (SGLang's meta_info names), counted while `speculative`:
    # verification steps (its decode steps, with a draft or none), draft tokens verified,
    # draft tokens accepted; and the acceptance history drafts are sized by (decayed
    # counts of accepted tokens and of rejections)
    speculative: bool = False
    spec_verify_ct: int = 0
    spec_draft_token_num: int = 0
    spec_accept_token_num: int = 0
    spec_hits: float = 0.0
    spec_misses: float = 0.0
    # encode (embedding) requests: see the module docstring
    embed: bool = False
    embed_sum: Any = None  # numpy float64 [hidden] over the positions computed so far
    # a seeded request: whether its engine is batch-invariant (the same seed, prompt and
    # settings give the same text in any batch or cache state); None: no seed was given
    reproducible: bool | None = None
    uid: int = field(default_factory=lambda: next(_uids))

    @property
    def fill_ids(self) -> list[int]:
        return self.input_ids + self.output_ids

    def fill_slice(self, start: int, end: int) -> list[int]:
        """``fill_ids[start:end]`` without building the whole list (hot path)."""
        n = len(self.input_ids)
        if end <= n:
            return self.input_ids[start:end]
        if start >= n:
            return self.output_ids[start - n:end - n]
        return self.input_ids[start:] + self.output_ids[:end - n]

    @property
    def fill_len(self) -> int:
        return len(self.input_ids) + len(self.output_ids)

    @property
    def kv_len(self) -> int:
        return len(self.kv_slots)

    @property
    def pending_len(self) -> int:
        """Tokens of ``fill_ids`` whose K/V is not computed yet."""
        return self.fill_len - self.kv_len

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def logprob_start(self) -> int:
        """First prompt position whose logprob is reported (``len(input_ids)``: none)."""
        start = self.logprob.logprob_start_len
        if not self.logprob.return_logprob or start < 0:
            return len(self.input_ids)
        return min(start, len(self.input_ids))

    @property
    def max_cacheable_prefix(self) -> int:
        """How much of ``fill_ids`` may come from the cache: at least one token must be
        computed (its logits give the next token), and prompt positions whose logprobs
        are asked for must be computed too (their logits predict the following token).
        An encode request computes every position (its mean needs each hidden state)."""
        if self.embed:
            return 0
        limit = self.fill_len - 1
        if self.logprob_start < len(self.input_ids):
            limit = min(limit, max(self.logprob_start - 1, 0))
        return max(limit, 0)

    def finish(self, reason: dict) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
            self.finished_at = time.perf_counter()
