"""RadixAttention on the real model: greedy outputs are the same with the radix cache on and
off, for the sharing patterns the cache exists for (few-shot prefixes, forks of one prefix,
a multi-turn chat) and under eviction pressure; the cache is actually hit.

Every engine runs the defaults, which are batch-invariant (int8 activation blocks at every
step size): a hit's steps differ from a miss's (the cached prefix is not recomputed, the
prompt's last token runs in a smaller step, the batch is admitted otherwise), and only a
rounding that does not depend on the step makes the outputs equal by construction (fp32
activations sum by step size: equal only where no near-tie meets the last bits).

The cache-on engine is the session's ``engine_default``; the cache-off one is module-scoped."""

from __future__ import annotations

import pytest

from radixlm.runtime.engine import Engine

GREEDY = {"temperature": 0, "max_new_tokens": 10}

FEW_SHOT = (
    "Answer each question with one word.\n\n"
    "Question: What color is the sky on a clear day?\nAnswer: Blue\n\n"
    "Question: Which animal says moo?\nAnswer: Cow\n\n"
    "Question: What is frozen water called?\nAnswer: Ice\n\n"
    "Question: Which planet do we live on?\nAnswer: Earth\n\n"
    "Question: What do bees make?\nAnswer: Honey\n\n"
)
QUESTIONS = ["What is the opposite of hot?", "Which fruit is yellow and long?",
             "What do you call a baby cat?", "How many legs does a spider have?"]


@pytest.fixture(scope="module")
def engine_off():
    with Engine(disable_radix_cache=True, max_total_tokens=4096, log_level="warning") as engine:
        assert engine.batch_invariant
        yield engine


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return encode(tokenizer, text)


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def run_both(on: Engine, off: Engine, ids: list[list[int]], params=GREEDY):
    """The same batch on both engines; outputs must be identical, pools consistent."""
    got_on = on.generate(input_ids=ids, sampling_params=params)
    got_off = off.generate(input_ids=ids, sampling_params=params)
    assert [r["output_ids"] for r in got_on] == [r["output_ids"] for r in got_off]
    assert [r["meta_info"]["finish_reason"] for r in got_on] == [
        r["meta_info"]["finish_reason"] for r in got_off]
    assert all(r["meta_info"]["completion_tokens"] > 0 for r in got_on)
    assert all(r["meta_info"]["cached_tokens"] == 0 for r in got_off)
    on.check_integrity()
    off.check_integrity()
    return got_on, got_off


def test_few_shot_prefix(engine_default, engine_off, tokenizer):
    prefix = encode(tokenizer, FEW_SHOT)
    ids = [prefix + encode(tokenizer, f"Question: {q}\nAnswer:") for q in QUESTIONS]
    on, _ = run_both(engine_default, engine_off, ids)
    cached = sorted(r["meta_info"]["cached_tokens"] for r in on)
    # submitted together: the first prefills the prefix, the others find it cached
    assert all(c >= len(prefix) for c in cached[1:]), cached
    assert all(c < len(p) for c, p in zip((r["meta_info"]["cached_tokens"] for r in on), ids))
    # a later question reuses the prefix too, and gives the uncached engine's answer
    late = [prefix + encode(tokenizer, "Question: What is the color of grass?\nAnswer:")]
    again, _ = run_both(engine_default, engine_off, late)
    assert again[0]["meta_info"]["cached_tokens"] >= len(prefix)


def test_forks_of_one_prefix(engine_default, engine_off, tokenizer):
    prefix = encode(tokenizer, "Once upon a time, in a quiet harbour town by the northern sea, "
                               "an old lighthouse keeper walked along the cold beach every morning "
                               "before sunrise. One day he found a green glass bottle half buried "
                               "in the sand, and inside it was a letter. It said")
    branches = [prefix + encode(tokenizer, s) for s in
                (" that the treasure", " that his brother", ": meet me at", " nothing at all")]
    # the bare prefix, the branches, and the same prompt twice, all at once
    level1 = [prefix] + branches + [branches[0]]
    on, _ = run_both(engine_default, engine_off, level1)
    assert on[-1]["output_ids"] == on[1]["output_ids"]
    assert sum(r["meta_info"]["cached_tokens"] >= len(prefix) - 1 for r in on) >= len(level1) - 1
    # second level: each branch continues from its own prompt + output
    level2 = [p + r["output_ids"] + encode(tokenizer, " Then")
              for p, r in zip(level1[1:-1], on[1:-1])]
    on2, _ = run_both(engine_default, engine_off, level2)
    for parent, res, child in zip(level1[1:-1], on[1:-1], on2):
        # everything the parent computed is reused (its last sampled token has no K/V)
        assert child["meta_info"]["cached_tokens"] >= len(parent) + len(res["output_ids"]) - 1


def test_multi_turn_chat(engine_default, engine_off, tokenizer):
    convos = [[{"role": "user", "content": "Name a large animal that lives in the ocean."}],
              [{"role": "user", "content": "Give me a word that rhymes with cat."}]]
    params = {"temperature": 0, "max_new_tokens": 12}
    turn1 = [chat_ids(tokenizer, c) for c in convos]
    on1, _ = run_both(engine_default, engine_off, turn1, params)
    turn2 = []
    for c, r in zip(convos, on1):
        c += [{"role": "assistant", "content": r["text"]},
              {"role": "user", "content": "Tell me one more fact about it."}]
        turn2.append(chat_ids(tokenizer, c))
    on2, _ = run_both(engine_default, engine_off, turn2, params)
    for p1, r1, p2, r2 in zip(turn1, on1, turn2, on2):
        assert p2[:len(p1)] == p1  # the template really extends turn 1
        history = p1 + r1["output_ids"]
        expected = min(common_prefix_len(p2, history), len(history) - 1)
        assert expected > len(p1)  # turn 1's answer is in turn 2's prompt
        assert r2["meta_info"]["cached_tokens"] >= expected


def test_eviction_pressure(engine_off, tokenizer):
    pool = 400
    groups = [encode(tokenizer, f"Report number {g}: " + text * 8) for g, text in enumerate((
        "The river rose after three days of rain and the bridge was closed. ",
        "Prices at the market went up again because the harvest was poor. ",
        "The orchestra played a new symphony to a full hall on Friday. "))]
    tails = (" In short,", " The main point is", " Experts said")
    ids = [g + encode(tokenizer, t) for g in groups for t in tails]
    distinct = sum(map(len, groups)) + sum(len(i) - len(groups[0]) for i in ids) // 2
    assert distinct + GREEDY["max_new_tokens"] * len(ids) > pool
    with Engine(max_total_tokens=pool, log_level="warning") as small:
        assert small.batch_invariant
        on, off = run_both(small, engine_off, ids)
        stats = small.get_stats()
        assert stats["num_retractions_total"] > 0  # decode ran out of slots even after evicting
        assert stats["tree_size"] <= stats["kv_capacity"] <= pool
        assert stats["cached_tokens_total"] > 0
        # a second pass over a partly evicted tree: some hits, not all, same outputs
        again = small.generate(input_ids=ids, sampling_params=GREEDY)
        assert [r["output_ids"] for r in again] == [r["output_ids"] for r in off]
        hits = [r["meta_info"]["cached_tokens"] for r in again]
        assert 0 < sum(hits) < sum(len(p) - 1 for p in ids), hits
        assert small.get_stats()["tree_size"] <= pool
        small.check_integrity()
