"""Speculative decoding on the real embedded model (default settings: the native CPU path):
the same text with and without drafts for input-grounded and free text, under regex and
JSON-schema constraints with jump-forward, in a mixed batch, with EOS inside a draft; and
the sampled distribution of a verified position against the model's own."""

from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest
from spec_fakes import ScriptedDrafter, use_drafter

from radixlm.runtime.engine import Engine
from radixlm.runtime.speculative.cost import StepCosts

ARTICLE = ("The city council met on Tuesday evening to discuss the new transportation plan. "
           "Members reviewed proposals for expanding the bus network and adding protected bike "
           "lanes on Main Street. After three hours of debate, the council voted seven to two "
           "to approve the first phase, which will add twelve new bus routes by next summer.")
PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "city": {"type": "string", "maxLength": 24},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "city", "age"]}


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


@pytest.fixture(scope="module")
def engine():
    with Engine(max_total_tokens=16384, speculative_algorithm="NGRAM",
                log_level="warning") as engine:
        yield engine


class _SteadyCosts(StepCosts):
    """Step times that do not move with the machine's load: a step of t tokens costs
    1 + 0.15 (t - 1) units, with drafts or without (the shape measured on a 2-core host).
    The draft budgets then follow the acceptance alone, so what a test asserts of drafting
    holds on a busy machine, where measured times would shrink them at random."""

    def __init__(self) -> None:
        super().__init__()
        for tokens in (1, 2, 4, 8, 16, 32, 64, 128):
            for drafted in (False, True):
                super().record(tokens, drafted, 1 + 0.15 * (tokens - 1))

    def record(self, tokens: int, drafted: bool, seconds: float) -> None:
        pass


def _own_drafter(engine):
    """The engine's own drafter, deciding by itself under steady step costs."""
    spec = engine.scheduler.speculation
    drafter = spec.drafter if not isinstance(spec.drafter, ScriptedDrafter) else None
    if drafter is None:
        from radixlm.runtime.speculative import create_drafter

        drafter = create_drafter(engine.config, engine.scheduler.kv.cache, native_steps=True,
                                 tokenizer=engine.tokenizer)
    use_drafter(engine, drafter, free=False)
    spec.costs = _SteadyCosts()
    return drafter


def _cold(engine, drafter, free: bool = True) -> None:
    """Speculation with ``drafter`` (None: off) from an empty cache: a cached prompt's last
    token runs in a small native step instead of the prefill, which moves its logits by
    enough to change a sampled token, so on and off start alike."""
    use_drafter(engine, drafter, free=free)
    assert engine.flush_cache()


def _on_off(engine, prompts, params, drafter=None, free=True):
    _cold(engine, None)
    off = engine.generate(prompts, params)
    assert engine.flush_cache()
    before = engine.get_stats()["spec_accepted_tokens_total"]
    if drafter is None:
        _own_drafter(engine)
    else:
        use_drafter(engine, drafter, free=free)
    on = engine.generate(prompts, params)
    engine.check_integrity()
    return off, on, engine.get_stats()["spec_accepted_tokens_total"] - before


def test_input_grounded_and_free_text_are_unchanged(engine, tokenizer):
    prompts = [chat(tokenizer, "Repeat the following text word for word:\n\n" + ARTICLE),
               chat(tokenizer, "Write a short story about a lighthouse keeper.")]
    params = {"temperature": 0, "max_new_tokens": 96}
    off, on, accepted = _on_off(engine, prompts, params)
    assert [o["output_ids"] for o in on] == [o["output_ids"] for o in off]
    assert [o["text"] for o in on] == [o["text"] for o in off]
    assert accepted > 10  # the grounded prompt was really drafted from
    assert on[0]["meta_info"]["spec_accept_length"] > 1.5
    assert on[0]["meta_info"]["spec_accept_token_num"] > 0


@pytest.mark.parametrize("mode", ["exact", "corrupt"])
def test_constrained_with_jump_forward_and_drafts(engine, tokenizer, mode):
    """Drafts of a JSON object and of a regex match cross jump-forward's forced text: a
    draft continues after forced tokens in the same step, and is cut where the grammar
    forbids a token."""
    prompts = [chat(tokenizer, "Give a person who lives in Paris as JSON: name, city, age."),
               chat(tokenizer, "What is the phone number of the office?")]
    params = [{"temperature": 0, "max_new_tokens": 64, "json_schema": json.dumps(PERSON)},
              {"temperature": 0, "max_new_tokens": 24, "regex": r"\(\d{3}\) \d{3}-\d{4}"}]
    _cold(engine, None)
    off = engine.generate(prompts, params, rid=["j0", "j1"])
    scripts = {"j0": off[0]["output_ids"], "j1": off[1]["output_ids"]}
    drafter = ScriptedDrafter(scripts, mode)
    _cold(engine, drafter)
    spec = engine.scheduler.speculation
    settle, combined = spec.settle, []

    def watch(sb, out):  # steps where forced tokens and a draft ride in one request's row
        combined.extend(n for n, d in zip(sb.extend_lens, sb.drafts or ()) if n > 1 and d)
        return settle(sb, out)

    spec.settle = watch
    try:
        on = engine.generate(prompts, params, rid=["j0", "j1"])
    finally:
        del spec.settle
    engine.check_integrity()
    assert combined  # forced text first, then a draft continuing it, in one step
    assert [o["output_ids"] for o in on] == [o["output_ids"] for o in off]
    jsonschema.validate(json.loads(on[0]["text"]), PERSON)
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", on[1]["text"])
    assert on[0]["meta_info"].get("forced_tokens", 0) > 0  # jump-forward was on
    drafted = sum(d for _, d, _ in drafter.observed)
    accepted = sum(a for _, _, a in drafter.observed)
    assert drafted > 0 and (accepted == drafted if mode == "exact" else accepted < drafted)


