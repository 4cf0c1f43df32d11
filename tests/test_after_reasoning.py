"""Grammar after reasoning (``constraints/after_reasoning.py``) on a fake vocabulary and a
fake inner grammar (an exact literal), then on the real tokenizer with llguidance and
outlines grammars: where the inner grammar starts, how the end tag is found however the
tokenizer splits it, what the thinking block may not contain, the budget's forced end tag
(by mask and by jump-forward), and rollback / copy against replaying the same tokens."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest

from radixlm.constraints.after_reasoning import AfterReasoningGrammar, ThinkingVocab
from radixlm.constraints.base import Grammar, JumpForward
from radixlm.constraints.reasoning import ANSWER, OPENING, REASONING, ReasoningParser, get_format
from radixlm.constraints.vocab import TokenVocab

PIECES = ["<", "/", "think", ">", "</", "</think>", ">\n\n", "a", "b", " ", "{", "}",
          "<think>", "x</think>y", "\n", "th", "ink>", "<think>\nhm", "ab", "}\n"]
EOS, TOOL = 30, 31  # special tokens: no bytes of their own
SPECIAL = {"<|im_end|>": EOS, "<tool_call>": TOOL}
VOCAB_SIZE = 40
ID = {p: i for i, p in enumerate(PIECES)}


class FakeTokenizer:
    """Greedy longest-match over PIECES (and the special texts); a character no piece
    starts with is dropped."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if text in SPECIAL:
            return [SPECIAL[text]]
        out, i = [], 0
        while i < len(text):
            best = max((p for p in PIECES if text.startswith(p, i)), key=len, default="")
            if best:
                out.append(ID[best])
            i += len(best) or 1
        return out


VOCAB = TokenVocab({i: p.encode() for i, p in enumerate(PIECES)}, frozenset(SPECIAL.values()),
                   "fake")


class Literal(Grammar):
    """The answer must be exactly ``target`` (bytes), then EOS. ``jump``: jump_forward
    writes the whole rest at once."""

    def __init__(self, target: str, jump: bool = False, merge: bool = False) -> None:
        self.target, self.jump, self.merge = target.encode(), jump, merge
        self.done: list[int] = []
        self.eos = False

    def _pos(self) -> int:
        return sum(len(VOCAB.id_to_bytes[t]) for t in self.done)

    def fill_bitmask(self, bitmask, row):
        rest = self.target[self._pos():]
        ok = [t for t, b in VOCAB.id_to_bytes.items() if rest.startswith(b)]
        ok += [EOS] if not rest and not self.eos else []
        bitmask[row] = SHARED.row(ok)

    def accept_token(self, token_id):
        if self.eos:
            return False
        if token_id == EOS:
            self.eos = self._pos() == len(self.target)
            return self.eos
        b = VOCAB.id_to_bytes.get(token_id)
        if b is None or not self.target[self._pos():].startswith(b):
            return False
        self.done.append(token_id)
        return True

    def rollback(self, num_tokens):
        if num_tokens and self.eos:
            self.eos, num_tokens = False, num_tokens - 1
        del self.done[len(self.done) - num_tokens:]

    def is_terminated(self):
        return self.eos

    def is_accepting(self):
        return self._pos() == len(self.target)

    def jump_forward(self, output_ids):
        """The rest at once; with ``merge``, the last token retokenized with it (a plan
        that rolls one token back, as a canonical retokenization of the boundary does)."""
        back = 1 if self.merge and self.done else 0
        start = self._pos() - len(VOCAB.id_to_bytes[self.done[-1]]) if back else self._pos()
        rest = self.target[self._pos():].decode()
        if not self.jump or len(rest) < 1:
            return None
        ids = FakeTokenizer().encode(self.target[start:].decode())
        del self.done[len(self.done) - back:]
        self.done.extend(ids)
        return JumpForward(back, ids, rest)

    def copy(self):
        g = Literal(self.target.decode(), self.jump, self.merge)
        g.done, g.eos = list(self.done), self.eos
        return g


