"""Speculative decoding's mechanics, without the real model: the verification rule and its
output distribution, the draft budget from step costs, the prompt-lookup drafter, the
grammar check of a draft, bad settings; then on a tiny random model, outputs identical to
decoding without drafts (greedy and seeded sampling, stops, budgets, logprobs) and the
K/V and radix accounting after accepted, partly accepted and rejected drafts, aborts,
retraction and a failing verification step."""

from __future__ import annotations

import itertools
import math
import random
import re
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from spec_fakes import ScriptedDrafter, assert_tree_holds_only, use_drafter

from radixlm.cli import build_parser, engine_kwargs_from_args
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.engine import Engine
from radixlm.runtime.model_runner import ModelRunner, mix_seed
from radixlm.runtime.request import LogprobOptions, Req
from radixlm.runtime.sampler import Sampler, accept_prefix
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.scheduler.speculation import Speculation
from radixlm.runtime.speculative import create_drafter
from radixlm.runtime.speculative.base import resolve_algorithm
from radixlm.runtime.speculative.cost import StepCosts, plan_budgets

# --------------------------------------------------------------------------- the rule


def test_accept_prefix_takes_the_agreeing_prefix():
    assert accept_prefix([5, 6, 7], [5, 6, 7, 8]) == 3
    assert accept_prefix([5, 6, 7], [5, 9, 7, 8]) == 1
    assert accept_prefix([5, 6, 7], [4, 6, 7, 8]) == 0
    assert accept_prefix([], [4]) == 0


V = 6  # a Markov "model" over 6 tokens: the next token's logits depend on the last one
TRANSITIONS = torch.tensor([[1.2, 0.3, -0.5, 0.0, 0.8, -1.0],
                            [0.1, 1.5, 0.2, -0.3, 0.0, 0.4],
                            [-0.6, 0.2, 1.0, 0.9, 0.1, 0.0],
                            [0.5, -0.2, 0.3, 1.1, -0.8, 0.6],
                            [0.0, 0.7, -0.4, 0.2, 1.3, 0.1],
                            [0.9, 0.0, 0.5, -0.7, 0.3, 1.0]])
SAMPLING = {"temperature": 0.9, "top_k": 5, "top_p": 0.95, "frequency_penalty": 0.4,
            "presence_penalty": 0.2, "repetition_penalty": 1.1, "logit_bias": {"2": 0.5},
            "min_new_tokens": 2, "stop_token_ids": [5]}
PROMPT = [0, 3]


def _markov_req(seed: int, params: dict) -> Req:
    return Req(rid=f"m{seed}", input_ids=list(PROMPT), params=SamplingParams.from_dict(params),
               logprob=LogprobOptions(), detok=None, sink=None, seed=seed)


def _markov_generate(seed: int, length: int, draft_len: int, params: dict) -> list[int]:
    """Generate ``length`` tokens as the engine would: each step samples at the request's
    last token and at each of ``draft_len`` draft tokens (a deterministic proposal: the
    last token + 1, then + 2, ...), with the runner's per-row sampling inputs and the
    real sampler, accepts by ``accept_prefix`` and rewinds the RNG to one draw per token
    emitted."""
    runner = SimpleNamespace(device=torch.device("cpu"), _generators={})
    req = _markov_req(seed, params)
    gen = torch.Generator().manual_seed(mix_seed(seed))
    runner._generators[req.rid] = gen
    sampler = Sampler(lambda logits, mask: None)
    while len(req.output_ids) < length:
        last = req.fill_ids[-1]
        k = min(draft_len, length - len(req.output_ids) - 1)
        draft = [(last + j + 1) % V for j in range(k)]
        context = [last] + draft
        inputs = ModelRunner.sampling_inputs(runner, [req], [gen], None, [draft])
        state = gen.get_state()
        ids = sampler(TRANSITIONS[context].clone(), inputs).next_ids
        m = accept_prefix(draft, ids)
        emitted = draft[:m] + [ids[m]]
        ModelRunner.rewind_generator(runner, req, state, len(emitted))
        req.output_ids.extend(emitted)
    return req.output_ids[:length]


