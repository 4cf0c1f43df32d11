"""Steps of a Llama-family model in the native library.

One C call per layer (RMSNorm, q/k/v on block-quantized or dense rows, q/k head norms,
rotary from one of two tables, K/V store into the pool, attention through ``req_to_token``
within the layer's window, o, the sandwich norm, RMSNorm, gate/up, SiLU or gelu-tanh, down,
residuals) and one for the final norm and the LM head: the Llama layer with the switches of
Qwen3, Gemma 2 / 3 and Phi-3 (``ModelConfig``; Gemma 2's soft-caps of scores and logits).
The pool stays the only K/V store: a step written here is read by the torch path's next
extend step and the other way round. A GGUF read as a GGUF runs every step here; a
checkpoint's larger steps may stay on the torch path (``accepts``).
"""

from __future__ import annotations

import ctypes
from typing import Protocol

import numpy as np
import torch

from radixlm.kernels import ref as kernels_ref
from radixlm.kernels.ref import softcap
from radixlm.native.arena import Placed, place_ahead
from radixlm.native.build import (
    ACT_BF16,
    ACT_F32,
    ACT_GELU_TANH,
    ACT_INT8,
    ACT_SILU,
    Layer,
    Step,
    qcat,
)
from radixlm.native.ops import KV_DTYPES
from radixlm.native.plan import (
    ATTRS,
    STEP_INVARIANT_MODES,
    decoder_modes,
    describe_weights,
    invariant_plan,
    step_weights,
)
from radixlm.native.qweights import FMT_BF16, QWeight, dense_rows, quantize_q4