def test_json_extraction_drafts_values_from_the_document(engine, tokenizer):
    """The bench's JSON task (extraction under a schema) with the engine's own drafter:
    the same greedy ids with and without drafts, values drafted from the document and
    accepted, and the outputs valid under their schemas."""
    from spec_tasks import build_prompts  # benchmarks/, on the path through conftest

    prompts = build_prompts("json", 4)
    texts = [tokenizer.apply_chat_template(p.messages, tokenize=False,
                                           add_generation_prompt=True) for p in prompts]
    params = [{"temperature": 0, "max_new_tokens": 96, "json_schema": json.dumps(p.json_schema)}
              for p in prompts]
    off = []
    for text, param in zip(texts, params):  # single stream, as the bench runs them
        _cold(engine, None)
        off.append(engine.generate(text, param))
    drafter = _own_drafter(engine)
    on = []
    for text, param in zip(texts, params):
        assert engine.flush_cache()
        on.append(engine.generate(text, param))
    engine.check_integrity()
    assert [o["output_ids"] for o in on] == [o["output_ids"] for o in off]
    assert drafter.stats["value_accepted_tokens"] >= 10, drafter.stats
    for p, o in zip(prompts, on):
        if o["meta_info"]["finish_reason"]["type"] == "stop":
            jsonschema.validate(json.loads(o["text"]), p.json_schema)


def test_mixed_batch_and_eos_inside_a_draft(engine, tokenizer):
    prompts = [chat(tokenizer, "Repeat exactly: the quick brown fox jumps over the lazy dog."),
               chat(tokenizer, "Name three colors."),
               chat(tokenizer, "Is water wet? Answer yes or no."),
               chat(tokenizer, "Copy this list: apple, banana, cherry, apple, banana, cherry.")]
    params = [{"temperature": 0, "max_new_tokens": 40},
              {"temperature": 0.9, "top_p": 0.9, "seed": 5, "max_new_tokens": 30, "n": 2},
              {"temperature": 0, "max_new_tokens": 8, "choices": ["yes", "no"]},
              {"temperature": 0, "max_new_tokens": 40, "stop": ["cherry, apple"]}]
    kw = {"return_logprob": True, "top_logprobs_num": 2}
    # The choices grammar compiled first: a request waiting for its grammar joins a later
    # step, which changes the size (and so the activation rounding) of the step that runs
    # the sampled copy's last prompt token, and with it the sampled text; off and on must
    # schedule alike.
    _cold(engine, None)
    engine.generate(prompts[2], params[2])
    _cold(engine, None)
    off = engine.generate(prompts, params, rid=[f"m{i}" for i in range(4)], **kw)
    scripts = {o["meta_info"]["id"]: o["output_ids"] for o in off}
    eos = next(iter(engine.eos_ids))
    assert off[0]["meta_info"]["finish_reason"] == {"type": "stop", "matched": eos}
    # past the script's end the draft carries the EOS on into junk
    drafter = ScriptedDrafter(scripts, "exact", tail=[eos, 1000, 1001])
    _cold(engine, drafter)
    on = engine.generate(prompts, params, rid=[f"m{i}" for i in range(4)], **kw)
    engine.check_integrity()
    assert [o["output_ids"] for o in on] == [o["output_ids"] for o in off]
    assert [o["text"] for o in on] == [o["text"] for o in off]
    assert [o["meta_info"]["finish_reason"] for o in on] == [
        o["meta_info"]["finish_reason"] for o in off]
    for a, b in zip(on, off):
        la, lb = a["meta_info"]["output_token_logprobs"], b["meta_info"]["output_token_logprobs"]
        assert [t for _, t, _ in la] == [t for _, t, _ in lb]
        # a verification row runs in a step of several tokens: other kernel tiles, the
        # same activation rounding (ForwardBatch.act_rows)
        assert max(abs(x - y) for (x, _, _), (y, _, _) in zip(la, lb)) < 0.05
    assert sum(a for _, _, a in drafter.observed) > 20