def _markov_exact(length: int, params: dict) -> dict[tuple[int, ...], float]:
    """The exact distribution of the first ``length`` tokens, decoding one at a time."""
    sampler = Sampler(lambda logits, mask: None)
    runner = SimpleNamespace(device=torch.device("cpu"))
    out = {}
    for seq in itertools.product(range(V), repeat=length):
        prob, req = 1.0, _markov_req(0, params)
        for tok in seq:
            inputs = ModelRunner.sampling_inputs(runner, [req], [None], None)
            logits = sampler._penalize(TRANSITIONS[[req.fill_ids[-1]]].clone(), inputs)
            for t, b in (inputs.logit_biases[0] or {}).items():
                logits[0, t] += b
            if inputs.banned_ids[0]:
                logits[0, inputs.banned_ids[0]] = float("-inf")
            probs = torch.softmax(logits[0] / params["temperature"], dim=-1)
            vals, idx = probs.sort(descending=True)
            keep = torch.zeros(V, dtype=torch.bool)
            keep[idx[:params["top_k"]]] = True
            before = vals.cumsum(0) - vals
            keep[idx[before >= params["top_p"]]] = False
            keep[idx[0]] = True
            probs = torch.where(keep, probs, torch.zeros_like(probs))
            prob *= float(probs[tok] / probs.sum())
            req.output_ids.append(tok)
        out[seq] = prob
    return out


def test_sampled_drafts_keep_the_distribution():
    """Chi-square over 3-token sequences of a small Markov model with penalties, bias,
    banned tokens, top-k/p: speculating (3 draft tokens a step) matches the exact
    distribution of decoding one token at a time, and for each seed gives the very
    tokens decoding gives."""
    n, length = 1500, 3
    exact = _markov_exact(length, SAMPLING)
    spec = [tuple(_markov_generate(s, length, 3, SAMPLING)) for s in range(n)]
    plain = [tuple(_markov_generate(s, length, 0, SAMPLING)) for s in range(200)]
    assert spec[:200] == plain  # same seed, same tokens
    counts: dict[tuple[int, ...], int] = {}
    for seq in spec:
        counts[seq] = counts.get(seq, 0) + 1
    # pool the rare sequences into one cell so every cell expects >= 5
    common = [s for s, p in exact.items() if p * n >= 5]
    chi2 = sum((counts.get(s, 0) - exact[s] * n) ** 2 / (exact[s] * n) for s in common)
    rest_p = 1 - sum(exact[s] for s in common)
    rest = n - sum(counts.get(s, 0) for s in common)
    chi2 += (rest - rest_p * n) ** 2 / (rest_p * n) if rest_p * n >= 5 else 0
    dof = len(common) - (0 if rest_p * n >= 5 else 1)
    # 99.9% quantile of chi-square (Wilson-Hilferty)
    z = 3.09
    limit = dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3
    assert chi2 < limit, (chi2, limit, dof)
    accepted = sum(a == (b + 1) % V for seq in spec for a, b in zip(seq[1:], seq[:-1]))
    assert accepted > 100  # drafts were really accepted, and really rejected
    assert accepted < n * (length - 1) - 100


# --------------------------------------------------------------------------- the budget


def _costs(fixed: float, per_token: float, sizes=range(1, 80)) -> StepCosts:
    costs = StepCosts()
    for t in sizes:
        costs.record(t, False, fixed + per_token * t)
        costs.record(t, True, fixed + per_token * t)
    return costs


def test_drafts_pay_at_small_batch_with_good_acceptance():
    costs = _costs(10.0, 1.0)  # a memory-bound step: an extra token costs 1/11 of a step
    assert plan_budgets(costs, 1, 1, [0.9], [8], max_extra=63) == [8]
    small = plan_budgets(costs, 1, 1, [0.5], [8], max_extra=63)
    assert 1 <= small[0] < 8
    assert plan_budgets(costs, 1, 1, [0.05], [8], max_extra=63) == [0]
    assert plan_budgets(costs, 1, 1, [0.9], [3], max_extra=63) == [3]  # the request's limit
    assert plan_budgets(costs, 1, 1, [0.9], [8], max_extra=2) == [2]  # the step's room


def test_drafts_do_not_pay_at_large_batch():
    costs = _costs(10.0, 1.5)  # compute-bound: 64 rows cost 10x a one-row step
    assert plan_budgets(costs, 64, 64, [0.7] * 64, [8] * 64, max_extra=64) == [0] * 64
    budgets = plan_budgets(costs, 16, 16, [0.98] + [0.1] * 15, [8] * 16, max_extra=48)
    assert budgets[0] > 0 and budgets[1:] == [0] * 15  # only the request that pays


