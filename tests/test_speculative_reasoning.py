"""Speculative decoding through the grammar-after-thinking wrapper: drafts of a reasoning
model's thinking block, its end tag and the JSON answer after it are checked by the
wrapper's own mask, accept and rollback (thinking budget included), and the outputs are
those of decoding without drafts.

Two paths. The tiny model as Llama runs on the native library, whose step rounding
depends only on the step's token count class (``ForwardBatch.act_rows``), so seeded
sampling with drafts gives the very tokens it gives without. As Qwen3 it runs on the torch
reference path (``weight_quant="none"``: the native layer runs Qwen3 too), which rounds a
row by the shape of the call it is in (MKL's sgemm by the GEMM's row count, measured; with
the GEMMs padded to row-invariant shapes the sampled run still differed, so attention's
kernels do too), so a verification row may differ from the decode step's in the last bit,
and a sampled token between near-tied probabilities with it: there the drafts are verified
greedily, where such a bit does not move the argmax."""

from __future__ import annotations

import json
import random

import pytest
from spec_fakes import ScriptedDrafter, use_drafter
from test_reasoning_e2e import SCHEMA, WORDS, _build, _reasoning_tokens, _think_ids

from radixlm.runtime.engine import Engine

# family -> sampling settings its path reproduces bit for bit with drafts
FAMILIES = {"llama": {"temperature": 0.9, "top_p": 0.95}, "qwen3": {"temperature": 0}}


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request, tmp_path_factory, tokenizer):
    """(engine, family)"""
    out = tmp_path_factory.mktemp(f"tiny-{request.param}-thinking-spec")
    _build(out, tokenizer, request.param)
    torch_path = {} if request.param == "llama" else {"weight_quant": "none"}
    with Engine(str(out), reasoning_parser="qwen3", dtype="float32", max_total_tokens=16384,
                speculative_algorithm="NGRAM", log_level="warning", **torch_path) as engine:
        assert (engine.runner.native is not None) == (request.param == "llama")
        yield engine, request.param


@pytest.mark.parametrize("mode", ["exact", "corrupt"])
def test_drafts_through_thinking_budget_and_schema(served, mode):
    engine, family = served
    tok = engine.tokenizer
    _, end_id = _think_ids(tok)
    rng = random.Random(5)
    prompts, params, rids = [], [], []
    for i in range(12):
        text = " ".join(rng.choices(WORDS, k=rng.randint(1, 10)))
        ids = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                      add_generation_prompt=True)
        prompts.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
        budget = rng.randint(0, 24)
        params.append({"max_new_tokens": budget + 80, "thinking_budget": budget,
                       **FAMILIES[family], "seed": i,
                       "json_schema": json.dumps(SCHEMA)})
        rids.append(f"r{i}")
    use_drafter(engine, None)
    # the schema's grammar compiled first: both runs below then find it built, so their
    # requests all leave the grammar queue at once (a first build completes them one by
    # one, so the scheduler may admit them over different steps than the second run's)
    engine.generate(input_ids=prompts[:1], sampling_params=params[:1])
    assert engine.flush_cache()
    off = engine.generate(input_ids=prompts, sampling_params=params, rid=rids)
    drafter = ScriptedDrafter({o["meta_info"]["id"]: o["output_ids"] for o in off}, mode)
    use_drafter(engine, drafter)
    assert engine.flush_cache()
    on = engine.generate(input_ids=prompts, sampling_params=params, rid=rids)
    engine.check_integrity()
    assert [o["output_ids"] for o in on] == [o["output_ids"] for o in off]
    for out, p in zip(on, params):
        assert _reasoning_tokens(out["output_ids"], end_id) <= p["thinking_budget"]
        assert out["meta_info"]["finish_reason"]["type"] == "stop"
    drafted = sum(d for _, d, _ in drafter.observed)
    accepted = sum(a for _, _, a in drafter.observed)
    # (even exact drafts lose their tokens past a jump-forward: the forced text replaces
    # them, retokenized)
    assert 0 < accepted < drafted
    assert accepted > drafted / 2 if mode == "exact" else accepted < drafted * 0.8
