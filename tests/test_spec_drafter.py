"""The NGRAM drafter: prompt lookup over a request's own tokens (against a brute-force
reference), its incremental index (against a fresh one, through rollbacks), the radix tree as
a second source, and the per-request draft-length / stop-drafting policy."""

from __future__ import annotations

import copy
import random

import pytest

from radixlm.radix import NoSharingCache, RadixCache
from radixlm.runtime.request import LogprobOptions, Req
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.speculative.lookup import NgramIndex
from radixlm.runtime.speculative.ngram import NgramDrafter
from radixlm.runtime.speculative.policy import DraftBudget, DraftPolicy
from radixlm.runtime.speculative.text import TextLookup, text_codec


def make_req(input_ids: list[int], output_ids: list[int] | None = None,
             max_new_tokens: int = 1000) -> Req:
    """A real ``Req`` (the drafter reads uid, input_ids, output_ids, params)."""
    req = Req(rid="r", input_ids=list(input_ids),
              params=SamplingParams.from_dict({"max_new_tokens": max_new_tokens}),
              logprob=LogprobOptions(), detok=None, sink=None)
    req.output_ids = list(output_ids or [])
    return req


def radix() -> RadixCache:
    return RadixCache(lambda slots: None)


def reference_draft(tokens: list[int], k: int, min_match: int, max_match: int) -> list[int]:
    """Brute force: the longest suffix (max_match..min_match tokens) that ends earlier at
    some e < n, the latest such e, and the k tokens from e on (the span to the end repeats)."""
    n = len(tokens)
    for length in range(min(max_match, n - 1), min_match - 1, -1):
        suffix = tokens[n - length:]
        ends = [e for e in range(length, n) if tokens[e - length:e] == suffix]
        if ends:
            e = ends[-1]
            draft = tokens[e:e + k]
            while len(draft) < k:
                draft.append(draft[len(draft) - (n - e)])
            return draft
    return []


# ---------------------------------------------------------------------- prompt lookup


def test_lookup_proposes_what_followed_the_suffix_most_recent_first() -> None:
    index = NgramIndex(min_match=2, max_match=4)
    index.extend([1, 2, 3, 4, 5, 9, 1, 2, 7, 8, 0, 1, 2])
    assert index.propose(3) == [7, 8, 0]  # [1, 2] ended twice: the later one wins
    assert index.match_len == 2
    index.extend([7])
    assert index.propose(2) == [8, 0] and index.match_len == 3  # [1, 2, 7]: longer match
    index.extend([5])  # [7, 5] never occurred, nor would [5] alone count (min_match 2)
    assert index.propose(4) == [] and index.match_len == 0


def test_lookup_prefers_a_longer_match_over_a_more_recent_one() -> None:
    index = NgramIndex(min_match=1, max_match=3)
    index.extend([5, 6, 7, 1, 9, 9, 7, 2, 5, 6, 7])
    assert index.propose(1) == [1]  # [5, 6, 7] ended at 3; [7] alone last ended at 7


def test_lookup_repeats_a_loop_that_runs_into_the_end() -> None:
    index = NgramIndex(min_match=2, max_match=4)
    index.extend([4, 1, 2, 3, 1, 2])
    assert index.propose(7) == [3, 1, 2, 3, 1, 2, 3]
    assert NgramIndex(1, 2).propose(3) == []  # empty


@pytest.mark.parametrize("seed", range(25))
def test_lookup_agrees_with_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    min_match, max_match = rng.choice([(1, 1), (1, 4), (2, 5), (3, 3)])
    index = NgramIndex(min_match, max_match, max_candidates=10**6)
    tokens: list[int] = []
    for _ in range(120):
        step = [rng.randrange(3 if seed % 2 else 6) for _ in range(rng.randrange(1, 4))]
        tokens += step
        index.extend(step)
        k = rng.randrange(1, 9)
        assert index.propose(k) == reference_draft(tokens, k, min_match, max_match)


@pytest.mark.parametrize("seed", range(10))
def test_truncate_undoes_the_index_exactly(seed: int) -> None:
    rng = random.Random(seed)
    index = NgramIndex(2, 6)
    for _ in range(40):
        if len(index) and rng.random() < 0.3:
            index.truncate(rng.randrange(len(index) + 1))
        else:
            index.extend([rng.randrange(4) for _ in range(rng.randrange(1, 6))])
        fresh = NgramIndex(2, 6)
        fresh.extend(list(index.tokens))
        assert (index.heads, index.prev) == (fresh.heads, fresh.prev)


