"""Weight conversion and the int4 decode path."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.models.quant import Linear, pack_int4, quantize_int4
from radixlm.runtime.weights import (
    gguf_source,
    load_hf_config,
    load_q4_1_linears,
    load_state_dict,
    resolve_model,
)


def test_alias_and_errors(model_dir):
    assert resolve_model("smollm2-135m-instruct") == model_dir  # cached conversion reused
    assert (model_dir / "model.safetensors").exists()
    with pytest.raises(ValueError, match="neither"):
        resolve_model("no/such/model")


def test_q4_1_blocks_reproduce_the_dequantized_weights(model_dir):
    """The exact int4 operands and the fp32 conversion describe the same weights
    (including llama.cpp's q/k row permutation, undone in both)."""
    assert gguf_source(model_dir) is not None
    cfg = load_hf_config(model_dir)
    blocks = load_q4_1_linears(model_dir, cfg)
    state = load_state_dict(model_dir)
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj"
                 ".weight", "model.layers.7.mlp.down_proj.weight"):
        q, scale, zero = blocks[name]
        w = (q.float() - 8) * scale.repeat_interleave(32, 1) + zero.repeat_interleave(32, 1)
        torch.testing.assert_close(w, state[name], atol=1e-5, rtol=1e-5)


def test_int4_linear_matches_dequantized_reference():
    torch.manual_seed(0)
    n, k = 96, 128
    q = torch.randint(0, 16, (n, k))
    scale, lo = torch.rand(n, k // 32) * 0.05, -torch.rand(n, k // 32)
    w = q.float() * scale.repeat_interleave(32, 1) + lo.repeat_interleave(32, 1)
    lin = Linear(w.bfloat16(), None, pack_int4(q, scale, lo + 8 * scale))
    x = torch.randn(2, k, dtype=torch.bfloat16)
    torch.testing.assert_close(lin(x).float(), x.float() @ w.t(), atol=0.05, rtol=0.02)
    big = torch.randn(16, k, dtype=torch.bfloat16)  # many rows: the bf16 GEMM path
    torch.testing.assert_close(lin(big).float(), big.float() @ w.bfloat16().float().t(),
                               atol=0.05, rtol=0.02)
    approx = Linear(w, None, quantize_int4(w))
    ref = x.float() @ w.t()
    assert (approx(x.float()) - ref).norm() / ref.norm() < 0.05  # lossy, but close