SHARED = ThinkingVocab(FakeTokenizer(), VOCAB, VOCAB_SIZE, [EOS], get_format("qwen3"))


def allowed(g: Grammar) -> set[int]:
    mask = np.zeros((1, SHARED.words), dtype=np.int32)
    g.fill_bitmask(mask, 0)
    bits = np.unpackbits(mask[0].view(np.uint8), bitorder="little")
    return {i for i in range(VOCAB_SIZE) if bits[i]}


def feed(g: Grammar, *pieces) -> None:
    for p in pieces:
        token = p if isinstance(p, int) else ID[p]
        assert g.accept_token(token), p


def text_of(ids: list[int]) -> str:
    return "".join(PIECES[t] if t < len(PIECES) else "" for t in ids)


def test_inside_the_block_only_tag_crossing_tokens_and_eos_are_forbidden():
    g = AfterReasoningGrammar(SHARED, Literal("{ab}"), start=REASONING)
    everything = set(range(VOCAB_SIZE))
    # "x</think>y" would carry answer text past the tag; EOS would leave the answer empty
    assert allowed(g) == everything - {ID["x</think>y"], EOS}
    feed(g, "a", "</", "think")  # the end tag split over tokens, not yet complete
    assert allowed(g) == everything - {ID[">\n\n"], ID["x</think>y"], EOS}
    assert g.jump_forward([]) is None  # never inside the block
    feed(g, ">")
    assert g.in_answer and allowed(g) == {ID["{"]}
    feed(g, "{", "ab", "}", EOS)
    assert g.is_terminated()


def test_end_tag_however_it_is_split():
    for pieces in (["</think>"], ["</", "think", ">"], ["<", "/", "th", "ink>"],
                   ["a", "<", "</", "think", ">"]):
        g = AfterReasoningGrammar(SHARED, Literal("ab"), start=REASONING)
        feed(g, *pieces)
        assert g.in_answer, pieces
        feed(g, "ab")
        assert g.is_accepting()


def test_without_an_inner_grammar_nothing_is_forbidden_and_eos_ends_it():
    g = AfterReasoningGrammar(SHARED, None, start=REASONING, budget=5)
    assert allowed(g) == set(range(VOCAB_SIZE))
    feed(g, "a", EOS)
    assert g.is_terminated()


def test_with_ignore_eos_eos_is_one_more_token_without_an_inner_grammar():
    """A budget alone for a request with ignore_eos: EOS, inside the block or in the answer,
    ends nothing (the request runs to max_new_tokens)."""
    g = AfterReasoningGrammar(SHARED, None, start=REASONING, budget=5, eos_ends=False)
    feed(g, "a", EOS, "</think>", EOS, "b", EOS)
    assert g.in_answer and not g.is_terminated()
    assert allowed(g.copy()) == set(range(VOCAB_SIZE))


def test_eos_inside_the_block_when_the_answer_may_be_empty():
    g = AfterReasoningGrammar(SHARED, Literal(""), start=REASONING)
    assert EOS in allowed(g)
    feed(g, "a", EOS)
    assert g.is_terminated()


@pytest.mark.parametrize("jump", [False, True])
def test_budget_forces_the_end_tag(jump):
    g = AfterReasoningGrammar(SHARED, Literal("{ab}", jump=True), start=REASONING, budget=3)
    feed(g, "a", "b")
    assert g.phase == g.REASONING
    feed(g, " ")
    assert g.phase == g.CLOSING and allowed(g) == {ID["</think>"]}
    if jump:
        plan = g.jump_forward([])
        assert plan.token_ids == [ID["</think>"]] and plan.rollback == 0
    else:
        feed(g, "</think>")
    assert g.in_answer
    plan = g.jump_forward([])  # the inner grammar's own forced text, in the answer
    assert plan.text == "{ab}"
    assert allowed(g) == {EOS}