def test_lookup_rejects_bad_windows() -> None:
    with pytest.raises(ValueError, match="min_match"):
        NgramIndex(0, 3)
    with pytest.raises(ValueError, match="max_match"):
        NgramIndex(4, 3)
    with pytest.raises(ValueError, match="max_candidates"):
        NgramIndex(1, 3, max_candidates=0)
    with pytest.raises(ValueError, match="max_draft_tokens"):
        NgramDrafter(radix(), max_draft_tokens=0)
    with pytest.raises(ValueError, match="min_match"):
        NgramDrafter(radix(), min_match=5, max_match=2)


# ---------------------------------------------------------------------- policy


def test_budget_grows_on_full_acceptance_and_aims_past_a_partial_one() -> None:
    budget = DraftBudget(DraftPolicy(max_tokens=10, initial=3))
    assert budget.allowed(0) == 3
    budget.update(3, 3, 0)
    assert budget.length == 6
    budget.update(6, 6, 0)
    assert budget.length == 10  # capped
    budget.update(2, 2, 0)  # a draft the caller capped at 2, accepted: no shrinking
    assert budget.length == 10
    budget.update(10, 4, 0)
    assert budget.length == 5  # accepted + 1
    budget.update(5, 0, 0)
    assert budget.length == 2  # halved
    budget.update(0, 0, 0)  # nothing drafted: nothing learnt
    assert budget.length == 2 and budget.misses == 1


def test_budget_pauses_after_repeated_rejections_and_backs_off() -> None:
    policy = DraftPolicy(max_tokens=8, initial=4, patience=3, pause_tokens=10,
                         max_pause_tokens=25)
    budget = DraftBudget(policy)
    for _ in range(3):
        assert not budget.paused(100)
        budget.update(budget.allowed(100), 0, 100)
    assert budget.paused(100) and budget.allowed(109) == 0  # paused for 10 tokens
    assert budget.allowed(110) == 1  # then a one-token probe
    for _ in range(3):
        budget.update(1, 0, 110)
    assert budget.allowed(129) == 0 and budget.allowed(130) == 1  # twice as long
    for _ in range(3):
        budget.update(1, 0, 130)
    assert budget.allowed(154) == 0 and budget.allowed(155) == 1  # capped at 25
    budget.update(1, 1, 155)  # an accepted token clears the streak and the back-off
    assert budget.misses == 0 and budget.pause == 10 and budget.length == 2
    budget.update(2, 0, 156)
    budget.update(1, 0, 156)
    assert not budget.paused(157)  # two misses: patience is 3


def test_policy_rejects_bad_bounds_by_name() -> None:
    with pytest.raises(ValueError, match="patience"):
        DraftPolicy(patience=0)
    with pytest.raises(ValueError, match="initial"):
        DraftPolicy(max_tokens=4, initial=5)
    with pytest.raises(ValueError, match="max_pause_tokens"):
        DraftPolicy(pause_tokens=10, max_pause_tokens=5)
    with pytest.raises(ValueError, match="accepted 3 of 2"):
        DraftBudget(DraftPolicy()).update(2, 3, 0)


# ---------------------------------------------------------------------- the drafter


def test_drafter_copies_from_the_prompt_and_never_changes_the_request() -> None:
    drafter = NgramDrafter(radix(), max_draft_tokens=4)
    req = make_req([10, 11, 12, 13, 14, 15, 16, 30, 31], [10, 11])
    before = copy.deepcopy((req.input_ids, req.output_ids, req.params))
    assert drafter.propose(req, 8) == [12, 13, 14, 15]  # initial length 4 of at most 4
    assert drafter.propose(req, 2) == [12, 13]  # the caller's bound
    assert (req.input_ids, req.output_ids, req.params) == before
    req.output_ids += [12, 13]
    assert drafter.propose(req, 8) == [14, 15, 16, 30]


def test_drafter_never_drafts_past_max_new_tokens() -> None:
    drafter = NgramDrafter(radix())
    req = make_req([1, 2, 3, 4, 5, 6, 7, 8, 1, 2], [], max_new_tokens=3)
    assert drafter.propose(req, 8) == [3, 4]  # the third token comes from verification
    req.output_ids = [3, 4]
    assert drafter.propose(req, 8) == []


