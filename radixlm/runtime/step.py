"""What the scheduler hands the model runner for one step and what it gets back, as plain
Python (no torch: the scheduler's bookkeeping reads and writes these alone):
``ScheduleBatch`` (the step the scheduler decided), ``StepPlan`` (its forward inputs, which
``ModelRunner.run_plan`` turns into tensors and rank 0 broadcasts to the other
tensor-parallel ranks) and ``StepOutput`` (the tokens and numbers it gave)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from radixlm.runtime.request import Req


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # one or more new tokens per request, after a cached prefix
    DECODE = "decode"  # exactly one new token per request


@dataclass
class ScheduleBatch:
    """What the scheduler decided for one step (plain Python).

    Request ``reqs[i]`` computes tokens ``fill_ids[prefix_lens[i]:prefix_lens[i] +
    extend_lens[i]]``, whose slots are already in ``kv_slots``. ``sample[i]`` says whether
    this step ends its pending tokens (then a next token is drawn).

    ``drafts[i]`` (speculative decoding; None: no request has one): draft tokens that
    follow request ``i``'s pending ones in this step, their K/V slots allocated after the
    pending tokens' (``kv_slots[prefix + extend:][:len(draft)]``). A request with a draft
    is verified: a token is sampled at its last pending position and at every draft
    position, and the draft tokens the samples agree with are accepted (``StepOutput``)."""

    mode: ForwardMode
    reqs: list[Req]
    prefix_lens: list[int]
    extend_lens: list[int]
    sample: list[bool]
    drafts: list[list[int]] | None = None


@dataclass
class StepPlan:
    """One step's forward inputs as plain Python: what `run_plan` turns into tensors, and
    what rank 0 broadcasts to the other tensor-parallel ranks."""

    mode: ForwardMode
    input_ids: list[int]
    positions: list[int]
    out_loc: list[int]  # KV slot of each new token
    req_rows: list[int]  # req_to_token row of each request
    seq_lens: list[int]
    prefix_lens: list[int]
    extend_lens: list[int]
    extend_starts: list[int]
    logits_indices: list[int]
    owner_ids: list[int]
    table_writes: tuple[list[int], list[int], list[int]]  # req_to_token rows, cols, slots
    act_rows: int | None = None  # ForwardBatch.act_rows
    hidden_indices: list[int] = field(default_factory=list)  # ForwardBatch.hidden_indices


@dataclass
class StepOutput:
    """A step's results by batch index. A verified request (one with a draft) emits its
    ``accepted`` draft tokens, then ``next_ids``: the model's own token after them (the
    correction of the first rejected draft token, or one more after a fully accepted
    draft)."""

    next_ids: dict[int, int]  # batch index -> sampled token
    logprobs: dict[int, tuple[float | None, list | None]]  # batch index -> (chosen, top)
    # batch index -> list of (fill position, logprob, top) for prompt/forced tokens
    fill_logprobs: dict[int, list[tuple[int, float, list]]]
    accepted: dict[int, list[int]] = field(default_factory=dict)  # draft tokens accepted
    accepted_logprobs: dict[int, list[tuple]] = field(default_factory=dict)  # (chosen, top)
    # a sampled verified request's RNG state before the step (see rewind_generator)
    rng_states: dict[int, object] = field(default_factory=dict)
    # Filled by the scheduler between the step and postprocessing: the K/V slots of the
    # accepted draft tokens, taken out of the request until each token is applied
    # (``held``), and how many tokens postprocessing applied (``emitted``).
    held: dict[int, list[int]] = field(default_factory=dict)
    emitted: dict[int, int] = field(default_factory=dict)
    # batch index of an encode request -> the sum of its final-normed hidden states over
    # the positions this step computed (numpy float64 [hidden])
    embeddings: dict[int, object] = field(default_factory=dict)
