"""The whole model through the Triton path (kernels + TritonAttentionBackend) against the
torch path (reference ops + torch attention backend), in the real Engine.

A 2-layer random Llama (GQA 4:2, head_dim 32) with SmolLM2's tokenizer, scaled so its
next-token distributions are far from one-hot (logprobs then show any attention error), in
fp32, with a radix-cached shared prefix and chunked prefill, so the backend sees the
ForwardBatches the model runner really builds. Without CUDA the kernels run in Triton's
interpreter. Tolerance: identical greedy tokens, logprobs within 1e-4.
"""

from __future__ import annotations

import json

import pytest
import torch
from kernel_testing import DEVICES, enable_interpreter_without_cuda

enable_interpreter_without_cuda()

SHARED = "You are a careful assistant. Answer in one short sentence, please. Question: "
PROMPTS = [SHARED + "what is two plus two?", SHARED + "name a colour.", "Hi", SHARED + "why?"]


@pytest.fixture(scope="module")
def soft_model_dir(tmp_path_factory, tokenizer):
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    out = tmp_path_factory.mktemp("soft-llama")
    vocab, hidden, ffn, layers = len(tokenizer), 128, 256, 2
    LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=1024, tie_word_embeddings=True,
                eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.bos_token_id).save_pretrained(out)
    tokenizer.save_pretrained(out)
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape: int, scale: float = 0.1) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale

    state = {"model.embed_tokens.weight": rnd(vocab, hidden, scale=0.05),
             "model.norm.weight": torch.ones(hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        state.update({
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
            p + "self_attn.q_proj.weight": rnd(hidden, hidden, scale=0.3),
            p + "self_attn.k_proj.weight": rnd(hidden // 2, hidden, scale=0.3),
            p + "self_attn.v_proj.weight": rnd(hidden // 2, hidden),
            p + "self_attn.o_proj.weight": rnd(hidden, hidden),
            p + "mlp.gate_proj.weight": rnd(ffn, hidden),
            p + "mlp.up_proj.weight": rnd(ffn, hidden),
            p + "mlp.down_proj.weight": rnd(hidden, ffn),
        })
    save_file(state, str(out / "model.safetensors"))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return out


def _run(model_dir, device: str, backend: str) -> tuple[list[dict], list[dict]]:
    from radixlm.runtime.engine import Engine

    params = {"max_new_tokens": 5, "temperature": 0, "ignore_eos": True}
    with Engine(str(model_dir), dtype="float32", device=device, attention_backend=backend,
                chunked_prefill_size=16, max_total_tokens=2048, max_running_requests=8,
                log_level="warning") as engine:
        first = engine.generate([PROMPTS[0]], params, return_logprob=True)
        rest = engine.generate(PROMPTS[1:], params, return_logprob=True)
    return first, rest


@pytest.mark.parametrize("device", DEVICES)
def test_engine_triton_path_matches_torch_path(soft_model_dir, device: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RADIXLM_KERNELS", "ref")
    torch_first, torch_rest = _run(soft_model_dir, device, "torch")
    monkeypatch.setenv("RADIXLM_KERNELS", "triton")
    triton_first, triton_rest = _run(soft_model_dir, device, "triton")
    assert sum(o["meta_info"]["cached_tokens"] for o in triton_rest) > 0, "prefix not reused"
    for ours, theirs in zip(triton_first + triton_rest, torch_first + torch_rest, strict=True):
        assert ours["output_ids"] == theirs["output_ids"]
        ours_lp = [lp for lp, _, _ in ours["meta_info"]["output_token_logprobs"]]
        theirs_lp = [lp for lp, _, _ in theirs["meta_info"]["output_token_logprobs"]]
        torch.testing.assert_close(torch.tensor(ours_lp), torch.tensor(theirs_lp),
                                   atol=1e-4, rtol=1e-4)