@pytest.mark.parametrize("seed", range(10))
def test_incremental_state_matches_a_fresh_drafter_through_rollbacks(seed: int) -> None:
    """Output grows, and sometimes loses or rewrites its tail (jump-forward's retokenized
    boundary): the drafter's incremental index proposes what a fresh one would."""
    rng = random.Random(seed)
    prompt = [rng.randrange(5) for _ in range(60)]
    kept = NgramDrafter(radix(), max_draft_tokens=6, min_match=2, max_match=5)
    req = make_req(prompt)
    for _ in range(150):
        r = rng.random()
        if r < 0.1 and req.output_ids:
            del req.output_ids[-rng.randrange(1, min(4, len(req.output_ids)) + 1):]
        elif r < 0.15 and req.output_ids:
            req.output_ids[-1] = rng.randrange(5)  # rewritten in place
        req.output_ids += [rng.randrange(5) for _ in range(rng.randrange(0, 3))]
        fresh = NgramDrafter(radix(), max_draft_tokens=6, min_match=2, max_match=5)
        assert kept.propose(req, 6) == fresh.propose(req, 6)
        kept.observe(req, 0, 0)


def test_tree_continuation_goes_first_then_prompt_lookup_after_divergence() -> None:
    cache = radix()
    prompt = [7, 1, 2, 3, 4, 5, 6, 8, 1, 2]
    earlier_run = [40, 41, 42, 43, 44, 45]
    cache.insert(prompt + earlier_run, list(range(16)))
    drafter = NgramDrafter(cache, max_draft_tokens=4)
    req = make_req(prompt)
    assert drafter.propose(req, 8) == [40, 41, 42, 43]  # tree drafts start at full length
    drafter.observe(req, 4, 2)
    req.output_ids = [40, 41, 2, 3]  # the model departed from the earlier run
    assert drafter.propose(req, 8) == [4, 5, 6, 8]  # prompt lookup, after [2, 3]
    assert drafter.stats["tree_drafts"] == 1 and drafter.stats["ngram_drafts"] == 1
    assert drafter.stats["tree_accepted_tokens"] == 2


def test_no_sharing_cache_leaves_prompt_lookup_only() -> None:
    cache = NoSharingCache(lambda slots: None)
    cache.insert([1, 2, 3, 9, 9], [0, 1, 2, 3, 4])
    drafter = NgramDrafter(cache)
    assert drafter.propose(make_req([5, 1, 2, 3, 4, 1, 2, 3]), 8)[:1] == [4]
    assert drafter.stats["tree_drafts"] == 0


def test_failing_drafts_stop_and_resume_and_release_drops_state() -> None:
    policy = DraftPolicy(max_tokens=4, initial=4, patience=2, pause_tokens=5)
    drafter = NgramDrafter(radix(), max_draft_tokens=4, min_match=1, policy=policy)
    req = make_req([1, 2, 3, 4, 5, 1, 2, 3, 4, 5])  # every token has occurred: always a draft
    drafts = []
    for i in range(12):
        draft = drafter.propose(req, 4)
        drafts.append(len(draft))
        drafter.observe(req, len(draft), 0)  # the model rejects every draft
        req.output_ids.append(i % 5 + 1)
    # 4 then 2 tokens, both rejected: paused for 5 tokens of growth (drafted at length 11,
    # so none at 12..15); one-token probes at 16 and 17, rejected: paused twice as long
    assert drafts == [4, 2, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0]
    assert drafter.stats["ngram_drafts"] == 4 and drafter.stats["ngram_drafted_tokens"] == 8
    assert drafter.num_tracked == 1
    drafter.release(req)
    assert drafter.num_tracked == 0
    drafter.observe(req, 1, 1)  # after release: ignored
    assert drafter.num_tracked == 0


def test_tree_failures_do_not_pause_prompt_lookup() -> None:
    cache = radix()
    prompt = [3, 4, 5, 6, 3, 4]
    policy = DraftPolicy(max_tokens=4, initial=2, patience=1, pause_tokens=100)
    drafter = NgramDrafter(cache, max_draft_tokens=4, policy=policy)
    req = make_req(prompt)
    cache.insert(prompt + [8, 8, 8], list(range(9)))
    assert drafter.propose(req, 4) == [8, 8, 8]
    drafter.observe(req, 3, 0)  # rejected: the tree pauses for this request
    cache.insert(prompt + [9, 9], list(range(20, 28)))  # a newer run, but the tree is paused
    assert drafter.propose(req, 4) == [5, 6]  # prompt lookup still drafts


# ---------------------------------------------------------------------- lookup by text
PASSAGE = "Meeting notes. Present: Nina Petrova and Lena Fischer. Next meeting: 14 June."