class StepBatch(Protocol):
    """What the decoder reads of a step: the runtime's ``ForwardBatch`` is one as it is
    (passed through, no copy), and so is any object with these fields. T tokens of B
    requests, back to back; tensors on the CPU, int64 unless noted.

    ``num_tokens`` T; ``input_ids``, ``positions``, ``out_cache_loc`` (the pool slot that
    receives each token's K/V): [T]; ``req_pool_indices`` (rows of the pool's
    ``req_to_token``) and ``extend_lens`` (new tokens per request): [B], with
    ``extend_lens_cpu`` and ``seq_lens_cpu`` (tokens with K/V after the step) the same as
    lists; ``logits_indices``: the rows of T whose logits are returned. Optional
    ``act_rows``: the step size whose activation rounding to use (default T); optional
    ``hidden_indices``: rows of T whose last hidden state ``forward`` leaves in
    ``batch.hidden``."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    out_cache_loc: torch.Tensor
    req_pool_indices: torch.Tensor
    extend_lens: torch.Tensor
    logits_indices: torch.Tensor
    seq_lens_cpu: list[int]
    extend_lens_cpu: list[int]

    @property
    def num_tokens(self) -> int: ...

def supported(model, pool) -> str | None:
    """Why ``model`` cannot run natively (None when it can)."""
    cfg = model.cfg
    if model.device.type != "cpu":
        return "not a CPU model"
    if pool.k_buffer[0].dtype not in KV_DTYPES:
        return f"K/V dtype {pool.k_buffer[0].dtype} (fp32, bf16 or int8 only)"
    if cfg.hidden_size % 32 or cfg.intermediate_size % 32 or cfg.q_size % 32:
        return "dimensions not multiples of 32"
    if cfg.head_dim % 2 or cfg.num_heads % cfg.num_kv_heads:
        return "head layout"
    extra = getattr(model, "native_unsupported", None)
    return extra() if callable(extra) else None


# With bf16 on AMX tiles the linears of a prefill chunk run faster here than torch's, but
# the attention loop is per position: a chunk runs natively when its tokens attend to
# at most this many positions on average (measured crossover ~350 on a 2-core Xeon:
# 512-token prompts 1.2x faster natively, 1,800-token ones 1.8x slower), and up to
# LARGE_MAX_ROWS tokens.
LARGE_MAX_CTX_PER_TOKEN = 256
LARGE_MAX_ROWS = 2048
# Without AMX (bf16 dot products, 4 rows x 4 tokens a tile) the activations stream from L2
# once per 4 weight rows: up to this many tokens. A 2-core Zen 4, 16 requests x 4-16 tokens
# after 256 cached positions: 64 tokens 72 ms natively vs 145 ms on the torch path, 128:
# 121 vs 188, 256: 255 vs 372 (jump-forward steps of a batch are this shape).
BF16_LARGE_MAX_ROWS = 256


_MODE_NAMES = {ACT_F32: "fp32", ACT_INT8: "int8", ACT_BF16: "bf16"}


class NativeDecoder:
    """Runs steps of at most ``max_rows`` tokens (None: every step, for a model whose
    weights exist only as blocks: a GGUF loaded as a GGUF). ``blocks``: HF weight name ->
    QWeight (a GGUF's own blocks, or blocks made at load on request); weights missing there
    run as dense rows at the model's precision (bf16 rows for a bf16 model, fp32 otherwise),
    or as Q4 blocks with ``quant="int4"``. Dense rows are moved into the decoder's arena and
    the model's tensors become views of them (one copy in memory, read by both paths). A
    model without an ``embed`` tensor looks token rows up in the embedding's blocks.
    ``act``: how matmuls read activations (auto | mixed | fp32 | int8 | bf16, see
    ``activation_modes``); int8 needs block weights (a ValueError on a dense model).
    ``release``: called with each QWeight once the arena holds its copy (a file mapping
    gives its pages back; weights the arena reads in place are not copied or released).
    ``deterministic``: one activation mode for every step (``activation_modes``).
    ``placed``: the weights placed already by the same plan (``runtime/early.py``: while
    torch was imported; ``blocks`` then unused), a RuntimeError where its activation modes
    are not the ones this decoder runs."""

    STEP_SLICE = 256  # tokens a step-invariant mode runs at once (see forward)

    def __init__(self, lib: ctypes.CDLL, model, blocks: dict[str, QWeight] | None, pool,
                 max_rows: int | None, quant: str = "auto", act: str = "auto",
                 release=None, deterministic: bool = False,
                 placed: Placed | None = None) -> None:
        self.lib, self.model, self.pool, self.max_rows = lib, model, pool, max_rows
        self.amx = bool(lib.rlm_amx())
        self._fill = quantize_q4 if quant == "int4" else None  # None: dense rows
        self._keep: list = []  # arrays the C structs point into
        cfg = model.cfg
        self.kv_dtype = KV_DTYPES[pool.k_buffer[0].dtype]
        n = cfg.num_layers
        weights = placed.weights if placed is not None else step_weights(
            blocks, n, tied=model.lm_head is model.embed or cfg.tie_word_embeddings,
            embed_from_blocks=model.embed is None, missing=self._missing)
        self.act_modes = decoder_modes(lib, act, model.dtype, weights.flat, weights.head,
                                       deterministic)
        if placed is None:
            placed = place_ahead(lib, weights, self.act_modes, torch.get_num_threads(),
                                 release)  # (in step order)
        elif placed.modes != self.act_modes:  # (runtime/early.py plans as this does)
            raise RuntimeError(f"weights placed for activation modes {placed.modes}, "
                               f"the decoder runs {self.act_modes}")
        self.arena, self._placed = placed.arena, placed
        self.weights = describe_weights(weights.flat, weights.head, self.arena.kind)
        self._rope_keys = sorted(model.ropes)  # Step.cos / sin, then cos_b / sin_b
        if len(self._rope_keys) > 2:
            raise ValueError(f"{len(self._rope_keys)} rotary tables (the layer takes two)")
        self.layers = (Layer * n)(*[self._layer(i, weights.layers[i]) for i in range(n)])
        self.head, head_rows = self._place(weights.head)
        if head_rows is not None:
            self._adopt_head(head_rows)
        self.embed_mat = None
        if weights.embed is not None:  # token rows from the embedding's blocks
            self.embed_mat = (self.head if weights.embed is weights.head
                              else self._place(weights.embed)[0])
        self._placed = None  # (what the C views point into, the arena holds)
        self._k_ptrs = (ctypes.c_void_p * n)(*[b.data_ptr() for b in pool.k_buffer])
        self._v_ptrs = (ctypes.c_void_p * n)(*[b.data_ptr() for b in pool.v_buffer])
        # an int8 pool's per-layer row scales (Step.k_scales / v_scales; None otherwise)
        self._scale_arrays = [(ctypes.c_void_p * n)(*[b.data_ptr() for b in bufs])
                              if bufs else None for bufs in (pool.k_scale, pool.v_scale)]
        self._scale_ptrs = [None if a is None else ctypes.addressof(a)
                            for a in self._scale_arrays]
        self.final_norm = self._f32(model.norm)
        self._ws = torch.empty(0)
        self._head_ws = torch.empty(0)
        self.arena.settle()  # (onto huge pages, beside the rest of the start)

    # ------------------------------------------------------------------ weights
    def _f32(self, t: torch.Tensor | None) -> int | None:
        if t is None:
            return None
        a = np.ascontiguousarray(t.detach().float().numpy())
        self._keep.append(a)
        return a.ctypes.data

    def _missing(self, layer: int | None, attr: str, name: str) -> QWeight:
        """A weight the source has no blocks for (``plan.step_weights``; ``layer`` None:
        the head): dense rows (bf16 bits or fp32), or the ``quant`` fill's blocks."""
        model = self.model
        dense = model.lm_head if layer is None else getattr(model.layers[layer], attr)
        if dense is None:
            raise ValueError(f"weight {name} is missing from the model file")
        weight = dense.weight if hasattr(dense, "weight") else dense
        if self._fill is not None:
            return self._fill(weight.float().numpy())
        if weight.dtype == torch.bfloat16:
            return dense_rows(weight.contiguous().view(torch.int16).numpy().view(np.uint16))
        return dense_rows(weight.float().contiguous().numpy())

    def _place(self, w: QWeight) -> tuple[ctypes.Structure, torch.Tensor | None]:
        """``w``'s C view in the arena, and for dense rows a torch tensor over the arena's
        copy (bf16 or fp32), for the model to read instead of its own."""
        mat, arrays = self._placed.view(w)
        if not w.dense:
            return mat, None
        rows = arrays[0]
        return mat, (torch.from_numpy(rows.view(np.int16)).view(torch.bfloat16)
                     if w.fmt == FMT_BF16 else torch.from_numpy(rows))

    def _adopt_head(self, t: torch.Tensor) -> None:
        model = self.model
        if model.lm_head is None or t.dtype != model.lm_head.dtype:  # (a GGUF read as one
            return  # has no torch head; fp16 weights run as fp32 rows: keep both)
        if model.lm_head is model.embed:
            model.embed = t
        if model.head.weight is model.lm_head:
            model.head.weight = t
        model.lm_head = t

    def _layer(self, i: int, weights: dict[str, list[QWeight]]) -> Layer:
        cfg, layer = self.model.cfg, self.model.layers[i]
        mats = {}
        for (key, parts), attr in zip(weights.items(), ATTRS):
            placed = [self._place(w) for w in parts]
            mats[key] = [m for m, _ in placed]
            linear = getattr(layer, attr, None)
            t = placed[0][1]
            if linear is not None and t is not None and t.dtype == linear.weight.dtype:
                linear.weight = t  # the model's linear reads the arena's copy
        bias = layer.qkv.bias if getattr(layer, "qkv", None) is not None else layer.qkv_bias
        rope = self.model.ropes[layer.rope_key]
        if rope.rotary_dim > cfg.head_dim:
            raise ValueError(f"rotary over {rope.rotary_dim} dims of heads of {cfg.head_dim}")
        return Layer(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                     cfg.intermediate_size, cfg.rms_norm_eps,
                     cfg.head_dim ** -0.5 if cfg.attn_scale is None else cfg.attn_scale,
                     self._f32(layer.input_norm), self._f32(layer.post_norm),
                     self._f32(bias), self._f32(layer.q_norm), self._f32(layer.k_norm),
                     int(getattr(layer, "rope_pairs", False)),
                     qcat(mats["qkv"]), mats["o"][0], qcat(mats["gate_up"]), mats["down"][0],
                     self._f32(layer.attn_out_norm), self._f32(layer.mlp_out_norm),
                     ACT_GELU_TANH if cfg.act == "gelu_tanh" else ACT_SILU,
                     cfg.window(i) or 0, self._rope_keys.index(layer.rope_key),
                     rope.rotary_dim // 2, cfg.attn_softcap or 0.0)

    # ------------------------------------------------------------------ the step
    def accepts(self, batch: StepBatch) -> bool:
        """Steps of up to ``max_rows`` tokens; larger ones (prefill chunks, a batch's
        jump-forward steps) when they run bf16 (up to LARGE_MAX_ROWS tokens on AMX tiles,
        BF16_LARGE_MAX_ROWS with bf16 dot products) and attend to short contexts (see
        LARGE_MAX_CTX_PER_TOKEN)."""
        t = batch.num_tokens
        if self.max_rows is None or 0 < t <= self.max_rows:
            return True
        if self._mode(t) != ACT_BF16 or t > (LARGE_MAX_ROWS if self.amx
                                             else BF16_LARGE_MAX_ROWS):
            return False
        attended = sum(e * s - e * (e - 1) // 2  # positions s-e .. s-1 attend to pos + 1
                       for e, s in zip(batch.extend_lens_cpu, batch.seq_lens_cpu))
        return attended <= LARGE_MAX_CTX_PER_TOKEN * t

    @property
    def batch_invariant(self) -> bool:
        """Whether a token's logits are the same bits in any step: every step runs here
        (``max_rows`` None) with a plan that rounds alike at every size."""
        return self.max_rows is None and invariant_plan(self.act_modes)

    @property
    def large_from(self) -> int:
        """Tokens from which steps run bf16 (1 << 30: none do)."""
        return next((n for n, m in self.act_modes if m == ACT_BF16), 1 << 30)

    def describe_modes(self) -> str:
        """The activation modes by step size, e.g. ``int8 under 8 tokens, bf16 from 8
        tokens (AMX; ...)``; ``fp32``."""
        plan = self.act_modes
        parts = [f"{_MODE_NAMES[m]} under {plan[i + 1][0]} tokens" if i + 1 < len(plan)
                 else (f"{_MODE_NAMES[m]} from {n} tokens" if i else _MODE_NAMES[m])
                 for i, (n, m) in enumerate(plan)]
        parts = [p.replace("under 2 tokens", "one-token steps") for p in parts]
        if plan[-1][1] == ACT_BF16:
            parts[-1] += (" (AMX; short-context prefill chunks too)" if self.amx else
                          " (AVX512-BF16 dot products; short-context steps up to "
                          f"{BF16_LARGE_MAX_ROWS} tokens too)")
        return ", ".join(parts)

    def _mode(self, rows: int) -> int:
        """The activation mode (ACT_*) a step of ``rows`` tokens runs."""
        return next(m for n, m in reversed(self.act_modes) if n <= max(rows, 1))

    def _workspace(self, attr: str, floats: int) -> torch.Tensor:
        ws = getattr(self, attr)
        if ws.numel() < floats:
            ws = torch.empty(max(floats, 2 * ws.numel()), dtype=torch.float32)
            setattr(self, attr, ws)
        return ws

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of ``ids`` in fp32: from the model's tensor, or dequantized
        from the embedding's blocks."""
        if self.embed_mat is None:
            return self.model.embed[ids].float()
        ids = ids.contiguous()
        out = torch.empty(ids.numel(), self.model.cfg.hidden_size, dtype=torch.float32)
        self.lib.rlm_dequant_rows(ctypes.byref(self.embed_mat), ids.data_ptr(), ids.numel(),
                                  out.data_ptr())
        return out

    @torch.inference_mode()
    def forward(self, batch: StepBatch) -> torch.Tensor:
        """Logits ``[len(batch.logits_indices), V]`` in fp32 (the K/V of every token of
        the step written to the pool). With ``batch.hidden_indices`` (optional) it also
        sets ``batch.hidden``: the residual stream after the last layer (before the final
        norm) at those rows, fp32."""
        model, lib, pool = self.model, self.lib, self.pool
        nthreads = torch.get_num_threads()
        T = batch.num_tokens
        res = self._embed(batch.input_ids)  # (T, hidden), the residual stream
        if model.cfg.embed_scale != 1.0:
            res.mul_(torch.tensor(model.cfg.embed_scale, dtype=torch.float32))
        tables = [model.ropes[k].cos_sin(kernels_ref, batch.positions, torch.float32)
                  for k in self._rope_keys]  # (fp32: the torch path's CPU op)
        (cos, sin), (cos_b, sin_b) = tables[0], tables[-1]
        if len(batch.extend_lens_cpu) == T:  # one token per request (decode)
            rows = batch.req_pool_indices
        else:
            rows = torch.repeat_interleave(batch.req_pool_indices, batch.extend_lens)
        max_ctx = max(batch.seq_lens_cpu)
        act_rows = getattr(batch, "act_rows", None)
        mode = self._mode(act_rows or T)
        # a step-invariant mode gives a token the same numbers at every step size, so a big
        # step runs as slices in order (each one's K/V written before the next attends to
        # it): the workspace is a slice's (~145 KB a token at 1B), not the whole chunk's
        size = self.STEP_SLICE if mode in STEP_INVARIANT_MODES else T
        ws = self._workspace("_ws", lib.rlm_workspace_floats(self.layers[0], min(T, size),
                                                             max_ctx, nthreads))
        table = pool.req_to_token
        rows = rows.contiguous()
        for a in range(0, T, size):
            n = min(size, T - a)
            step = Step(n, self.kv_dtype, nthreads, max_ctx, mode, cos[a:].data_ptr(),
                        sin[a:].data_ptr(), batch.out_cache_loc[a:].data_ptr(),
                        rows[a:].data_ptr(), batch.positions[a:].data_ptr(), table.data_ptr(),
                        table.stride(0), ws.data_ptr(), *self._scale_ptrs,
                        cos_b[a:].data_ptr(), sin_b[a:].data_ptr())
            lib.rlm_layers(self.layers, len(self.layers), self._k_ptrs, self._v_ptrs,
                           ctypes.byref(step), res[a:].data_ptr())
        hidden_indices = getattr(batch, "hidden_indices", None)
        if hidden_indices is not None:  # rows whose last hidden state is asked for
            batch.hidden = res[hidden_indices]
        x = res[batch.logits_indices].contiguous()
        n = x.shape[0]
        logits = torch.empty(n, self.head.n, dtype=torch.float32)
        if n:
            hws = self._workspace("_head_ws", lib.rlm_matmul_workspace_floats(
                n, self.head.k, nthreads))
            lib.rlm_norm_head(ctypes.byref(self.head), self.final_norm,
                              model.cfg.rms_norm_eps, n, x.data_ptr(), logits.data_ptr(),
                              hws.data_ptr(), self._mode(act_rows or n), nthreads)
            if model.cfg.final_softcap is not None:  # (Gemma 2; the torch path's op)
                logits = softcap(logits, model.cfg.final_softcap)
        return logits
