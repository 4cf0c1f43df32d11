"""The batch-invariant matmul of the torch path (``enable_deterministic_inference``).

A GEMM library picks its kernel, blocking and the order of each output's sum over K from
the call: its shape, strides, alignment and thread count (on a Zen 4 with MKL and oneDNN,
an fp32 row computed alone, among 2-3 rows and among 4+ rows gives three different sets of
bits). It does not look at the values, and an output element's sum does not depend on
the other rows of the operand. So a row's numbers stay the same bits in any batch when
every call has one shape:

    fixed_rows_linear(x, weight, bias) == x @ weight.T (+ bias), row for row the same bits
    whatever the other rows of ``x`` are and however many there are.

``x [M, K]`` runs as ``ceil(M / ROWS)`` calls of ``[ROWS, K] x [K, N]``, each chunk copied
into its place in one fresh zero-padded buffer and its product written into its place in
one fresh output (contiguous; every chunk at a multiple of 64 bytes from the allocation's
64-byte-aligned start, as ``ROWS * K`` elements of 2 or 4 bytes are for any even K), the
same ``weight`` object every call, the bias added after.
The cost: a step of fewer than ``ROWS`` rows computes ``ROWS`` (a one-token decode step's
linears ~2.5x in bf16, ~6x in fp32 on one core), a prefill chunk reads the weights once per
``ROWS`` rows (~1.5x). The whole flag's: benchmarks/bench_determinism.py ``--cost-rounds``.
"""

from __future__ import annotations

from functools import partial

import torch

# Rows of every GEMM call. One core, the 135M model's layer in bf16: a 512-row prefill's
# linears cost 1.5x one call at 16 rows (2x at 8), a one-row step 2.5x (4x at 32).
ROWS = 16


def fixed_rows_linear(x: torch.Tensor, weight: torch.Tensor,
                      bias: torch.Tensor | None = None, rows: int = ROWS) -> torch.Tensor:
    """``x [M, K] @ weight [N, K].T (+ bias)`` in calls of ``rows`` rows (see the module
    docstring); ``[M, N]`` in ``x``'s dtype."""
    m, k = x.shape
    chunks = -(-m // rows)
    buf = x.new_zeros(chunks * rows, k)
    buf[:m] = x
    out = x.new_empty(chunks * rows, weight.shape[0])  # (chunk c at c * rows * N elements)
    wt = weight.t()
    for c in range(chunks):
        part = slice(c * rows, (c + 1) * rows)
        torch.mm(buf[part], wt, out=out[part])
    out = out[:m]
    return out if bias is None else out + bias


# activation name (ModelConfig.act) -> its ATen op writing into ``out=``
_ACT_OUT = {"silu": torch.ops.aten.silu.out,
            "gelu_tanh": partial(torch.ops.aten.gelu.out, approximate="tanh")}


def act_and_mul(act: str, gate_up: torch.Tensor) -> torch.Tensor:
    """``act(gate) * up`` for ``gate_up [T, 2F]`` (gate ‖ up): the values of
    ``kernels.ref.silu_and_mul`` / ``gelu_tanh_and_mul``, a row's bits whatever ``T`` is.

    How: the activation one op call a row, written into one output, and the product in one
    call (a product of two numbers rounds alike on every path). An elementwise op splits its
    elements among threads at ``numel / threads`` (some ops at thresholds of their own) and
    runs each part in vector chunks with a scalar tail, and SiLU's, sigmoid's and GELU's
    vector and scalar code round differently in the last bit, so which path an element took
    depended on its flat index in the call, i.e. on the other rows (on an Ice Lake Xeon,
    gelu-tanh over a ``[T, 96]`` gate changed 2 elements of a row between T = 90 and
    T = 205). A call of one row has one shape, so every row takes the same paths; the cost
    is a call per row (a few microseconds each). exp and tanh need no such care: ATen runs
    them through ``vml``'s map, which computes a part's tail with the same vector function
    on a partial load (the attention's scores and Gemma 2's soft-caps rely on it; tested)."""
    gate, up = gate_up.chunk(2, dim=-1)
    out = torch.empty_like(gate)
    op = _ACT_OUT[act]
    for i in range(gate.shape[0]):
        op(gate[i], out=out[i])
    return out.mul_(up)
