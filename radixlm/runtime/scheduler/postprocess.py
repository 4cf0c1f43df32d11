"""Postprocessing: what a step's results do to its requests, and how a request ends.

Per request of the step, in order: prompt/forced-token logprobs are recorded; an encode
request adds the step's sum of hidden states to its own; a prefill that ends without
sampling finishes with ``length`` (an encode request always does: its result is the mean);
the sampled token is appended, then checked against the stop tokens and
``max_new_tokens``, the grammar (accept, terminate, the close within the budget,
jump-forward) and the stop strings; an
unfinished request shares its computed K/V with the prefix cache and streams what is new.
A request whose postprocessing raises ends with a 500-style abort and spares its
neighbours.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable

from radixlm.runtime.kv_manager import KVManager
from radixlm.runtime.model_runner import ModelRunner
from radixlm.runtime.outputs import make_output
from radixlm.runtime.request import Req, ReqStatus
from radixlm.runtime.scheduler.state import SchedulerState
from radixlm.runtime.step import ForwardMode, ScheduleBatch, StepOutput

logger = logging.getLogger(__package__)

# A decoding request hands its K/V to the prefix cache every this many output tokens, so
# that concurrent requests can share what it generated.
DECODE_INSERT_INTERVAL = 64


def internal_error(message: str) -> dict:
    """The finish reason of a request that failed because of us (the server answers 500)."""
    return {"type": "abort", "message": message, "error": "internal_error", "status_code": 500}


class Postprocessor:
    """Turns a step's ``StepOutput`` into request progress, and finishes requests.

    Owns: nothing of its own; it is the only part that appends output tokens, records
    logprobs, streams, and (``finish``) takes a request out of the scheduler.
    May mutate: the stepped requests (tokens, logprobs, detokenizer, grammar state, status),
    ``state.running`` / ``state.extending`` (``process`` places the stepped requests there),
    every queue and ``by_rid`` (``finish``), ``state.stats`` (generated and forced tokens),
    and the K/V of requests through ``kv`` (cache inserts, jump-forward rollback, release).
    Returns: nothing; each request's output goes to its own ``sink``.
    Invariants: a finished request is in no queue, holds no row and has had its final output
    put on its sink exactly once; after ``process`` every unfinished request of the step is
    in ``running`` (one token lacks K/V) or ``extending`` (more lack it).
    """

    def __init__(self, config, state: SchedulerState, kv: KVManager, runner: ModelRunner,
                 tokenizer, unqueue: Callable[[Req], None]) -> None:
        """``unqueue(req)`` gives back a request's place in the admission bound."""
        self.config = config
        self.state = state
        self.stats = state.stats
        self.kv = kv
        self.runner = runner
        self.tokenizer = tokenizer
        self._unqueue = unqueue
        self.on_finish: Callable[[Req], None] | None = None  # after a request ends

    def process(self, sb: ScheduleBatch, out: StepOutput) -> None:
        for i, req in enumerate(sb.reqs):
            if req.finished:  # aborted while the step ran
                continue
            try:
                self._record_fill_logprobs(req, out.fill_logprobs.get(i, []))
                if i in out.embeddings:  # an encode request (a step from 0: the first, or again)
                    part = out.embeddings[i]
                    req.embed_sum = (part if sb.prefix_lens[i] == 0 or req.embed_sum is None
                                     else req.embed_sum + part)
                if req.kv_len == req.fill_len and not sb.sample[i]:
                    # prefill done without sampling: max_new_tokens == 0 (or budget used)
                    self.finish(req, {"type": "length", "length": len(req.output_ids)})
                    continue
                before = len(req.output_ids)
                if i in out.next_ids:
                    self._on_tokens(req, i, out)
                if req.finished:
                    continue
                if sb.mode == ForwardMode.EXTEND:
                    self.kv.cache_unfinished(req, min(req.kv_len, len(req.input_ids)))
                elif (len(req.output_ids) // DECODE_INSERT_INTERVAL
                      > before // DECODE_INSERT_INTERVAL):
                    self.kv.cache_unfinished(req, req.kv_len)  # share generated text too
                self._stream(req)
            except Exception as e:
                logger.error("request %s failed:\n%s", req.rid, traceback.format_exc())
                self.finish(req, internal_error(f"internal error: {e!r}"), insert=False)
        for slots in out.held.values():  # accepted drafts of requests that failed first
            self.kv.slots.free(slots)
        out.held.clear()
        self._place(sb.reqs)
        if not self.state.has_work():
            self.kv.check_counts(self.state.all_reqs_holding_kv())

    def _place(self, stepped: list[Req]) -> None:
        """Put this step's unfinished requests where their next step will find them:
        decoding if exactly one token lacks K/V, extending otherwise (one pass, O(batch))."""
        state = self.state
        ids = {id(r) for r in stepped}
        state.running = [r for r in state.running if id(r) not in ids]
        for req in stepped:
            if not req.finished:
                (state.running if req.pending_len == 1 else state.extending).append(req)

    def _record_fill_logprobs(self, req: Req, entries: list) -> None:
        n_input = len(req.input_ids)
        for pos, lp, top in entries:
            if pos < n_input:
                req.input_token_logprobs.append((lp, req.input_ids[pos]))
                req.input_top_logprobs.append(top)
            elif pos - n_input == len(req.output_token_logprobs):
                req.output_token_logprobs.append((lp, req.output_ids[pos - n_input]))
                req.output_top_logprobs.append(top)

    def _on_tokens(self, req: Req, i: int, out: StepOutput) -> None:
        """Apply the step's tokens for batch index ``i``: a verified request's accepted
        draft tokens, then the sampled one, each as a decode step would (and streamed as
        one), giving each accepted token its K/V slot back first (``out.held``) until the
        request finishes or jump-forward takes over; slots not given back are freed."""
        accepted = out.accepted.get(i)
        if not accepted:
            self._on_token(req, out.next_ids[i], out.logprobs[i])
            out.emitted[i] = 1
            return
        held = out.held.pop(i, [])
        tokens = accepted + [out.next_ids[i]]
        logprobs = out.accepted_logprobs[i] + [out.logprobs[i]]
        n = attached = 0
        try:
            while True:
                self._on_token(req, tokens[n], logprobs[n])
                n += 1
                if n == len(tokens) or req.finished or req.pending_len != 1:
                    break
                self._stream(req)  # the chunks a stream gets without drafts
                req.kv_slots.append(held[attached])
                attached += 1
        finally:
            self.kv.slots.free(held[attached:])
            out.emitted[i] = n

    def _on_token(self, req: Req, token: int, logprob) -> None:
        if req.first_token_at is None:
            req.first_token_at = time.perf_counter()
        req.output_ids.append(token)
        self.stats["generation_tokens_total"] += 1
        if req.logprob.return_logprob:
            req.output_token_logprobs.append((logprob[0], token))
            req.output_top_logprobs.append(logprob[1])
        if self._stop_token(req, token):
            return
        budget = req.close_within_budget  # (the length rule is the close's, below)
        if not budget and self._at_length(req):
            return
        if req.grammar is not None:
            if not req.grammar.accept_token(token):
                why = getattr(req.grammar, "error", lambda: None)()  # e.g. a mask budget
                self.finish(req, {"type": "abort", "message":
                                  why or f"token {token} violates the constraint"})
                return
            if req.grammar.is_terminated():
                self._detok_and_check(req)
                self.finish(req, {"type": "stop", "matched": None})
                return
            if budget and self._close_within_budget(req):
                return
            if not budget and self.config.enable_jump_forward and self._jump_forward(req):
                return
        self._detok_and_check(req)

    def _stop_token(self, req: Req, token: int) -> bool:
        p = req.params
        if len(req.output_ids) >= p.min_new_tokens:
            if (token in req.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
                req.detok.update(req.output_ids[:-1])
                self.finish(req, {"type": "stop", "matched": token})
                return True
        return False

    def _at_length(self, req: Req) -> bool:
        if len(req.output_ids) >= req.params.max_new_tokens:
            self._detok_and_check(req)
            if not req.finished:
                self.finish(req, {"type": "length", "length": len(req.output_ids)})
            return True
        return False

    # ------------------------------------------------------- complete_within_max_tokens
    # Invariant (from the up-front check, constraints.budget): after each token, the close
    # of the grammar's state fits in the room left. The model writes on while its tokens
    # keep it so; a token after which the close no longer fits (the next one when the room
    # is down to the close, or one that opens an object with required keys and lengthens
    # the close by many) is taken back, and the close of the state before it, which fit and
    # which the grammar kept (``Grammar.close_fits``), is forced. A document that fits the
    # budget is thus never changed.

    def _close_within_budget(self, req: Req) -> bool:
        """After the grammar took the last token: a jump-forward plan is applied if the
        close after it fits (it may retokenize a token the close alone would not fit
        after); else the token is kept if a close from it fits in the room left, or taken
        back and the close that fit before it forced. True if the request finished (forced,
        or the budget spent on a complete document)."""
        grammar = req.grammar
        if self.config.enable_jump_forward:
            plan = grammar.jump_forward(req.output_ids)
            if plan is not None and plan.token_ids:
                kept = len(req.output_ids) - plan.rollback
                if grammar.close_fits(req.params.max_new_tokens - kept - len(plan.token_ids)):
                    return self._apply_plan(req, plan)
                self._undo_plan(req, plan)
        room = req.params.max_new_tokens - len(req.output_ids)
        if grammar.close_fits(room):
            return room == 0 and self._at_length(req)  # (the close is [] then)
        grammar.rollback(1)
        self._drop_last_token(req)
        close = grammar.close_tokens()  # (the one that fit here)
        if close is None or len(close) > room + 1:
            self._cannot_close(req)
        else:
            self._force_close(req, close)
        return True

    @staticmethod
    def _undo_plan(req: Req, plan) -> None:
        """Take a jump-forward plan back off the grammar (its state after the output's
        last token again)."""
        req.grammar.rollback(len(plan.token_ids))
        for token in req.output_ids[len(req.output_ids) - plan.rollback:]:
            if not req.grammar.accept_token(token):
                raise RuntimeError("jump-forward could not restore the grammar state")

    def _drop_last_token(self, req: Req) -> None:
        """Take back the token appended last (it has no K/V yet)."""
        req.output_ids.pop()
        self.stats["generation_tokens_total"] -= 1
        del req.output_token_logprobs[len(req.output_ids):]
        del req.output_top_logprobs[len(req.output_ids):]

    def _force_close(self, req: Req, close: list[int]) -> None:
        """Write ``close`` (each token accepted by the grammar) and finish with ``length``."""
        req.closed_at = len(req.output_ids)
        for token in close:
            if not req.grammar.accept_token(token):
                raise RuntimeError(f"the grammar refused token {token} of its own close")
        req.output_ids.extend(close)
        req.forced_tokens += len(close)
        self.stats["forced_tokens_total"] += len(close)
        self._detok_and_check(req)
        if not req.finished:
            self.finish(req, {"type": "length", "length": len(req.output_ids)})

    def _cannot_close(self, req: Req) -> None:
        """The grammar found no close where it had one: a bug, never a loop."""
        name = type(req.grammar).__name__
        logger.error("request %s: grammar %s found no way to close its document", req.rid,
                     name)
        self.finish(req, {"type": "abort", "message": f"complete_within_max_tokens: the "
                          f"grammar ({name}) found no way to close the document"})

    def _detok_and_check(self, req: Req) -> None:
        before = len(req.detok.text)
        req.detok.update(req.output_ids)
        if len(req.detok.text) > before and req.detok.check_stop(before):
            self.finish(req, {"type": "stop", "matched": req.detok.matched})

    def _jump_forward(self, req: Req) -> bool:
        """Apply a forced continuation; True if the request finished while doing so."""
        plan = req.grammar.jump_forward(req.output_ids)
        if plan is None or not plan.token_ids:
            return False
        return self._apply_plan(req, plan)

    def _apply_plan(self, req: Req, plan) -> bool:
        """Write a jump-forward plan the grammar has taken (up to the length limit); True
        if the request finished."""
        if plan.rollback:
            del req.output_ids[-plan.rollback:]
            keep = len(req.output_ids)
            del req.output_token_logprobs[keep:]
            del req.output_top_logprobs[keep:]
            # the last kept token's K/V goes too when logprobs are asked for: the first
            # forced token's logprob comes from the logits at its position
            last = req.fill_len - (1 if req.logprob.return_logprob else 0)
            self.kv.truncate(req, min(req.kv_len, last))
        room = req.params.max_new_tokens - len(req.output_ids)
        forced = plan.token_ids[:room]
        req.output_ids.extend(forced)
        req.forced_tokens += len(forced)
        self.stats["forced_tokens_total"] += len(forced)
        self._detok_and_check(req)
        if not req.finished and len(req.output_ids) >= req.params.max_new_tokens:
            self.finish(req, {"type": "length", "length": len(req.output_ids)})
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

    def finish(self, req: Req, reason: dict, insert: bool = True) -> None:
        """End ``req`` with ``reason`` (a finish-reason dict): out of every queue, its K/V
        to the cache (``insert``) or freed, its final output on its sink. Any part may call
        it, for a request held or one never admitted (still in the inbox)."""
        self._unqueue(req)
        req.finish(reason)
        req.status = ReqStatus.FINISHED
        state = self.state
        for group in (state.running, state.extending, state.waiting, state.grammar_pending):
            if req in group:
                group.remove(req)
        if req.row is not None:
            self.kv.release(req, insert=insert)
        state.by_rid.pop(req.rid, None)
        self.runner.release_generator(req)
        if self.on_finish is not None:
            self.on_finish(req)
        if req.grammar_future is not None and not req.grammar_future.done():
            req.grammar_future.cancel()
        req.detok.flush(req.output_ids if reason.get("type") != "stop"
                        or not isinstance(reason.get("matched"), int)
                        else req.output_ids[:-1])
        req.sink.put(make_output(req, self.tokenizer, final=True))