def test_step_costs_interpolate_and_extrapolate():
    costs = StepCosts()
    assert costs.estimate(3, True) is None
    costs.record(1, False, 10.0)
    assert costs.estimate(1, False) == 10.0
    assert costs.estimate(5, True) == pytest.approx(10.0 + 4 * 2.5)  # prior: a quarter each
    costs.record(4, True, 13.0)
    costs.record(8, True, 21.0)
    assert costs.estimate(6, True) == pytest.approx(17.0)  # between measured sizes
    assert costs.estimate(10, True) == pytest.approx(25.0)  # their slope, past them
    for _ in range(30):
        costs.record(4, True, 16.0)  # a running mean: follows what steps cost now
    assert costs.estimate(4, True) == pytest.approx(16.0, abs=0.01)


# --------------------------------------------------------------------------- the drafter


def _req(ids: list[int], out: list[int] | None = None, rid: str = "r") -> Req:
    req = Req(rid=rid, input_ids=ids, params=SamplingParams(), logprob=LogprobOptions(),
              detok=None, sink=None)
    req.output_ids = list(out or [])
    return req


# --------------------------------------------------------------------------- grammar


class _OnlyAllowed:
    """A grammar that allows tokens of ``allowed`` and ends after ``end`` tokens."""

    def __init__(self, allowed: set[int], end: int = 1 << 30) -> None:
        self.allowed, self.end, self.accepted = allowed, end, []

    def fill_bitmask(self, mask, row):
        mask[row] = 0
        for t in self.allowed:
            mask[row, t >> 5] |= np.int32(np.uint32(1 << (t & 31)).view(np.int32))

    def accept_token(self, tok):
        if tok not in self.allowed:
            return False
        self.accepted.append(tok)
        return True

    def rollback(self, n):
        del self.accepted[len(self.accepted) - n:]

    def is_terminated(self):
        return len(self.accepted) >= self.end


def _speculation() -> Speculation:
    runner = SimpleNamespace(vocab_size=100,
                             pool=SimpleNamespace(req_to_token=np.zeros((2, 64))))
    state = SimpleNamespace(stats={})
    return Speculation(EngineConfig(), state, None, runner, None, None)


def test_a_draft_stops_at_the_first_token_the_grammar_forbids():
    spec, req = _speculation(), _req([1, 2], [3])
    req.grammar = _OnlyAllowed({4, 5, 6, 40})
    assert spec._check_grammar(req, [4, 40, 7, 5], 0) == [4, 40]
    assert req.grammar.accepted == []  # left as it was
    rows = spec._masks[0]
    assert rows.shape == (3, 4)  # a mask per verification row

    def allowed(row, tok):
        return bool((int(rows[row, tok >> 5]) >> (tok & 31)) & 1)

    assert all(allowed(r, 40) and not allowed(r, 7) for r in range(3))
    req.grammar = _OnlyAllowed({4, 5}, end=2)  # no row may follow the grammar's end
    assert spec._check_grammar(req, [4, 5, 4], 1) == [4]
    assert req.grammar.accepted == []


class _Forcing(_OnlyAllowed):
    """``_OnlyAllowed`` whose grammar forces text (jump-forward) after token ``at``."""

    def __init__(self, allowed: set[int], at: int) -> None:
        super().__init__(allowed)
        self.at = at

    def forced_text(self) -> str:
        return '", "next": "' if self.accepted and self.accepted[-1] == self.at else ""


def test_a_draft_stops_where_jump_forward_would_take_over():
    spec, req = _speculation(), _req([1, 2], [3])
    req.grammar = _Forcing({4, 5, 6, 40}, at=5)  # 5: a closing quote, say
    assert spec._check_grammar(req, [4, 5, 6, 6], 0) == [4, 5]  # the rest would be dropped
    assert req.grammar.accepted == [] and spec._masks[0].shape == (3, 4)
    assert all(spec._masks[0][2] == spec._masks[0][0])  # the bonus row's mask is filled
    assert spec._check_grammar(req, [4, 4, 5], 1) == [4, 4, 5]  # ends there: kept whole
    spec.config = EngineConfig(enable_jump_forward=False)
    assert spec._check_grammar(req, [4, 5, 6], 2) == [4, 5, 6]  # no jump-forward: no cut


