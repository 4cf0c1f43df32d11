"""Weight conversion and the int4 decode path."""

from __future__ import annotations

import pytest
import torch

from radixlm.runtime.models.quant import EXACT_ROWS, Linear, gemm_rows, pack_int4, quantize_int4
from radixlm.runtime.weights import (
    gguf_source,
    load_hf_config,
    load_q4_1_linears,
    load_state_dict,
    resolve_model,
)


def test_alias_and_errors(model_gguf, model_dir):
    path = resolve_model("smollm2-135m-instruct")
    assert path == model_gguf and path.suffix == ".gguf"  # the file itself, nothing converted
    assert resolve_model(str(model_dir)) == model_dir  # an HF directory as it is
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


def test_gemm_row_counts_stay_few_and_pad_little():
    # oneDNN keeps native memory per GEMM shape for the process's life: prefill chunks of
    # every token count must map onto a bounded set of row counts.
    rows = [gemm_rows(m) for m in range(1, 16385)]
    assert all(r >= m for m, r in zip(range(1, 16385), rows))
    assert rows[:EXACT_ROWS] == list(range(1, EXACT_ROWS + 1))
    assert len({r for r in rows if r > EXACT_ROWS}) <= 48
    assert max(r - m for m, r in zip(range(1, 512), rows)) < EXACT_ROWS
    assert max((r - m) / m for m, r in zip(range(512, 16385), rows[511:])) <= 1 / 8


def test_padded_gemm_rows_give_the_unpadded_result():
    torch.manual_seed(0)
    w, b = torch.randn(48, 32), torch.randn(48)
    lin = Linear(w, b)
    for m in (EXACT_ROWS + 1, 200, 700):
        x = torch.randn(m, 32)
        y = lin(x)
        assert y.shape == (m, 48) and y.is_contiguous()
        torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b))