def chat_prompt(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(f"Extract the names as JSON.\n\n{text}", add_special_tokens=False)


def test_text_lookup_drafts_a_copy_whose_tokens_start_differently(tokenizer) -> None:
    prompt = chat_prompt(tokenizer, PASSAGE)
    out = tokenizer.encode('{"first": "Nina', add_special_tokens=False)
    assert tokenizer.encode(" Nina", add_special_tokens=False)[0] not in out  # 'N' 'ina'
    req = make_req(prompt, out)
    assert NgramDrafter(radix(), max_draft_tokens=8).propose(req, 8) == []  # no token match
    drafter = NgramDrafter(radix(), max_draft_tokens=8, tokenizer=tokenizer)
    draft = drafter.propose(req, 8)
    assert tokenizer.decode(draft) == " Petrova and"  # the policy's first length, 4 tokens
    assert len(draft) == 4 and drafter.stats["text_drafts"] == 1
    drafter.observe(req, len(draft), 2)
    assert drafter.stats["text_accepted_tokens"] == 2 and drafter.stats["text_drafted_tokens"]
    # the latest occurrence of the longest matching text, and [] where none occurs
    lookup = TextLookup(text_codec(tokenizer), len(prompt))
    tail = tokenizer.encode(" Next meeting", add_special_tokens=False)
    assert tokenizer.decode(lookup.propose(prompt + tail, 4)) == ": 14"
    zebra = tokenizer.encode(" zebra quagga", add_special_tokens=False)
    assert lookup.propose(prompt + zebra, 8) == []
    assert lookup.propose(prompt, 8) == []  # the prompt's own end: nothing follows it
    assert lookup.propose(out, 0) == []


def test_text_lookup_works_with_any_tokenizer_and_checks_its_settings(tokenizer) -> None:
    class Slow:  # decode/encode only, as a tokenizer without a Rust backend has
        def decode(self, ids, skip_special_tokens=False):
            return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

        def encode(self, text, add_special_tokens=True):
            return tokenizer.encode(text, add_special_tokens=add_special_tokens)

    prompt = chat_prompt(tokenizer, PASSAGE)
    out = tokenizer.encode('{"first": "Nina', add_special_tokens=False)
    fast = TextLookup(text_codec(tokenizer), len(prompt)).propose(prompt + out, 6)
    assert fast and TextLookup(text_codec(Slow()), len(prompt)).propose(prompt + out,
                                                                          6) == fast
    for bad in ({"min_chars": 0}, {"max_back": 0}, {"window": 0}):
        with pytest.raises(ValueError, match="min_chars, max_back and window"):
            TextLookup(text_codec(tokenizer), len(prompt), **bad)


def test_text_drafts_pause_after_rejections_and_leave_token_lookup_first(tokenizer) -> None:
    policy = DraftPolicy(max_tokens=8, initial=4, patience=2, pause_tokens=50)
    drafter = NgramDrafter(radix(), max_draft_tokens=8, policy=policy, tokenizer=tokenizer)
    prompt = chat_prompt(tokenizer, PASSAGE)
    req = make_req(prompt, tokenizer.encode('{"first": "Nina', add_special_tokens=False))
    for _ in range(2):
        assert drafter.propose(req, 8)
        drafter.observe(req, 8, 0)  # rejected outright, twice: the text source pauses
    assert drafter.propose(req, 8) == [] and drafter.stats["text_drafts"] == 2
    req.output_ids = tokenizer.encode("Present: Nina", add_special_tokens=False)
    token_draft = drafter.propose(req, 8)  # token lookup matches here, and goes first
    assert token_draft and drafter.stats["ngram_drafts"] == 1


# ---------------------------------------------------------------------- on the real model


def test_drafts_follow_the_real_models_copy_of_its_input(engine_fp32) -> None:
    """Greedy output of a proofreading request (the model copies the passage; the bench's
    first rewrite prompt) replayed as a verifying step would: most steps carry a draft and
    a step yields several tokens."""
    from spec_tasks import build_prompts  # benchmarks/, on the path through conftest

    tok = engine_fp32.tokenizer
    chat = tok.apply_chat_template(build_prompts("rewrite", 1)[0].messages, tokenize=False,
                                   add_generation_prompt=True)
    prompt = tok.encode(chat, add_special_tokens=False)
    out = engine_fp32.generate(input_ids=prompt, sampling_params={
        "max_new_tokens": 64, "temperature": 0})["output_ids"]
    assert len(out) >= 24
    drafter = NgramDrafter(radix(), max_draft_tokens=8)
    req = make_req(prompt, max_new_tokens=len(out) + 1)
    pos = steps = drafted_steps = 0
    while pos < len(out):
        req.output_ids = out[:pos]
        draft = drafter.propose(req, 8)
        ok = 0
        while ok < len(draft) and pos + ok < len(out) and draft[ok] == out[pos + ok]:
            ok += 1
        if draft:
            drafter.observe(req, len(draft), ok)
            drafted_steps += 1
        steps, pos = steps + 1, pos + ok + 1
    assert len(out) / steps >= 1.6, (len(out), steps)  # 1.0 without drafts
    assert drafted_steps >= steps / 3