def test_budget_finishes_an_end_tag_the_model_had_begun():
    g = AfterReasoningGrammar(SHARED, Literal("ab"), start=REASONING, budget=2)
    feed(g, "a", "</")  # "</" is the tag's start: the forced part is "think>"
    assert g.phase == g.CLOSING and g.close == (ID["think"], ID[">"])
    feed(g, "think", ">")
    assert g.in_answer
    parser = ReasoningParser(get_format("qwen3"), start=REASONING)
    assert parser.parse(text_of([ID["a"], ID["</"], ID["think"], ID[">"]])) == ("a", "")


def test_a_closed_block_in_the_prompt_starts_the_answer():
    g = AfterReasoningGrammar(SHARED, Literal("{ab}"), start=ANSWER, budget=4)
    assert allowed(g) == {ID["{"]}  # no block may open: thinking was turned off
    feed(g, "{", "ab", "}", EOS)
    assert g.is_terminated()


def test_budget_zero():
    g = AfterReasoningGrammar(SHARED, Literal("ab"), start=REASONING, budget=0)
    assert allowed(g) == {ID["</think>"]}
    g = AfterReasoningGrammar(SHARED, Literal("ab"), start=OPENING, budget=0)
    assert allowed(g) == {ID["a"], ID["ab"]}  # no block may open


def test_opening_either_the_answer_or_the_start_tag():
    g = AfterReasoningGrammar(SHARED, Literal("{ab}"), start=OPENING, budget=4)
    starts = {ID["<"], ID["<think>"], ID["<think>\nhm"]}
    assert allowed(g) == {ID["{"]} | starts
    answer = g.copy()
    feed(answer, "{")
    assert answer.in_answer and not answer.had_block
    feed(g, "<")  # committed to the start tag: only its continuation
    assert allowed(g) == {ID["think"], ID["th"]}
    feed(g, "th", "ink>")
    assert g.phase == g.REASONING and g.thought == 0  # the start tag is not counted
    long = AfterReasoningGrammar(SHARED, Literal("{ab}"), start=OPENING, budget=4)
    feed(long, "<think>\nhm")  # runs on into the block: one reasoning token
    assert long.phase == long.REASONING and long.thought == 1


def test_strict_thinking_excludes_end_of_turn_tool_tags_and_an_empty_answer():
    g = AfterReasoningGrammar(SHARED, None, start=REASONING, strict=True)
    assert allowed(g) == set(range(VOCAB_SIZE)) - {EOS, TOOL}
    assert not g.accept_token(TOOL) and not g.accept_token(EOS)
    feed(g, "a", "</think>")
    assert EOS not in allowed(g)  # reasoning but no answer
    assert not g.accept_token(EOS)
    feed(g, "b", EOS)
    assert g.is_terminated()


def reasoning_tokens(pieces: list[bytes], fmt, start_at: str) -> int:
    """Tokens whose bytes overlap the thinking block's text (after its start tags, before
    its end tag), counted from the output alone (the budget's bound)."""
    raw = b"".join(pieces)
    start, end = fmt.start.encode(), fmt.end.encode()
    pos = 0
    if start_at == ANSWER:
        return 0
    if start_at == OPENING:
        if not raw.startswith(start):
            return 0
        pos = len(start)
    while raw.startswith(start, pos):
        pos += len(start)
    stop = raw.find(end, pos)
    stop = len(raw) if stop < 0 else stop
    count, at = 0, 0
    for b in pieces:
        if b and at < stop and at + len(b) > pos:
            count += 1
        at += len(b)
    return count


def _walk(make, rng: random.Random, steps: int) -> tuple[list[int], Grammar]:
    g, ids = make(), []
    for _ in range(steps):
        if g.is_terminated():
            break
        ok = sorted(allowed(g))
        if not ok:
            break
        token = rng.choice(ok)
        assert g.accept_token(token), token
        ids.append(token)
        if rng.random() < 0.2:
            plan = g.jump_forward(ids)
            if plan is not None:
                del ids[len(ids) - plan.rollback:]
                ids.extend(plan.token_ids)
    return ids, g


def _same_state(a: Grammar, b: Grammar) -> None:
    assert allowed(a) == allowed(b)
    assert a.is_terminated() == b.is_terminated()
    assert a._state() == b._state()


