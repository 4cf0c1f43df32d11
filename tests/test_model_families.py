"""Each supported model family against transformers' own implementation, in fp32.

A tiny random model per family (2 layers, hidden 64, random norms too) is built from the
family's transformers config class and written as safetensors with SmolLM2's tokenizer.
Through radixlm's Engine on its reference path (``weight_quant="none"``: dense torch):
prompt and decode logprobs against transformers (prompt: one forward; decode:
``generate``'s own logits), greedy tokens equal to ``generate``'s, batched, and again for
a follow-up that hits the radix cache. Windows (8), soft-caps and the longrope switch (32)
are small so the prompts cross them. And with default settings (the native CPU path where
it runs the family): a checkpoint runs at its own precision, fp32 here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from radixlm.runtime.models.shape import ModelConfig

NEW_TOKENS = 8
TOL = 2e-3  # logprob, absolute
SMALL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256}


def _configs(vocab: int) -> dict:
    from transformers import (
        Gemma2Config,
        Gemma3Config,
        Gemma3TextConfig,
        LlamaConfig,
        MistralConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
    )

    common = {**SMALL, "vocab_size": vocab, "bos_token_id": 1, "eos_token_id": 2,
              "pad_token_id": 2}
    return {
        "llama3": LlamaConfig(**common, tie_word_embeddings=True, rope_parameters={
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32}),
        "qwen2.5": Qwen2Config(**common, tie_word_embeddings=False,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        # Mistral v0.3's shape (no sliding window), untied head
        "mistral": MistralConfig(**common, tie_word_embeddings=False, sliding_window=None),
        "qwen3": Qwen3Config(**common, head_dim=32, tie_word_embeddings=True,
                             use_sliding_window=True, sliding_window=8, max_window_layers=1),
        # Qwen3 as its releases are (no sliding layers): the native layer with q/k norms;
        # head_dim 32 x 4 heads: q wider than the hidden size, as Qwen3-4B's
        "qwen3-full": Qwen3Config(**common, head_dim=32, tie_word_embeddings=False),
        "gemma2": Gemma2Config(**common, head_dim=16, query_pre_attn_scalar=24,
                               attn_logit_softcapping=2.0, final_logit_softcapping=6.0,
                               sliding_window=8),
        "gemma3": Gemma3TextConfig(
            **common, head_dim=16, query_pre_attn_scalar=24, sliding_window=8,
            layer_types=["sliding_attention", "full_attention"], rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0,
                                   "rope_theta": 1e6}}),
        # Gemma 3 4B and up: a multimodal checkpoint, served as its text model
        "gemma3-mm": Gemma3Config(
            text_config={**common, "head_dim": 16, "query_pre_attn_scalar": 24,
                         "sliding_window": 8, "layer_types": [
                             "sliding_attention", "full_attention"]},
            vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                           "num_attention_heads": 2, "image_size": 28, "patch_size": 14},
            mm_tokens_per_image=4, eos_token_id=[2, 106]),
        "phi3": Phi3Config(**common, tie_word_embeddings=False, sliding_window=12,
                           original_max_position_embeddings=32, rope_parameters={
                               "rope_type": "longrope", "rope_theta": 10000.0,
                               "partial_rotary_factor": 0.5,
                               "short_factor": [1.0, 1.3, 2.0, 3.5],
                               "long_factor": [1.5, 2.5, 5.0, 9.0]}),
    }


FAMILIES = ["llama3", "qwen2.5", "qwen3", "qwen3-full", "gemma2", "gemma3", "gemma3-mm", "phi3"]


def _build(family: str, tokenizer, out):
    """Random-weight HF model of ``family`` saved (safetensors + tokenizer) in ``out``."""
    return _build_from(_configs(len(tokenizer))[family], tokenizer, out)


def _build_from(cfg, tokenizer, out):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    norm_base = 0.0 if cfg.model_type.startswith("gemma") else 1.0  # Gemma stores w - 1
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(norm_base + 0.3 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.15)
    model.save_pretrained(out)
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return model


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory, tokenizer):
    from radixlm.runtime.engine import Engine

    out = tmp_path_factory.mktemp(request.param)
    hf = _build(request.param, tokenizer, out)
    with Engine(str(out), dtype="float32", weight_quant="none", max_total_tokens=2048,
                log_level="warning") as engine:
        yield request.param, hf, engine


def _prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (5, 13, 30)]


def _reference(hf, prompt: list[int], new_tokens: int = NEW_TOKENS
               ) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """transformers' greedy tokens, prompt logprobs [P, V] and decode logprobs [N, V].

    Phi-3 decodes step by step through transformers' forward and KV cache rather than
    ``generate``: at longrope's switch ``generate`` drops the cache and re-encodes the whole
    sequence with the long factors, which a shared radix-cached prefix cannot do; the model
    itself (what radixlm implements) rotates each new position with the factors of its
    step, and the keys already cached keep theirs."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        prompt_lp = torch.log_softmax(hf(ids).logits[0].float(), -1)
        if hf.config.model_type == "phi3":
            tokens, logits = _step_by_step(hf, prompt, new_tokens)
            return tokens, prompt_lp, torch.log_softmax(logits, -1)
        gen = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          output_logits=True, return_dict_in_generate=True, pad_token_id=2)
    decode_lp = torch.log_softmax(torch.cat(gen.logits).float(), -1)
    return gen.sequences[0, len(prompt):].tolist(), prompt_lp, decode_lp