def _top_probs(engine, ids: list[int], k: int) -> dict[int, float]:
    """The model's next-token distribution after ``ids`` with top-k (temperature 1)."""
    ref = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 1},
                          return_logprob=True, top_logprobs_num=k)
    probs = {t: math.exp(lp) for lp, t, _ in ref["meta_info"]["output_top_logprobs"][0]}
    total = sum(probs.values())
    return {t: p / total for t, p in probs.items()}


def test_sampled_verified_token_follows_the_model(engine, tokenizer):
    """Over many seeds, the token sampled at a verified position (the draft accepted, or
    its correction) is distributed as the model's processed distribution there (from the
    logprobs of decoding without drafts): a chi-square test on the second output token of
    the requests whose first token was the likeliest one (then a draft is verified)."""
    ids = tokenizer.encode(chat(tokenizer, "Say one word about the sea."),
                           add_special_tokens=False)
    k, n = 3, 300
    use_drafter(engine, None)
    first = _top_probs(engine, ids, k)
    head = max(first, key=first.get)
    probs = _top_probs(engine, ids + [head], k)
    draft = sorted(probs, key=probs.get)[-2]  # the second likeliest: accepted ~ its share
    rids = [f"d{s}" for s in range(n)]
    drafter = ScriptedDrafter({rid: [head, draft] for rid in rids})
    use_drafter(engine, drafter)
    params = [{"temperature": 1.0, "top_k": k, "max_new_tokens": 3, "seed": s,
               "ignore_eos": True} for s in range(n)]
    outs = []
    for j in range(0, n, 20):  # 20 at a time: a batch's step has room for their drafts
        outs += engine.generate(input_ids=[ids] * 20, sampling_params=params[j:j + 20],
                                rid=rids[j:j + 20])
    engine.check_integrity()
    second = [o["output_ids"][1] for o in outs if o["output_ids"][0] == head]
    verified = sum(d for _, d, _ in drafter.observed)
    assert verified == len(second) > n * first[head] / 2
    accepted = sum(a for _, _, a in drafter.observed)
    assert accepted == second.count(draft) > 0
    m = len(second)
    assert set(second) <= set(probs)
    chi2 = sum((second.count(t) - p * m) ** 2 / (p * m) for t, p in probs.items())
    assert chi2 < 13.82, (chi2, {t: second.count(t) for t in probs}, probs)  # 2 dof, 0.999


def test_verification_rows_keep_the_decode_steps_rounding(engine):
    """A step of 12 tokens that verifies drafts for one request runs at the activation
    rounding of that request's one-token step (``act_rows``), so its logits stay close to
    decoding's; without it a plan that rounds by step size (``mixed``) would round a
    12-token step as a prefill. Where one mode runs every step size (the default on an
    int8 host: batch-invariant), the 12-token verify step, with or without ``act_rows``, IS
    the twelve one-token steps, bit for bit."""
    import torch

    from radixlm.runtime.forward_batch import ForwardBatch, ForwardMode

    native = engine.runner.native
    if native is None:  # only a CUDA engine runs no native steps
        assert engine.runner.device.type == "cuda"
        pytest.skip("CUDA: no native CPU steps to compare")
    one_rounding = native._mode(1) == native._mode(12)
    kv, pool = engine.scheduler.kv, engine.runner.pool

    def t(values):
        return torch.tensor(values, dtype=torch.int64)

    def step(row, slots, ids, start, act_rows=None):
        n = len(ids)
        return native.forward(ForwardBatch(
            ForwardMode.EXTEND, t(ids), t(list(range(start, start + n))),
            t(slots[start:start + n]), t([row]), t([start + n]), t([start]), t([n]), t([0]),
            t(list(range(n))), [start + n], [start], [n], [1], act_rows=act_rows))

    def compare():
        row, slots = kv.rows.alloc(), kv.alloc(72)
        try:
            pool.req_to_token[row, :72] = torch.tensor(slots, dtype=torch.int32)
            ids = [(37 * i) % 5000 + 100 for i in range(72)]
            for s in range(0, 60, 2):  # the context, in small steps
                step(row, slots, ids[s:s + 2], s)
            one = torch.cat([step(row, slots, ids[60 + j:61 + j], 60 + j) for j in range(12)])
            kept = step(row, slots, ids[60:], 60, act_rows=1)
            plain = step(row, slots, ids[60:], 60)
            return one, kept, plain
        finally:
            kv.slots.free(slots)
            kv.rows.free(row)

    one, kept, plain = engine.scheduler.call(compare)
    assert one.shape == kept.shape == plain.shape == (12, one.shape[1])
    if one_rounding:
        assert engine.batch_invariant == native.batch_invariant
        assert torch.equal(kept, one), (kept - one).abs().max().item()
        assert torch.equal(plain, one), (plain - one).abs().max().item()
    else:
        kept, plain = (kept - one).abs().max().item(), (plain - one).abs().max().item()
        assert kept < 0.05 and kept < plain / 2, (kept, plain)