@pytest.mark.parametrize("seed", range(40))
def test_rollback_and_copy_equal_replaying_the_tokens(seed):
    rng = random.Random(seed)
    budget = rng.choice([None, 0, 1, 2, 4])
    start, strict = rng.choice([REASONING, OPENING, ANSWER]), rng.random() < 0.3
    inner = rng.choice([None, "{ab}", "ab"])

    def make():
        return AfterReasoningGrammar(SHARED, Literal(inner, jump=True) if inner else None,
                                     start, budget, strict)

    ids, g = _walk(make, rng, 12)
    if budget is not None:  # the budget holds on every walk
        pieces = [VOCAB.id_to_bytes.get(t, b"") for t in ids]
        assert reasoning_tokens(pieces, get_format("qwen3"), start) <= budget
    c = g.copy()
    _same_state(c, g)
    back = rng.randint(0, len(ids))
    g.rollback(back)
    replay = make()
    for t in ids[:len(ids) - back]:
        assert replay.accept_token(t)
    _same_state(g, replay)
    for t in ids[len(ids) - back:]:  # and forward again to where the copy stands
        assert g.accept_token(t)
    _same_state(g, c)


def test_inner_jump_forward_that_rolls_back_then_wrapper_rollback():
    g = AfterReasoningGrammar(SHARED, Literal("ab}", jump=True, merge=True), start=REASONING)
    feed(g, "</think>", "a")
    plan = g.jump_forward([ID["</think>"], ID["a"]])
    assert plan.rollback == 1 and plan.token_ids == [ID["ab"], ID["}"]]
    assert allowed(g) == {EOS}
    g.rollback(2)  # both tokens of the plan: back to just after the tag
    replay = AfterReasoningGrammar(SHARED, Literal("ab}"), start=REASONING)
    feed(replay, "</think>")
    _same_state(g, replay)
    assert allowed(g) == {ID["a"], ID["ab"]}
    feed(g, "ab")
    plan = g.jump_forward([ID["</think>"], ID["ab"]])
    assert plan.rollback == 1 and plan.token_ids == [ID["ab"], ID["}"]]
    g.rollback(3)  # the output is 3 tokens long again: back to the start
    _same_state(g, AfterReasoningGrammar(SHARED, Literal("ab}"), start=REASONING))


def test_refused_token_leaves_the_state_alone():
    g = AfterReasoningGrammar(SHARED, Literal("ab"), start=REASONING)
    before = g._state()
    assert not g.accept_token(ID["x</think>y"])
    assert g._state() == before
    feed(g, "</think>")
    assert not g.accept_token(ID["{"])
    assert g.in_answer and allowed(g) == {ID["a"], ID["ab"]}


# ---------------------------------------------------------------- real tokenizer


SCHEMA = {"type": "object", "properties": {
    "n": {"type": "integer", "minimum": 0, "maximum": 99},
    "ok": {"type": "boolean"}, "tag": {"enum": ["x", "y"]}},
    "required": ["n", "ok", "tag"]}


@pytest.fixture(scope="module", params=["llguidance", "outlines"])
def backend(request, tokenizer):
    from radixlm.constraints import create_grammar_backend

    b = create_grammar_backend(tokenizer, vocab_size=len(tokenizer),
                               eos_token_ids=[tokenizer.eos_token_id], backend=request.param)
    yield b
    b.shutdown()