def test_a_drafters_expected_rate_plans_a_constrained_requests_budget():
    class Sure:
        def expected_rate(self, req):
            return 0.9 if req.rid == "json" else None

    spec = _speculation()
    spec.drafter = Sure()
    plain, json_req, other = _req([1], [2]), _req([1], [2]), _req([1], [2])
    json_req.rid, json_req.grammar, other.grammar = "json", _OnlyAllowed({4}), _OnlyAllowed({4})
    own = spec._rate(plain)
    assert spec._rates([plain, json_req, other]) == [own, 0.9, own]  # only where it knows
    spec.drafter = SimpleNamespace()  # a drafter without the method: the request's own rate
    assert spec._rates([json_req]) == [own]


def test_requests_without_room_get_no_draft():
    """The rule for who may draft: two or more tokens of budget left, room in the context,
    and free K/V slots (a draft never evicts the cache)."""
    from radixlm.runtime.kv_manager import KVManager

    spec = _speculation()  # a context of 64 tokens
    spec.kv = KVManager(capacity=40, num_rows=2, disable_radix_cache=False)
    spec.drafter = SimpleNamespace(propose=lambda req, n: [7] * n)
    req = _req(list(range(10)), [3])
    req.params.max_new_tokens = 2
    assert spec._limit(req) == 0  # the step samples the last token anyway
    req.params.max_new_tokens = 100
    assert spec._limit(req) == spec.config.speculative_num_draft_tokens
    assert spec.kv.admit(req, 0) and spec.kv.extend(req, req.fill_len)
    req.input_ids += [5] * 50  # 61 tokens: three positions left in the context
    req.kv_slots += [0] * 50  # (pretend they are computed)
    assert spec._limit(req) == 3
    req.input_ids, req.kv_slots = req.input_ids[:10], req.kv_slots[:11]
    free = spec.kv.slots.num_free
    assert spec._draft(req, 8, 0) == [7] * 8 and spec.kv.slots.num_free == free - 8
    spec.kv.alloc(spec.kv.slots.num_free - 3)  # three free slots left
    assert spec._draft(req, 8, 0) == [7] * 3  # cut to what is free
    spec.kv.alloc(3)
    assert spec._draft(req, 8, 0) == []


def test_metrics_report_speculation():
    from radixlm.server.metrics import ServerMetrics

    stats = {"spec_verify_ct_total": 10, "spec_emitted_tokens_total": 25,
             "spec_draft_tokens_total": 20, "spec_accepted_tokens_total": 15}
    text = ServerMetrics(lambda: stats).render().decode()
    assert "radixlm_spec_draft_tokens_total 20.0" in text
    assert "radixlm_spec_accepted_tokens_total 15.0" in text
    assert "radixlm_spec_verify_steps_total 10.0" in text
    assert "radixlm_spec_accept_rate 0.75" in text
    assert "radixlm_spec_accept_length 2.5" in text
    assert "radixlm_spec" not in ServerMetrics(lambda: {}).render().decode()  # off


# --------------------------------------------------------------------------- settings


def test_bad_settings_are_rejected_by_name():
    with pytest.raises(ValueError, match="speculative_algorithm='EAGLE'.*supported: NGRAM"):
        EngineConfig.from_kwargs(speculative_algorithm="EAGLE")
    with pytest.raises(ValueError, match="speculative_algorithm='MEDUSA2' is unknown"):
        EngineConfig.from_kwargs(speculative_algorithm="MEDUSA2")
    with pytest.raises(ValueError, match="speculative_num_draft_tokens must be in 1..32"):
        EngineConfig.from_kwargs(speculative_num_draft_tokens=0)
    with pytest.raises(ValueError, match="speculative_num_draft_tokens must be in 1..32"):
        EngineConfig.from_kwargs(speculative_num_draft_tokens=33)
    with pytest.raises(ValueError, match="speculative_ngram_min_match_window_size"):
        EngineConfig.from_kwargs(speculative_ngram_min_match_window_size=5,
                                 speculative_ngram_max_match_window_size=3)
    assert EngineConfig.from_kwargs(speculative_algorithm="ngram").speculative_algorithm == "NGRAM"
    assert EngineConfig.from_kwargs(speculative_algorithm="none").speculative_algorithm == "none"
    assert EngineConfig.from_kwargs().speculative_algorithm is None  # unset: the default
    assert resolve_algorithm(None, native_steps=True) == "NGRAM"
    assert resolve_algorithm(None, native_steps=False) is None
    assert resolve_algorithm("none", native_steps=True) is None
    assert resolve_algorithm("NGRAM", native_steps=False) == "NGRAM"
    # an int8 KV pool is not exact under drafts: off unless asked for by name
    assert resolve_algorithm(None, native_steps=True, quantized_kv=True) is None
    assert resolve_algorithm("NGRAM", native_steps=True, quantized_kv=True) == "NGRAM"
    args = build_parser().parse_args(["serve", "--speculative-algorithm", "NGRAM",
                                      "--speculative-num-draft-tokens", "5"])
    config = EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    assert (config.speculative_algorithm, config.speculative_num_draft_tokens) == ("NGRAM", 5)