def _step_by_step(hf, prompt: list[int], new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy decode through transformers' forward with its DynamicCache."""
    from transformers import DynamicCache

    cache, tokens, logits = DynamicCache(config=hf.config), [], []
    step = torch.tensor([prompt])
    for _ in range(new_tokens):
        pos = torch.arange(len(prompt) + len(tokens) - step.shape[1],
                           len(prompt) + len(tokens))[None]
        last = hf(step, cache=cache, use_cache=True, position_ids=pos).logits[0, -1].float()
        logits.append(last)
        tokens.append(int(last.argmax()))
        step = torch.tensor([[tokens[-1]]])
    return tokens, torch.stack(logits)


PARAMS = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


def _check(out: dict, prompt: list[int], ref, prompt_logprobs: bool = True) -> None:
    expected, prompt_lp, decode_lp = ref
    assert out["output_ids"] == expected
    meta = out["meta_info"]
    if prompt_logprobs:
        for pos in range(1, len(prompt)):
            lp, tid, _ = meta["input_token_logprobs"][pos]
            assert tid == prompt[pos]
            assert lp == pytest.approx(prompt_lp[pos - 1, tid].item(), abs=TOL)
    for k, (lp, tid, _) in enumerate(meta["output_token_logprobs"]):
        assert lp == pytest.approx(decode_lp[k, tid].item(), abs=TOL)


def test_logprobs_and_greedy_match_transformers(family):
    name, hf, engine = family
    if name == "gemma3-mm":  # the outer config's end-of-turn id reaches the engine
        assert 106 in engine.eos_ids
    assert engine.runner.model.native_unsupported() is None  # (every family runs natively)
    prompts = _prompts(hf.config.get_text_config().vocab_size)
    outs = engine.generate(input_ids=prompts, sampling_params=PARAMS, return_logprob=True,
                           logprob_start_len=0)
    for prompt, out in zip(prompts, outs):
        _check(out, prompt, _reference(hf, prompt))
    # A follow-up turn: the first turn (prompt + output) comes from the radix cache.
    follow = prompts[1] + outs[1]["output_ids"] + [7, 8, 9]
    again = engine.generate(input_ids=follow, sampling_params=PARAMS, return_logprob=True)
    assert again["meta_info"]["cached_tokens"] >= len(prompts[1])
    _check(again, follow, _reference(hf, follow), prompt_logprobs=False)
    engine.check_integrity()


@pytest.mark.parametrize("name", ["llama3", "qwen2.5", "mistral", "qwen3", "qwen3-full",
                                  "gemma2", "gemma3", "phi3"])
def test_checkpoint_runs_at_its_own_precision_by_default(name, tmp_path, tokenizer):
    """An fp32 safetensors checkpoint with default settings runs fp32, natively too (dense
    fp32 rows, fp32 activations, where the native library builds): 12 greedy tokens equal
    to transformers' fp32 ``generate`` and every logprob within TOL, batched; and the
    start log's precision says so."""
    from radixlm.native import build
    from radixlm.runtime.engine import Engine

    hf = _build(name, tokenizer, tmp_path)
    prompts = _prompts(hf.config.get_text_config().vocab_size, seed=3)
    params = {**PARAMS, "max_new_tokens": 12}
    with Engine(str(tmp_path), max_total_tokens=2048, log_level="warning") as engine:
        assert engine.runner.dtype == torch.float32
        assert (engine.runner.native is not None) == (build.load() is not None)
        assert engine.runner.precision == {"weights": "fp32", "activations": "fp32"}
        outs = engine.generate(input_ids=prompts, sampling_params=params, return_logprob=True,
                               logprob_start_len=0)
        for prompt, out in zip(prompts, outs):
            _check(out, prompt, _reference(hf, prompt, new_tokens=12))
        engine.check_integrity()


@pytest.mark.parametrize("name", ["gemma2", "gemma3"])
def test_gather_path_and_chunked_prefill(name, tmp_path, tokenizer):
    """Without the K/V mirror (decode gathers through req_to_token) and with prefill chunks
    of 7 (extends over a cached prefix), windows and soft-caps still match."""
    from radixlm.runtime.engine import Engine

    hf = _build(name, tokenizer, tmp_path)
    prompts = _prompts(hf.config.get_text_config().vocab_size, seed=1)
    with Engine(str(tmp_path), dtype="float32", weight_quant="none", max_total_tokens=2048,
                kv_mirror_mb=0, chunked_prefill_size=7, log_level="warning") as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=PARAMS)
        for prompt, out in zip(prompts, outs):
            assert out["output_ids"] == _reference(hf, prompt)[0]
        engine.check_integrity()