@pytest.mark.parametrize("jump", [True, False])
def test_random_walks_on_the_real_tokenizer_keep_the_budget_and_the_schema(backend, tokenizer,
                                                                           jump):
    """Sample uniformly among the allowed tokens (the harshest model there is): the block
    ends within the budget and the answer is valid JSON under the schema, every time, with
    the end tag forced by jump-forward or by the mask alone."""
    from radixlm.constraints.after_reasoning import ReasoningGrammars, ReasoningSpec
    from radixlm.constraints.specs import ConstraintSpec

    fmt = get_format("deepseek-r1")
    grammars = ReasoningGrammars(backend, fmt)
    spec = ConstraintSpec("json_schema", json.dumps(SCHEMA, separators=(",", ":")))
    assert len(tokenizer.encode("</think>", add_special_tokens=False)) == 3  # "</" "think" ">"
    rng = np.random.default_rng(0)
    bits_to_ids = np.arange(backend.words * 32)
    for case in range(12):
        budget = int(rng.integers(0, 12))
        g = grammars.compile_async(ReasoningSpec(spec, REASONING, budget)).result()
        ids: list[int] = []
        while not g.is_terminated() and len(ids) < budget + 80:
            mask = np.zeros((1, backend.words), dtype=np.int32)
            g.fill_bitmask(mask, 0)
            ok = bits_to_ids[np.unpackbits(mask[0].view(np.uint8), bitorder="little") == 1]
            ok = ok[ok < len(tokenizer)]
            token = int(rng.choice(ok))
            assert g.accept_token(token)
            ids.append(token)
            plan = g.jump_forward(ids) if jump else None
            if plan is not None:
                del ids[len(ids) - plan.rollback:]
                ids.extend(plan.token_ids)
        assert g.is_terminated(), case
        if ids[-1] == tokenizer.eos_token_id:
            ids.pop()
        reasoning, answer = ReasoningParser(fmt, REASONING).parse(tokenizer.decode(ids))
        pieces = [backend.vocab.id_to_bytes.get(t, b"") for t in ids]
        assert reasoning_tokens(pieces, fmt, REASONING) <= budget
        assert reasoning is not None and "</think>" in tokenizer.decode(ids)
        jsonschema.validate(json.loads(answer), SCHEMA)


@pytest.fixture(scope="module", params=[True, False], ids=["jump", "no-jump"])
def r1_engine(request):
    """The real small model with DeepSeek-R1's parser: its template opens no block, and R1
    starts inside one; "</think>" is three tokens of its tokenizer."""
    from radixlm.runtime.engine import Engine

    with Engine(reasoning_parser="deepseek-r1", enable_jump_forward=request.param,
                max_total_tokens=8192, log_level="warning") as engine:
        yield engine


@pytest.mark.parametrize("budget", [0, 1, 9, 30])
def test_real_model_thinks_within_budget_then_answers_under_the_constraint(r1_engine, budget):
    import re

    tok, fmt = r1_engine.tokenizer, get_format("deepseek-r1")
    prompt = tok.apply_chat_template([{"role": "user", "content": "Is 7 prime? Think."}],
                                     tokenize=False, add_generation_prompt=True)
    regex = r"(yes|no), [0-9]{1,3}"
    outs = r1_engine.generate([prompt] * 3, [
        {"max_new_tokens": budget + 40, "temperature": 0.8, "seed": s, "thinking_budget": budget,
         **({"regex": regex} if s % 2 else {"json_schema": json.dumps(SCHEMA)})}
        for s in range(3)])
    for s, out in enumerate(outs):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", out
        reasoning, answer = ReasoningParser(fmt).parse(out["text"])
        pieces = [tok.convert_tokens_to_string([t]).encode() for t in
                  tok.convert_ids_to_tokens(out["output_ids"])]
        assert reasoning_tokens(pieces, fmt, REASONING) <= budget
        assert reasoning is not None and out["text"].startswith(reasoning + "</think>")
        if s % 2:
            assert re.fullmatch(regex, answer), answer
        else:
            jsonschema.validate(json.loads(answer), SCHEMA)
    jumped = any(o["meta_info"].get("forced_tokens") for o in outs)
    assert jumped == r1_engine.config.enable_jump_forward  # the end tag, the JSON keys


def test_real_model_no_constraint_budget_only(r1_engine):
    out = r1_engine.generate("Count.", {"max_new_tokens": 30, "thinking_budget": 4,
                                        "temperature": 0.0, "ignore_eos": True})
    ids = out["output_ids"]
    end = r1_engine.tokenizer.encode("</think>", add_special_tokens=False)
    at = next(i for i in range(len(ids)) if ids[i:i + len(end)] == end)
    assert at <= 4 and len(ids) == 30  # then the answer runs free