# --------------------------------------------------------------------------- tiny model

PARAMS = {"temperature": 0, "max_new_tokens": 24, "ignore_eos": True}


def _prompts(n: int, seed: int = 0, shared: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(100, 40000) for _ in range(shared)]
    return [prefix + [rng.randrange(100, 40000) for _ in range(rng.randint(3, 30))]
            for _ in range(n)]


@pytest.fixture(scope="module")
def varied_model_dir(tmp_path_factory, tokenizer):
    """A 2-layer random Llama with SmolLM2's tokenizer whose greedy text varies (the shared
    tiny model repeats its prompt's last token forever) and keeps clear margins between
    its top tokens, so outputs and K/V mistakes show."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    out = tmp_path_factory.mktemp("varied-llama")
    vocab = len(tokenizer)
    LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.bos_token_id).save_pretrained(out)
    tokenizer.save_pretrained(out)
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape, scale=0.3):
        return torch.randn(*shape, generator=gen) * scale

    state = {"model.embed_tokens.weight": rnd(vocab, 64, scale=1.0),
             "lm_head.weight": rnd(vocab, 64, scale=1.0), "model.norm.weight": torch.ones(64)}
    shapes = {"self_attn.q_proj": (64, 64), "self_attn.k_proj": (32, 64),
              "self_attn.v_proj": (32, 64), "self_attn.o_proj": (64, 64),
              "mlp.gate_proj": (128, 64), "mlp.up_proj": (128, 64), "mlp.down_proj": (64, 128)}
    for i in range(2):
        p = f"model.layers.{i}."
        state[p + "input_layernorm.weight"] = torch.ones(64)
        state[p + "post_attention_layernorm.weight"] = torch.ones(64)
        state.update({f"{p}{name}.weight": rnd(*shape) for name, shape in shapes.items()})
    save_file(state, str(out / "model.safetensors"))
    (out / "generation_config.json").write_text('{"eos_token_id": 2}')
    return out


@pytest.fixture(scope="module")
def engine(varied_model_dir):
    with Engine(str(varied_model_dir), dtype="float32", max_total_tokens=4096,
                speculative_algorithm="NGRAM", log_level="warning") as engine:
        yield engine


def _run(engine, prompts, params, drafter, rids=None, **kw):
    """Outputs with ``drafter`` (None: speculation off), the cache flushed first."""
    use_drafter(engine, drafter)
    assert engine.flush_cache()
    rids = rids or [f"q{i}" for i in range(len(prompts))]
    outs = engine.generate(input_ids=prompts, sampling_params=params, rid=rids, **kw)
    engine.check_integrity()
    return outs


@pytest.fixture(scope="module")
def reference(engine):
    ps = _prompts(8) + _prompts(4, seed=1, shared=40)
    outs = _run(engine, ps, PARAMS, None)
    return ps, [o["output_ids"] for o in outs]


@pytest.mark.parametrize("mode", ["exact", "corrupt", "wrong"])
def test_greedy_with_drafts_equals_without(engine, reference, mode):
    ps, expected = reference
    rids = [f"q{i}" for i in range(len(ps))]
    drafter = ScriptedDrafter(dict(zip(rids, expected)), mode)
    before = dict(engine.get_stats())
    outs = _run(engine, ps, PARAMS, drafter)
    assert [o["output_ids"] for o in outs] == expected
    stats = engine.get_stats()
    drafted = stats["spec_draft_tokens_total"] - before["spec_draft_tokens_total"]
    accepted = stats["spec_accepted_tokens_total"] - before["spec_accepted_tokens_total"]
    assert drafted == sum(d for _, d, _ in drafter.observed) > 0
    assert accepted == sum(a for _, _, a in drafter.observed)
    if mode == "exact":
        assert accepted == drafted
        assert all(o["meta_info"]["spec_accept_length"] > 3 for o in outs)
    elif mode == "wrong":
        assert accepted == 0
    else:
        assert 0 < accepted < drafted
    assert sorted(drafter.released) == sorted(rids)
    meta = outs[0]["meta_info"]
    assert meta["spec_draft_token_num"] >= meta["spec_accept_token_num"]
    assert meta["spec_verify_ct"] >= 1
    cache = engine.scheduler.kv.cache
    assert_tree_holds_only(cache, [p + e for p, e in zip(ps, expected)])
    engine.scheduler.call(lambda: engine.scheduler.kv.check_counts([]))


def test_cached_drafted_text_serves_a_follow_up(engine, reference):
    """A follow-up turn reads the prefix a drafting request left in the cache: its output
    equals the same follow-up computed from scratch, so the cached K/V is the real one."""
    ps, expected = reference
    follow = ps[0] + expected[0] + [321, 654]
    kw = {"return_logprob": True, "top_logprobs_num": 5}
    use_drafter(engine, None)
    assert engine.flush_cache()
    fresh = engine.generate(input_ids=follow, sampling_params=PARAMS, **kw)
    drafter = ScriptedDrafter({"q0": expected[0]}, "corrupt")
    _run(engine, ps[:1], PARAMS, drafter)
    assert sum(d - a for _, d, a in drafter.observed) > 0  # drafts were rejected
    use_drafter(engine, None)
    again = engine.generate(input_ids=follow, sampling_params=PARAMS, **kw)
    assert again["meta_info"]["cached_tokens"] >= len(ps[0]) + len(expected[0]) - 1
    assert again["output_ids"] == fresh["output_ids"]
    for key in ("output_token_logprobs", "output_top_logprobs"):  # the K/V itself
        a, b = again["meta_info"][key], fresh["meta_info"][key]
        flat_a = np.array([x for e in a for x in (e if key.endswith("top_logprobs") else [e])],
                          dtype=object)
        flat_b = np.array([x for e in b for x in (e if key.endswith("top_logprobs") else [e])],
                          dtype=object)
        assert [t for _, t, _ in flat_a] == [t for _, t, _ in flat_b]
        assert np.allclose([v for v, _, _ in flat_a], [v for v, _, _ in flat_b], atol=1e-4)


def test_budgets_stops_and_eos_inside_drafts(engine, reference):
    ps, expected = reference
    off_params = [
        {**PARAMS, "max_new_tokens": 7},  # cut in the middle of a draft
        {**PARAMS, "stop_token_ids": [expected[1][9]]},  # a stop token inside a draft
        {**PARAMS, "stop_token_ids": [expected[2][3]], "min_new_tokens": 6},
        {"temperature": 0, "max_new_tokens": 24},  # EOS (drafted past the script's end)
        {**PARAMS, "max_new_tokens": 1},
    ]
    eos = next(iter(engine.eos_ids))
    scripts = {f"q{i}": expected[i] for i in range(5)}
    scripts["q3"] = expected[3][:5] + [eos]
    off = _run(engine, ps[:5], off_params, None)
    assert len(off[0]["output_ids"]) == 7 and len(off[4]["output_ids"]) == 1
    drafter = ScriptedDrafter(scripts, "exact", tail=[expected[0][0]] * 4)
    on = _run(engine, ps[:5], off_params, drafter)
    assert [o["output_ids"] for o in on] == [o["output_ids"] for o in off]
    assert [o["meta_info"]["finish_reason"] for o in on] == [
        o["meta_info"]["finish_reason"] for o in off]


@pytest.mark.parametrize("kind", ["stop", "stop_regex"])
def test_stop_strings_inside_drafts(engine, reference, tokenizer, kind):
    ps, expected = reference
    text = tokenizer.decode(expected[5])
    stop = text[len(text) // 2:len(text) // 2 + 4]
    params = {**PARAMS, kind: [stop if kind == "stop" else re.escape(stop[:2]) + "."]}
    off = _run(engine, ps[5:6], params, None)
    assert off[0]["meta_info"]["finish_reason"]["type"] == "stop"
    assert len(off[0]["output_ids"]) < len(expected[5])
    drafter = ScriptedDrafter({"q0": expected[5]})
    on = _run(engine, ps[5:6], params, drafter)
    assert on[0]["text"] == off[0]["text"]
    assert on[0]["output_ids"] == off[0]["output_ids"]
    assert on[0]["meta_info"]["finish_reason"] == off[0]["meta_info"]["finish_reason"]
    assert sum(a for _, _, a in drafter.observed) > 0


def test_logprobs_with_drafts(engine, reference):
    ps, expected = reference
    kw = {"return_logprob": True, "top_logprobs_num": 3, "logprob_start_len": 0}
    off = _run(engine, ps[:3], PARAMS, None, **kw)
    on = _run(engine, ps[:3], PARAMS, ScriptedDrafter(
        {f"q{i}": expected[i] for i in range(3)}, "corrupt"), **kw)
    for a, b in zip(on, off):
        assert a["output_ids"] == b["output_ids"]
        for key in ("output_token_logprobs", "input_token_logprobs"):
            la, lb = a["meta_info"][key], b["meta_info"][key]
            assert [t for _, t, _ in la] == [t for _, t, _ in lb]
            assert np.allclose([x or 0 for x, _, _ in la], [x or 0 for x, _, _ in lb],
                               atol=1e-4)
        tops_a = [[t for _, t, _ in top] for top in a["meta_info"]["output_top_logprobs"]]
        tops_b = [[t for _, t, _ in top] for top in b["meta_info"]["output_top_logprobs"]]
        assert tops_a == tops_b


def test_seeded_sampling_with_drafts_equals_without(engine, reference):
    """Same seed, same tokens: each verification row draws the uniform decoding would,
    and the RNG is rewound to one draw per emitted token (also with n > 1)."""
    ps = reference[0][:4]
    params = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.001,
              "frequency_penalty": 0.5, "presence_penalty": 0.3, "repetition_penalty": 1.1,
              "logit_bias": {"500": 2.0}, "max_new_tokens": 20, "ignore_eos": True,
              "seed": 11, "n": 2}
    off = _run(engine, ps, params, None, rids=[f"s{i}" for i in range(4)])
    scripts = {o["meta_info"]["id"]: o["output_ids"] for o in off}
    assert len(set(map(tuple, scripts.values()))) == 8  # the samples differ
    for mode in ("exact", "corrupt"):
        drafter = ScriptedDrafter(scripts, mode)
        on = _run(engine, ps, params, drafter, rids=[f"s{i}" for i in range(4)])
        assert [o["output_ids"] for o in on] == [o["output_ids"] for o in off]
        assert sum(a for _, _, a in drafter.observed) > 0


def test_retraction_with_drafts(tiny_model_dir, reference):
    """A pool far too small: requests are retracted (between steps, so with their drafts
    settled) and resumed; the outputs are those of a roomy engine. (On the shared tiny
    model, whose greedy text has wide margins: a resumed request's recomputed K/V comes
    from steps of other sizes, which on the varied model moves near ties even without
    drafts.)"""
    ps = reference[0]
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096,
                speculative_algorithm="none", log_level="warning") as roomy:
        expected = [o["output_ids"] for o in roomy.generate(input_ids=ps,
                                                             sampling_params=PARAMS)]
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=180,
                speculative_algorithm="NGRAM", log_level="warning") as small:
        drafter = ScriptedDrafter({f"q{i}": e for i, e in enumerate(expected)}, "corrupt")
        outs = _run(small, ps, PARAMS, drafter)
        assert [o["output_ids"] for o in outs] == expected
        assert small.get_stats()["num_retractions_total"] > 0
        assert small.get_stats()["spec_accepted_tokens_total"] > 0


def test_aborts_with_drafts_free_everything(engine, reference):
    ps, expected = reference
    drafter = ScriptedDrafter({f"a{i}": expected[i % len(expected)] for i in range(12)},
                              "corrupt")
    use_drafter(engine, drafter)
    results = {}

    def worker(i):
        results[i] = engine.generate(input_ids=ps[i % len(ps)], rid=f"a{i}",
                                     sampling_params={**PARAMS, "max_new_tokens": 60})

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for i in range(0, 12, 3):
        engine.abort(f"a{i}")
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 12
    kinds = {r["meta_info"]["finish_reason"]["type"] for r in results.values()}
    assert kinds <= {"length", "abort"} and "length" in kinds
    engine.check_integrity()
    assert engine.get_stats()["num_running"] == 0
    assert sorted(drafter.released) == sorted(f"a{i}" for i in range(12))


def test_a_failing_verification_step_frees_its_drafts(engine, reference):
    """The first steps that verify drafts raise: their drafts are withdrawn, the requests
    run alone without them, and the outputs are unchanged."""
    ps, expected = reference
    runner = engine.runner
    failures = []
    parts = [p for p in (runner.model, runner.native) if p is not None]
    originals = [p.forward for p in parts]

    def fragile(batch, *args, _original):
        if batch.act_rows is not None and len(failures) < 3:
            failures.append(batch.num_tokens)
            raise RuntimeError("verification failed")
        return _original(batch, *args)

    for part, original in zip(parts, originals):
        part.forward = lambda batch, *a, _o=original: fragile(batch, *a, _original=_o)
    try:
        drafter = ScriptedDrafter({f"q{i}": e for i, e in enumerate(expected)}, "corrupt")
        outs = _run(engine, ps, PARAMS, drafter)
    finally:
        for part in parts:
            del part.forward
    assert len(failures) == 3
    assert [o["output_ids"] for o in outs] == expected
    engine.scheduler.call(lambda: engine.scheduler.kv.check_counts([]))


def test_prompt_lookup_on_a_repeating_prompt(engine):
    """The engine's own drafter and cost model: a prompt the tiny model echoes is drafted
    from, and the output is what decoding gives."""
    rng = random.Random(7)
    unit = [rng.randrange(100, 40000) for _ in range(12)]
    prompt = unit * 6
    params = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}
    use_drafter(engine, None)
    assert engine.flush_cache()
    off = engine.generate(input_ids=prompt, sampling_params=params)
    spec = engine.scheduler.speculation
    spec.drafter = create_drafter(engine.config, engine.scheduler.kv.cache, True)
    spec.costs = StepCosts()
    on = engine.generate(input_ids=prompt, sampling_params=params)
    assert on["output_ids"] == off["output_ids"]
    assert on["meta_info"]["spec_verify_ct"] > 0
    engine.check_integrity()


def test_streams_get_the_chunks_they_get_without_drafts(engine, reference):
    ps, expected = reference
    for params in (PARAMS, {**PARAMS, "stream_interval": 5}):
        chunks = []
        for drafter in (None, ScriptedDrafter({"st": expected[0]})):
            use_drafter(engine, drafter)
            assert engine.flush_cache()
            stream = engine.generate(input_ids=ps[0], sampling_params=params, stream=True,
                                     rid="st")
            chunks.append([c["output_ids"] for c in stream])
        assert chunks[0] == chunks[1]
        assert chunks[1][-1] == expected[0]
        assert sum(a for _, _, a in drafter.observed) > 10


def test_a_request_failing_while_its_drafts_apply_spares_the_rest(engine, reference):
    ps, expected = reference
    post = engine.scheduler.postprocessor
    original = post._on_token

    def flaky(req, token, logprob):
        if req.rid == "q1" and len(req.output_ids) >= 6:
            raise RuntimeError("boom")
        return original(req, token, logprob)

    post._on_token = flaky
    try:
        drafter = ScriptedDrafter({f"q{i}": expected[i] for i in range(3)})
        outs = _run(engine, ps[:3], PARAMS, drafter)
    finally:
        del post._on_token
    assert outs[1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert [outs[0]["output_ids"], outs[2]["output_ids"]] == [expected[0], expected[2]]
    engine.scheduler.call(lambda: engine.scheduler.kv.check_counts([]))


def test_a_drafter_that_raises_or_returns_junk_changes_nothing(engine, reference):
    ps, expected = reference

    class Broken(ScriptedDrafter):
        def propose(self, req, max_tokens):
            if req.rid == "q0":
                raise RuntimeError("drafter bug")
            if req.rid == "q1":
                return [-1, 10**9]
            return super().propose(req, max_tokens)

    drafter = Broken({f"q{i}": expected[i] for i in range(3)})
    outs = _run(engine, ps[:3], PARAMS, drafter)
    assert [o["output_ids"] for o in outs] == expected[:3]
    assert {rid for rid, _, _ in drafter.observed} == {"q2"}
