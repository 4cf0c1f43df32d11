"""Embeddings (``Engine.encode``) against transformers' mean-pooled, L2-normalised
``last_hidden_state`` (``AutoModel``: the hidden states after the final norm), on the
embedded model's native path and on a tiny random Qwen2 on the torch path (built here, its
prompts cut into prefill chunks); batches, a cached prefix, concurrent generations,
``dimensions`` and bad inputs.

Tolerances. The fp32 engines compute what transformers computes in fp32 with other
summation orders (blocked matmuls, attention reduced per query): each of 30 layers adds
relative errors of a few fp32 epsilons (1.2e-7), and a unit vector's entries then differ
by ~1e-6 at most (measured 6e-7); ATOL = 1e-5 leaves 10x room and still fails on any real
mistake (a missing position moves entries by ~1e-2, the pre-norm residual by ~1). The
default engine rounds activations to int8 blocks at every step size (llama.cpp's numbers;
batch-invariant, so its comparisons of a batch with each text alone are exact): cosine to
fp32 asserted >= 0.999. The fp32 engine's kernels sum by step size, so two of its runs are
compared bit for bit only where both ran alone in the same steps.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

ATOL = 1e-5
TEXTS = ["The cat sat on the mat.", "How do I bake bread at home?",
         "The stock market fell sharply today, and investors worried about interest rates."]
# (a, b): b says what a says in other words; a pair is closer than any a and another b
PAIRS = [("The cat sat on the mat.", "A cat was sitting on the mat."),
         ("How do I bake bread at home?", "What is a good recipe for homemade bread?"),
         ("The stock market fell sharply today.", "Share prices dropped steeply this afternoon.")]


def reference(model, ids: list[int]) -> np.ndarray:
    """transformers: mean of ``last_hidden_state`` over the positions, L2-normalised."""
    with torch.no_grad():
        h = model(torch.tensor([ids])).last_hidden_state[0].double().mean(0)
    return (h / h.norm()).numpy()


def vec(out: dict) -> np.ndarray:
    return np.asarray(out["embedding"], dtype=np.float64)


def test_embedded_model_matches_transformers(engine_fp32, hf_model, tokenizer):
    outs = engine_fp32.encode(TEXTS)
    assert len(outs) == len(TEXTS)
    for text, out in zip(TEXTS, outs):
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert out["meta_info"]["prompt_tokens"] == len(ids)
        assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
        assert len(out["embedding"]) == hf_model.config.hidden_size
        assert all(isinstance(x, float) for x in out["embedding"])
        np.testing.assert_allclose(vec(out), reference(hf_model.model, ids), atol=ATOL)
    # the same through token ids, as input_ids= and as SGLang's prompt of ids: each alone,
    # as the text is here (fp32 activations sum by step size: the text's row in the batch
    # above may be other bits; alone or batched alike is the default engine's, below)
    ids = tokenizer.encode(TEXTS[1], add_special_tokens=False)
    alone = engine_fp32.encode(TEXTS[1])["embedding"]
    assert engine_fp32.encode(input_ids=ids)["embedding"] == alone
    assert engine_fp32.encode(ids)["embedding"] == alone
    engine_fp32.check_integrity()


def test_default_engine_is_close_to_transformers(hf_model, tokenizer):
    from radixlm.runtime.engine import Engine

    with Engine(max_total_tokens=4096, log_level="warning") as engine:
        for text, out in zip(TEXTS, engine.encode(TEXTS)):
            ref = reference(hf_model.model, tokenizer.encode(text, add_special_tokens=False))
            assert float(vec(out) @ ref) >= 0.999


def test_batch_equals_each_alone_and_beside_generations(engine_default):
    """A token's hidden state does not depend on what shares its step (the default native
    path, batch-invariant: the same bits by construction; fp32 activations sum by step
    size)."""
    engine = engine_default
    alone = [engine.encode(t)["embedding"] for t in TEXTS]
    assert [o["embedding"] for o in engine.encode(TEXTS)] == alone

    async def mixed():
        gens = [engine.async_generate(t, {"max_new_tokens": 6, "ignore_eos": True})
                for t in TEXTS]
        return await asyncio.gather(engine.async_encode(TEXTS[::-1]), *gens)

    embedded, *generated = asyncio.run(mixed())
    assert [o["embedding"] for o in embedded] == alone[::-1]
    assert all(g["meta_info"]["completion_tokens"] == 6 for g in generated)


def test_cached_prefix_gives_the_cold_embedding(engine_fp32, hf_model, tokenizer):
    """An encode request computes every position even when the cache holds its prefix;
    its K/V goes to the cache for the requests after it."""
    assert engine_fp32.flush_cache()
    prompt = "Radix trees share prompt prefixes between requests, which saves"
    cold = engine_fp32.encode(prompt)
    n = cold["meta_info"]["prompt_tokens"]
    follow = engine_fp32.generate(prompt + " time", {"max_new_tokens": 1})
    assert follow["meta_info"]["cached_tokens"] >= n - 1  # the encode request's K/V
    warm = engine_fp32.encode(prompt)
    assert warm["meta_info"]["cached_tokens"] == 0
    assert warm["embedding"] == cold["embedding"]
    longer = prompt + " time and memory"
    ids = tokenizer.encode(longer, add_special_tokens=False)
    np.testing.assert_allclose(vec(engine_fp32.encode(longer)), reference(hf_model.model, ids),
                               atol=ATOL)
    engine_fp32.check_integrity()


def test_similar_sentences_are_closer(engine_fp32):
    a = np.array([o["embedding"] for o in engine_fp32.encode([p[0] for p in PAIRS])])
    b = np.array([o["embedding"] for o in engine_fp32.encode([p[1] for p in PAIRS])])
    sim = a @ b.T
    for i in range(len(PAIRS)):
        others = [sim[i, j] for j in range(len(PAIRS)) if j != i]
        others += [sim[j, i] for j in range(len(PAIRS)) if j != i]
        assert sim[i, i] > max(others) + 0.02, sim


def test_dimensions_truncate_then_renormalise(engine_fp32):
    full = vec(engine_fp32.encode(TEXTS[0]))
    np.testing.assert_allclose(np.linalg.norm(full), 1.0, atol=1e-6)
    short = vec(engine_fp32.encode(TEXTS[0], dimensions=32))
    assert short.shape == (32,)
    np.testing.assert_allclose(short, full[:32] / np.linalg.norm(full[:32]), atol=1e-6)
    hidden = len(full)
    assert len(engine_fp32.encode(TEXTS[0], dimensions=hidden)["embedding"]) == hidden


@pytest.mark.parametrize("kwargs, words", [
    ({"prompt": ""}, "input is empty"),
    ({"prompt": []}, "input is empty"),
    ({"prompt": ["ok", ""]}, "input[1] is empty"),
    ({"input_ids": [[5, 6], []]}, "input[1] is empty"),
    ({"input_ids": [1, 10**7]}, "token id outside"),
    ({"prompt": "x", "input_ids": [1]}, "exactly one of prompt and input_ids"),
    ({"prompt": [1.5]}, "prompt must be a string or a list of strings"),
    ({"prompt": "x", "dimensions": 0}, "dimensions=0"),
    ({"prompt": "x", "dimensions": 10_000}, "dimensions=10000"),
    ({"prompt": "x", "dimensions": True}, "dimensions=True"),
])
def test_bad_inputs_raise_value_error_naming_the_problem(engine_fp32, kwargs, words):
    with pytest.raises(ValueError) as info:
        engine_fp32.encode(**kwargs)
    assert words in str(info.value)


def test_input_over_the_context(engine_fp32):
    ctx = engine_fp32.context_len
    with pytest.raises(ValueError, match=f"input has {ctx + 1} tokens; the context is {ctx}"):
        engine_fp32.encode(input_ids=[5] * (ctx + 1))
    assert engine_fp32.get_stats()["num_waiting"] == 0


# ---------------------------------------------------------------- the torch path


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory, tokenizer):
    """A 2-layer random Qwen2 (q/k/v biases, untied head, random norms) on the torch path,
    prefill chunks of 16 tokens."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from radixlm.runtime.engine import Engine

    cfg = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=256, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name
                    else 0.15 * torch.randn_like(p))
    out = tmp_path_factory.mktemp("tiny-qwen2")
    hf.save_pretrained(out)
    tokenizer.save_pretrained(out)
    with Engine(str(out), dtype="float32", weight_quant="none", max_total_tokens=2048,
                chunked_prefill_size=16, log_level="warning") as engine:
        assert engine.runner.native is None  # the torch model runs every step
        yield hf, engine


def test_torch_path_matches_transformers_across_chunks(tiny_qwen2):
    hf, engine = tiny_qwen2
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, hf.config.vocab_size, (n,), generator=gen).tolist()
               for n in (5, 13, 40)]  # 40 tokens: three prefill chunks
    outs = engine.encode(input_ids=prompts)
    for ids, out in zip(prompts, outs):
        np.testing.assert_allclose(vec(out), reference(hf.model, ids), atol=ATOL)
    for ids, out in zip(prompts, outs):  # alone, and after its prefix was cached
        np.testing.assert_allclose(vec(engine.encode(input_ids=ids)), vec(out), atol=1e-6)
    engine.generate(input_ids=prompts[2][:30], sampling_params={"max_new_tokens": 1})
    np.testing.assert_allclose(vec(engine.encode(input_ids=prompts[2])), vec(outs[2]),
                               atol=1e-6)
    # an embedding adds no token: a prompt filling the whole context is embedded
    full = [7] * engine.context_len
    np.testing.assert_allclose(vec(engine.encode(input_ids=full)), reference(hf.model, full),
                               atol=ATOL)
    with pytest.raises(ValueError, match="input has 257 tokens; the context is 256"):
        engine.encode(input_ids=full + [7])
    engine.check_integrity()
