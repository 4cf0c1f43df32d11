"""Speculation: drafts for a step's requests, the step's sampling inputs, and what a
verification leaves behind.

Before a step, every request that samples at its end (decoding, or after jump-forward's
forced text) is a candidate for a draft. ``plan_budgets`` (runtime/speculative/cost.py)
splits draft tokens among them from the measured step times and each request's
acceptance so far, or, for a constrained request in a small step, the drafter's
``expected_rate`` where it has a surer draft (a JSON value copied from the prompt); none at
all where they do not pay, e.g. at a large batch; the drafter
proposes up to that many (a few requests without a draft are asked for one token, only to
compare it with the step's sample: how their rates are learned while they do not draft);
a constrained request's draft is cut at the first token its grammar forbids (accepting it
on the grammar and rolling back), or after the token from which jump-forward would force
text (postprocessing drops whatever follows it in a step), keeping the mask of every
verification row; and the
draft gets free K/V slots after the request's pending tokens (a draft never evicts the
cache and never writes outside the slots it was given).

The step then computes the pending and draft tokens together, samples a token at each
position as decoding would (``ModelRunner.sampling_inputs`` with the drafts), and accepts
the drafts the samples agree with (``sampler.accept_prefix``). ``settle`` frees the K/V of
the rejected drafts and holds the accepted ones' slots aside; postprocessing applies the
accepted tokens one by one as decode steps would (stop strings, EOS, ``max_new_tokens``,
grammar, jump-forward), giving each its slot back, and frees what it did not use. So no
K/V leaks, and the radix tree only ever receives tokens the request really produced.

No sampling feature is exempt: each verification row is processed with the request's own
state at that point (penalties counting the earlier draft tokens, ``min_new_tokens``'
banned ids, logit bias, the grammar's mask after the earlier draft tokens), so drafts are
exact for all of them (a repetition penalty counts the context once for all the rows).
A request gets no draft when it has fewer than two tokens of budget left, no room left in
the context, or no free K/V slots; a step gets none when its drafts would move it off the
kernels it runs without them (``ModelRunner.draft_room``: a native step holds 64 tokens,
so a batch of 64 decodes without drafts).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from radixlm.runtime.kv_manager import KVManager
from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.request import Req
from radixlm.runtime.scheduler.state import SchedulerState
from radixlm.runtime.speculative.cost import StepCosts, plan_budgets
from radixlm.runtime.step import ForwardMode, ScheduleBatch, StepOutput

logger = logging.getLogger(__package__)

# A request's expected acceptance rate per draft token: its decayed counts of accepted
# tokens and of rejections, plus PRIOR_WEIGHT pseudo-trials at the engine-wide rate (a
# running mean of what verifications accept, starting at ACCEPT_PRIOR).
ACCEPT_PRIOR = 0.5
PRIOR_WEIGHT = 2.0
PRIOR_EMA = 0.05
HISTORY_DECAY = 0.8  # weight of the history at each new verification of the request
MAX_RATE = 0.98
# A request that does not draft in a step (drafts did not pay at its rate) may still be
# asked for a one-token draft that is only compared with the token the step samples: a
# free check of its rate, so requests whose text starts repeating get drafts again. At most
# this many such probes per step, to the requests least observed.
PROBES_PER_STEP = 2
# A drafter's ``expected_rate`` (a draft it is sure of, e.g. a JSON value copied from the
# prompt) replaces a constrained request's rate in steps of at most this many candidates.
HINTED_CANDIDATES = 8

# Engine-wide totals (``Engine.get_stats``): verification steps (a decode step of a request
# while speculation is on, with a draft or none), tokens those steps emitted, draft tokens
# verified, draft tokens accepted.
SPEC_STATS = ("spec_verify_ct_total", "spec_emitted_tokens_total", "spec_draft_tokens_total",
              "spec_accepted_tokens_total")


class Speculation:
    """Drafts before a step, the step's model call, and the verification's bookkeeping.

    Owns: the drafter (None: speculation off), the step-cost measurements, the
    engine-wide acceptance rate, and between ``attach`` and ``forward`` the grammar masks
    of the verification rows.
    May mutate: ``sb.drafts`` (``attach``, ``withdraw``); the drafted requests' K/V through
    ``kv`` (slots for drafts; ``settle`` frees the rejected ones and moves the accepted
    ones' into ``StepOutput.held``); their speculation counters; ``state.stats`` (the
    ``SPEC_STATS`` totals); a request's grammar only transiently (every token ``attach``
    accepts on it is rolled back before it returns); RNG states (``after``).
    Returns: ``forward`` the step's ``StepOutput``.
    Invariants: after ``attach`` a drafted request holds exactly ``len(draft)`` slots past
    its pending tokens, taken from free slots; after ``settle`` it holds none past its
    accepted tokens, and ``held`` plus its slots are what it had less the rejected ones;
    ``withdraw`` returns a batch to what admission or retraction made of it.
    """

    def __init__(self, config, state: SchedulerState, kv: KVManager, runner: ModelRunner,
                 grammar_backend, drafter) -> None:
        self.config, self.state, self.kv, self.runner = config, state, kv, runner
        self.grammar_backend, self.drafter = grammar_backend, drafter
        self.costs = StepCosts()
        self.prior = ACCEPT_PRIOR
        self.vocab_size = runner.vocab_size
        self.bitmask_words = (runner.vocab_size + 31) // 32
        self.max_context = int(runner.pool.req_to_token.shape[1])
        self._masks: dict[int, np.ndarray] = {}  # batch index -> its verification rows
        self._verifying: list[int] = []  # batch indices of this step's candidates
        self._probes: dict[int, int] = {}  # batch index -> a probe's one draft token
        self._started = 0.0
        if drafter is not None:  # the totals exist where speculation is on
            for key in SPEC_STATS:
                state.stats.setdefault(key, 0)

    # ------------------------------------------------------------------ before the step
    def attach(self, sb: ScheduleBatch) -> None:
        """Give the step's candidates the drafts that pay (``sb.drafts``; slots taken)."""
        self._started = time.perf_counter()
        self._masks, self._verifying, self._probes = {}, [], {}
        if self.drafter is None:
            return
        cands = [i for i, req in enumerate(sb.reqs) if self._candidate(sb, i, req)]
        self._verifying = cands
        room = self.runner.draft_room(sum(sb.extend_lens)) if cands else 0
        if room <= 0:
            return
        reqs = [sb.reqs[i] for i in cands]
        budgets = plan_budgets(self.costs, sum(sb.extend_lens), sum(sb.sample),
                               self._rates(reqs), [self._limit(r) for r in reqs],
                               max_extra=room)
        sb.drafts = [[] for _ in sb.reqs]  # filled in place: withdraw finds what is there
        for i, req, budget in zip(cands, reqs, budgets):
            if budget:
                sb.drafts[i] = self._draft(req, budget, i)
        if not any(sb.drafts):
            sb.drafts = None
        self._probe(sb, [i for i, b in zip(cands, budgets) if not b])

    def _probe(self, sb: ScheduleBatch, idle: list[int]) -> None:
        """Ask the least observed requests without a draft for one draft token each, to
        be compared with what the step samples (``settle``)."""
        idle.sort(key=lambda i: sb.reqs[i].spec_hits + sb.reqs[i].spec_misses)
        for i in idle[:PROBES_PER_STEP]:  # constrained ones too: compared, never verified
            try:
                draft = self.drafter.propose(sb.reqs[i], 1)
            except Exception:
                logger.warning("drafter failed for %s", sb.reqs[i].rid, exc_info=True)
                continue
            if draft and type(draft[0]) is int:
                self._probes[i] = draft[0]

    @staticmethod
    def _candidate(sb: ScheduleBatch, i: int, req: Req) -> bool:
        """Samples at the end of this step, after output tokens (not a prompt's end)."""
        return (sb.sample[i] and bool(req.output_ids) and not req.finished
                and sb.prefix_lens[i] + sb.extend_lens[i] == req.fill_len == req.kv_len)

    def _rates(self, reqs: list[Req]) -> list[float]:
        """Each candidate's rate; a constrained one's the drafter's ``expected_rate`` where
        it gives one (in steps of up to ``HINTED_CANDIDATES``)."""
        rates = [self._rate(r) for r in reqs]
        hint = getattr(self.drafter, "expected_rate", None)
        if hint is None or len(reqs) > HINTED_CANDIDATES:
            return rates
        for j, req in enumerate(reqs):
            if req.grammar is None:
                continue
            try:
                rate = hint(req)
            except Exception:
                logger.warning("drafter failed for %s", req.rid, exc_info=True)
                continue
            if isinstance(rate, float) and 0.0 <= rate <= 1.0:
                rates[j] = min(rate, MAX_RATE)
        return rates

    def _rate(self, req: Req) -> float:
        """Expected probability that the request's next draft token is accepted."""
        hits, trials = req.spec_hits, req.spec_hits + req.spec_misses
        return min((hits + PRIOR_WEIGHT * self.prior) / (trials + PRIOR_WEIGHT), MAX_RATE)

    def _limit(self, req: Req) -> int:
        """The most draft tokens the request can use: the setting, its output budget less
        the token the step samples anyway, and the context left after its tokens."""
        budget = req.params.max_new_tokens - len(req.output_ids) - 1
        return max(min(self.config.speculative_num_draft_tokens, budget,
                       self.max_context - req.kv_len), 0)

    def _draft(self, req: Req, budget: int, i: int) -> list[int]:
        """Up to ``budget`` draft tokens for ``req``, checked, with slots; [] for none."""
        try:
            draft = self.drafter.propose(req, budget)
        except Exception:  # the drafter's bug: this request decodes without a draft
            logger.warning("drafter failed for %s: no draft", req.rid, exc_info=True)
            return []
        if not isinstance(draft, list) or not all(
                type(t) is int and 0 <= t < self.vocab_size for t in draft):
            logger.warning("drafter proposed something other than token ids for %s: dropped",
                           req.rid)
            return []
        draft = draft[:min(budget, self.kv.slots.num_free)]
        if draft and req.grammar is not None:
            draft = self._check_grammar(req, draft, i)
        if not draft or not self.kv.extend_free(req, len(draft)):
            self._masks.pop(i, None)
            return []
        return draft

    def _check_grammar(self, req: Req, draft: list[int], i: int) -> list[int]:
        """The draft up to the first token the request's grammar forbids (or that ends the
        grammar: no row may follow its end), or through the first token after which the
        grammar forces text (jump-forward takes over there and the rest would be dropped),
        and each verification row's mask, filled at the grammar's state after the draft
        tokens before it; the grammar is left as it was."""
        grammar = req.grammar
        forced = getattr(grammar, "forced_text", None) if self.config.enable_jump_forward \
            else None
        masks = np.empty((len(draft) + 1, self.bitmask_words), dtype=np.int32)
        advanced = keep = 0
        try:
            for j, tok in enumerate(draft):
                grammar.fill_bitmask(masks, j)
                if not (int(masks[j, tok >> 5]) >> (tok & 31)) & 1:
                    break
                if not grammar.accept_token(tok):
                    break
                advanced += 1
                if grammar.is_terminated():
                    break
                keep = advanced
                if forced is not None and keep < len(draft) and len(forced()) >= 2:
                    grammar.fill_bitmask(masks, keep)
                    break
            else:
                grammar.fill_bitmask(masks, len(draft))
        except Exception:  # a grammar failing here fails its request in the plain step
            logger.warning("grammar check of a draft for %s failed: no draft", req.rid,
                           exc_info=True)
            keep = 0
        finally:
            if advanced:
                grammar.rollback(advanced)
        if keep:
            self._masks[i] = masks[:keep + 1]
        return draft[:keep]

    # ------------------------------------------------------------------ the step
    def forward(self, sb: ScheduleBatch) -> StepOutput:
        """Run the step: sampling inputs (a verified request's rows with their masks) and
        the model."""
        runner = self.runner
        idx = [i for i, s in enumerate(sb.sample) if s]
        if not idx:
            return runner.forward(sb, None)
        sampled = [sb.reqs[i] for i in idx]
        drafts = [sb.drafts[i] for i in idx] if sb.drafts else None
        inputs = runner.sampling_inputs(sampled, [runner.generator(r) for r in sampled],
                                        self._bitmask(idx, sampled, drafts), drafts)
        return runner.forward(sb, inputs)

    def _bitmask(self, idx: list[int], sampled: list[Req], drafts) -> np.ndarray | None:
        """The grammar masks of the sampled rows (None: no request is constrained)."""
        if not any(r.grammar is not None for r in sampled):
            return None
        sizes = [1 + len(d) for d in drafts] if drafts else [1] * len(sampled)
        mask = np.full((sum(sizes), self.bitmask_words), -1, dtype=np.int32)
        pairs, row = [], 0
        for i, req, size in zip(idx, sampled, sizes):
            if i in self._masks:  # a verified request: its rows were filled with its draft
                mask[row:row + size] = self._masks[i]
            elif req.grammar is not None:
                pairs.append((req.grammar, row))
            row += size
        if pairs and self.grammar_backend is not None:  # may fill the batch in parallel
            self.grammar_backend.fill_bitmasks(pairs, mask)
        else:
            for grammar, r in pairs:
                grammar.fill_bitmask(mask, r)
        return mask

    def withdraw(self, sb: ScheduleBatch) -> None:
        """The step failed: give back the drafts' slots (the step runs again without)."""
        for req, draft in zip(sb.reqs, sb.drafts or ()):
            if draft and not req.finished:
                self.kv.truncate(req, req.kv_len - len(draft))
        sb.drafts = None
        self._masks = {}

    # ------------------------------------------------------------------ after the step
    def settle(self, sb: ScheduleBatch, out: StepOutput) -> None:
        """Record the step's time; free the rejected drafts' K/V, hold the accepted ones'
        slots in ``out.held`` for postprocessing, count, tell the drafter; learn from the
        probes."""
        seconds = time.perf_counter() - self._started
        drafted = sum(len(d) for d in sb.drafts) if sb.drafts else 0
        if drafted or sb.mode == ForwardMode.DECODE:
            self.costs.record(sum(sb.extend_lens) + drafted, bool(drafted), seconds)
        self._masks = {}
        for i in self._verifying:
            sb.reqs[i].spec_verify_ct += 1
        if self._verifying:
            self.state.stats["spec_verify_ct_total"] += len(self._verifying)
        for i, draft in enumerate(sb.drafts or ()):
            req = sb.reqs[i]
            if not draft or req.finished:
                continue
            m = len(out.accepted.get(i, ()))
            kept = req.kv_len - len(draft) + m
            self.kv.truncate(req, kept)
            out.held[i] = self.kv.detach(req, kept - m)
            self._count(req, len(draft), m)
            self.drafter.observe(req, len(draft), m)
        for i, token in self._probes.items():  # a probe: would its token have been taken?
            if i in out.next_ids:
                self._learn(sb.reqs[i], 1, int(out.next_ids[i] == token))

    def _learn(self, req: Req, drafted: int, accepted: int) -> None:
        """A draft of ``drafted`` tokens of which the model would take ``accepted``."""
        rejected = 1.0 if accepted < drafted else 0.0
        req.spec_hits = HISTORY_DECAY * req.spec_hits + accepted
        req.spec_misses = HISTORY_DECAY * req.spec_misses + rejected
        self.prior += PRIOR_EMA * (accepted / (accepted + rejected) - self.prior)

    def _count(self, req: Req, drafted: int, accepted: int) -> None:
        req.spec_draft_token_num += drafted
        req.spec_accept_token_num += accepted
        self._learn(req, drafted, accepted)
        stats = self.state.stats
        stats["spec_draft_tokens_total"] += drafted
        stats["spec_accepted_tokens_total"] += accepted

    def after(self, sb: ScheduleBatch, out: StepOutput) -> None:
        """Postprocessing applied the tokens: leave each sampled verified request's RNG
        one draw per token it emitted past where the step began; count what the
        verification steps emitted."""
        if self._verifying:
            self.state.stats["spec_emitted_tokens_total"] += sum(out.emitted.get(i, 0)
                                                                 for i in self._verifying)
            self._verifying = []
        for i, state in out.rng_states.items():
            req = sb.reqs[i]
            if not req.finished:
                self.runner.rewind_generator(req, state, out.emitted.get(i, 1))

    def release(self, req: Req) -> None:
        """``req`` finished: the drafter forgets it."""
        if self.drafter is not None:
            self.drafter.release(req)