def test_window_as_long_as_the_context_is_dropped(tmp_path, tokenizer):
    from radixlm.runtime.engine import Engine

    _build("phi3", tokenizer, tmp_path)  # window 12 on every layer
    for context, windows in ((12, [None, None]), (13, [12, 12])):
        with Engine(str(tmp_path), dtype="float32", max_total_tokens=64,
                    context_length=context, log_level="warning") as engine:
            assert [o.window for o in engine.runner.attn.layers] == windows


def test_config_switches_are_read_from_the_hf_config(tokenizer):
    cfgs = {name: ModelConfig.from_hf(c.get_text_config())
            for name, c in _configs(len(tokenizer)).items()}
    assert cfgs["qwen3"].qk_norm and cfgs["qwen3"].layer_types == (
        "full_attention", "sliding_attention")
    g2 = cfgs["gemma2"]
    assert (g2.norm_offset, g2.sandwich_norm, g2.act, g2.embed_scale) == (1.0, True,
                                                                           "gelu_tanh", 8.0)
    assert (g2.attn_softcap, g2.final_softcap, g2.sliding_window) == (2.0, 6.0, 8)
    assert g2.attn_scale == pytest.approx(24**-0.5)
    assert g2.window(0) == 8 and g2.window(1) is None
    assert cfgs["phi3"].rotary_dim == 8 and cfgs["phi3"].window(1) == 12


def test_unsupported_architecture_is_refused_by_name():
    from transformers import GPT2Config

    with pytest.raises(ValueError, match="'gpt2' is not supported"):
        ModelConfig.from_hf(GPT2Config())


def test_triton_backend_refuses_softcap_and_window():
    from radixlm.runtime.attention.base import AttnLayerOptions, create_attention_backend
    from radixlm.runtime.kv_pool import KVPool

    pool = KVPool(16, 1, 2, 16, torch.float32, torch.device("cpu"), 2, 16)
    with pytest.raises(ValueError, match="soft-capping or sliding window"):
        create_attention_backend("triton", pool, 4, 2, 16,
                                 layers=[AttnLayerOptions(0.25, softcap=5.0)])


