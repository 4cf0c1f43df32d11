"""The real SmolLM2 weights against transformers' LlamaForCausalLM (fp32)."""

from __future__ import annotations

import pytest
import torch

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "List three colors:\n1.",
    "In 1969, the first humans",
    "Translate to French: Good morning, my friend.",
    "Q: What is 12 times 12?\nA:",
    "Once upon a time, in a small village,",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def hf_greedy(hf_model, tokenizer):
    outs = []
    for p in PROMPTS:
        ids = torch.tensor([tokenizer.encode(p, add_special_tokens=False)])
        with torch.no_grad():
            gen = hf_model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                    attention_mask=torch.ones_like(ids), pad_token_id=2)
        outs.append(gen[0, ids.shape[1]:].tolist())
    return outs


def test_prefill_and_decode_logprobs_match_transformers(engine_fp32, hf_model, tokenizer):
    prompt = "The quick brown fox jumps over the lazy dog because"
    out = engine_fp32.generate(prompt, {"temperature": 0, "max_new_tokens": 6},
                               return_logprob=True, logprob_start_len=0, top_logprobs_num=5)
    ids = tokenizer.encode(prompt, add_special_tokens=False) + out["output_ids"]
    with torch.no_grad():
        ref = torch.log_softmax(hf_model(torch.tensor([ids])).logits[0].float(), dim=-1)
    meta = out["meta_info"]
    n_in = meta["prompt_tokens"]
    assert meta["input_token_logprobs"][0][0] is None
    assert len(meta["input_token_logprobs"]) == n_in
    for pos in range(1, n_in):  # prefill logits
        lp, tid, _ = meta["input_token_logprobs"][pos]
        assert tid == ids[pos]
        assert lp == pytest.approx(ref[pos - 1, tid].item(), abs=2e-3)
    for k, (lp, tid, _) in enumerate(meta["output_token_logprobs"]):  # decode logits
        assert tid == int(ref[n_in + k - 1].argmax())
        assert lp == pytest.approx(ref[n_in + k - 1, tid].item(), abs=2e-3)
        top = meta["output_top_logprobs"][k]
        assert [t for _, t, _ in top] == ref[n_in + k - 1].topk(5).indices.tolist()


def test_greedy_text_matches_transformers_alone_and_batched(engine_fp32, hf_greedy):
    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS}
    batched = engine_fp32.generate(PROMPTS, params)
    for p, expected, b in zip(PROMPTS, hf_greedy, batched):
        assert b["output_ids"] == expected, p
    alone = engine_fp32.generate(PROMPTS[3], params)
    assert alone["output_ids"] == hf_greedy[3]
    engine_fp32.check_integrity()


def test_greedy_independent_of_chunk_size_and_order(hf_greedy, model_dir):
    from radixlm.runtime.engine import Engine

    params = {"temperature": 0, "max_new_tokens": NEW_TOKENS}
    with Engine(str(model_dir), dtype="float32", native_activations="fp32",
                chunked_prefill_size=7, max_total_tokens=4096, disable_radix_cache=True,
                kv_mirror_mb=0, log_level="warning") as engine:
        reversed_out = engine.generate(PROMPTS[::-1], params)
        for expected, got in zip(hf_greedy[::-1], reversed_out):
            assert got["output_ids"] == expected
        engine.check_integrity()