# ---- GGUF -------------------------------------------------------------------------------
# The tiny models written as llama.cpp would (tensor names from gguf-py's own HF -> GGUF
# map, Gemma norms stored as 1 + w, Phi-3's longrope factors as tensors), with SmolLM2's
# GGUF tokenizer, then loaded through radixlm's GGUF conversion.
GGUF_ARCH = {"qwen3": "QWEN3", "gemma2": "GEMMA2", "gemma3": "GEMMA3", "phi3": "PHI3"}


def _byte_tokens() -> list[str]:
    """A byte-level BPE vocabulary (GPT-2's byte alphabet, two merges, ChatML markers)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    alphabet = bytes_to_unicode()
    return [alphabet[b] for b in range(256)] + ["Ġt", "Ġa", "<|endoftext|>", "<|im_start|>",
                                                "<|im_end|>"]


def _write_gguf(hf, name: str, path) -> None:
    import gguf

    cfg = hf.config
    arch = getattr(gguf.MODEL_ARCH, GGUF_ARCH[name])
    tensor_map = gguf.get_tensor_name_map(arch, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[arch])
    tokens = _byte_tokens()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (len(tokens) - 3) + [3] * 3)
    writer.add_token_merges(["Ġ t", "Ġ a"])
    writer.add_bos_token_id(len(tokens) - 3)
    writer.add_eos_token_id(len(tokens) - 1)
    writer.add_name(name)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = cfg.rope_parameters
    if name == "gemma3":
        writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope["full_attention"]["factor"])
    else:
        writer.add_rope_freq_base(rope["rope_theta"])
    if getattr(cfg, "sliding_window", None):
        writer.add_sliding_window(cfg.sliding_window)
    if name == "gemma3":
        writer.add_sliding_window_pattern([t == "sliding_attention" for t in cfg.layer_types])
    if name == "gemma2":
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if name == "phi3":
        rot = int(head_dim * rope["partial_rotary_factor"])
        writer.add_rope_dimension_count(rot)
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        writer.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], np.float32))
        writer.add_tensor("rope_factors_short.weight",
                          np.array(rope["short_factor"], np.float32))
    for hf_name, t in hf.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        data = t.float().numpy()
        if name.startswith("gemma") and hf_name.endswith("norm.weight"):
            data = data + 1.0
        writer.add_tensor(tensor_map.get_name(hf_name, try_suffixes=(".weight", ".bias")),
                          np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("name", list(GGUF_ARCH))
def test_gguf_of_each_family_matches_transformers(name, tmp_path, monkeypatch):
    from radixlm.runtime.engine import Engine

    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path / "cache"))
    cfg = _configs(len(_byte_tokens()))[name]
    if name == "gemma3":  # Gemma's own head size (q 16x the hidden size): the native
        cfg.head_dim = 256  # attention's widest vectors, under windows within a prefill
    if name.startswith("gemma"):  # llama.cpp scales Gemma's queries by head_dim ** -0.5
        cfg.query_pre_attn_scalar = cfg.head_dim
    if name == "qwen3":  # llama.cpp has no sliding layers for Qwen3 (nor do its releases)
        cfg.use_sliding_window, cfg.layer_types = False, ["full_attention"] * 2
    hf = _build_from(cfg, None, tmp_path / "hf")
    path = tmp_path / f"{name}.gguf"
    _write_gguf(hf, name, path)
    prompts = _prompts(hf.config.vocab_size, seed=2)
    refs = [_reference(hf, prompt) for prompt in prompts]
    # the torch path (dequantized), then the default: read as a GGUF, every step native
    for quant in ("none", "auto"):
        with Engine(str(path), dtype="float32", weight_quant=quant, max_total_tokens=2048,
                    log_level="warning") as engine:
            assert engine.runner.gguf_native == (quant == "auto")
            outs = engine.generate(input_ids=prompts, sampling_params=PARAMS,
                                   return_logprob=True, logprob_start_len=0)
            for prompt, out, ref in zip(prompts, outs, refs):
                _check(out, prompt, ref)
