"""What a native decoder runs, decided before anything is placed: its matrices in step
order (``step_weights``) and its activation mode by step size (``activation_modes``,
``decoder_modes``); the arena is laid out by it (``arena.place_ahead``). No torch here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from radixlm.native.build import ACT_BF16, ACT_F32, ACT_INT8, int8_decode_preferred
from radixlm.native.qweights import FMT_Q4, QWeight, concat, is_kquant

FUSED = {
    "qkv": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
    "o": ["self_attn.o_proj"],
    "gate_up": ["mlp.gate_proj", "mlp.up_proj"],
    "down": ["mlp.down_proj"],
}
ATTRS = ("qkv", "o_proj", "gate_up", "down")  # the model layer's Linear of each
# checkpoints that store a concatenation whole (Phi-3's, also in its GGUFs)
STORED_FUSED = {"qkv": "self_attn.qkv_proj", "gate_up": "mlp.gate_up_proj"}


# Steps under this many tokens run int8 activation blocks by default where int8 is
# preferred; bf16 dot products, where the library has them, only take over from here. A
# token's int8 products are the same bits at every step size (csrc/matmul_i8.c), so a
# request's steps round alike alone or beside up to 7 others, and a step verifying drafts
# at one-token rounding (``act_rows``) reproduces decoding exactly. Measured
# (bench_decode_step.py --activations int8,bf16, context 300): on a 2-core Zen 4 (AVX512-
# BF16 dot products, no AMX) int8 steps of 2 / 4 / 6 / 8 tokens take 0.65 / 0.78 / 0.83 /
# 0.98x the bf16 step time (the 512-bit kernel reads a Q4 row's chunks of 16 blocks
# transposed, one block a lane); on a 2-core Xeon (an older kernel) int8 won one- and
# 2-token steps (0.82-0.91x, 0.89x fp32) and lost from 4 (1.17x); from 8 tokens fp32 /
# bf16 (AMX tiles) run.
INT8_MAX_ROWS = 8


# The activation modes whose kernels compute each token in one fixed order at any step size
# (csrc/matmul_i8.c: a token's int8 products and sums do not depend on its neighbours). A
# plan of one of them on every step, with every step native, makes a token's numbers the
# same bits in any batch, chunk, cache state or verify step (attention, norms and rotary
# already reduce per token in a fixed order). fp32 and bf16 pick kernels by step size
# (rows x 1-3 tokens, tiles of 4, AMX tiles of 16), which sum in different orders.
STEP_INVARIANT_MODES = frozenset({ACT_INT8})


def invariant_plan(plan: tuple[tuple[int, int], ...]) -> bool:
    """Whether an ``activation_modes`` plan rounds a token alike at every step size: one
    mode for every step, and one of STEP_INVARIANT_MODES."""
    return len(plan) == 1 and plan[0][1] in STEP_INVARIANT_MODES


def activation_modes(act: str, bf16_from: int, model_dtype,
                     int8: bool = False, every_step: bool = False,
                     deterministic: bool = False) -> tuple[tuple[int, int], ...]:
    """The C activation mode by step size: ``((from_tokens, mode), ...)``, ascending, the
    first from 1; a step of T tokens runs the last entry whose ``from_tokens <= T``.
    ``bf16_from``: ``rlm_bf16_min_rows()`` (8 on AMX tiles, 2 with AVX512-BF16 dot
    products, 0 where the library has no bf16); ``model_dtype``: a torch dtype or its
    name. fp32 is exact (the reference path's
    numbers); int8 is llama.cpp's per-block rounding; bf16 rounds activations and weights
    to bf16 with fp32 sums, the numbers of a torch bf16 linear. An explicit mode runs every
    step.

    auto: where ``int8`` (a block-quantized model on a CPU with u8 x s8 SIMD:
    ``build.int8_decode_preferred``) int8 blocks run steps of every size, so a token rounds
    alike in any batch, chunk or cache state (batch-invariant): prefill is an int8 GEMM over
    the blocks (AMX int8 tiles from RLM_AMX_I8_MIN_ROWS tokens where granted, with the
    one-token steps' bits). Otherwise as mixed. mixed (fastest big steps, not
    batch-invariant): on a bf16 model (whose numbers are 8-bit-mantissa ones anyway) bf16
    from ``bf16_from`` tokens where the library has bf16; below that int8 blocks where
    ``int8`` for steps under INT8_MAX_ROWS tokens (bf16 then from INT8_MAX_ROWS at the
    soonest); fp32 otherwise; with ``every_step`` (a K-quant model on an ``int8`` host
    without AMX tiles, where the int8 GEMM is the faster one) int8 on every step. Measured
    on a 2-core Sapphire Rapids (embedded Q4_1 model): auto's prefill 0.74x mixed's and
    batch-64 decode 0.73x (AMX int8 tiles scale each block in fp32: ~0.77x the bf16 tiles'
    GEMM); on the same cores without AMX int8 blocks run Q4 rows 1.5-2.5x the bf16 dot
    products' rate at any step size.
    ``deterministic`` (enable_deterministic_inference): one mode for every step, int8
    blocks where ``int8``, else bf16 on a bf16 model where the library has bf16, else fp32
    (``invariant_plan`` says whether that mode rounds alike at every step size)."""
    if act not in ("auto", "mixed"):
        return ((1, {"fp32": ACT_F32, "int8": ACT_INT8, "bf16": ACT_BF16}[act]),)
    if int8 and (act == "auto" or every_step or deterministic):
        return ((1, ACT_INT8),)
    bf16_model = str(model_dtype).removeprefix("torch.") == "bfloat16"
    if deterministic:
        return ((1, ACT_BF16 if bf16_model and bf16_from else ACT_F32),)
    bf16 = bf16_from if bf16_model and bf16_from else 0
    if int8 and bf16:
        bf16 = max(bf16, INT8_MAX_ROWS)
    plan = [(1, ACT_INT8 if int8 else ACT_F32)]
    if int8 and (not bf16 or bf16 > INT8_MAX_ROWS):
        plan.append((INT8_MAX_ROWS, ACT_F32))
    if bf16 > 1:
        plan.append((bf16, ACT_BF16))
    return tuple(plan)




def _label(w: QWeight, kind) -> str:
    if w.origin and w.origin.lower() != kind(w):
        return f"{kind(w)} (from {w.origin})"
    return kind(w)


def describe_weights(layer_weights: list[QWeight], head: QWeight, kind=None) -> str:
    """What the step's matrices are, e.g. ``gguf q4_1, head q8_0`` (a GGUF's own blocks),
    ``bf16`` (dense rows), ``q8_0`` (blocks made at load). ``kind(w)``: what a weight's
    numbers are where it is held (``Arena.kind``; default ``w.kind``)."""
    kind = kind or (lambda w: w.kind)
    layers = ", ".join(sorted({_label(w, kind) for w in layer_weights}))
    text = ("gguf " if any(w.origin for w in [*layer_weights, head]) else "") + layers
    return text if _label(head, kind) == layers else f"{text}, head {_label(head, kind)}"


def decoder_modes(lib, act: str, model_dtype, layer_weights: list[QWeight], head: QWeight,
                  deterministic: bool = False) -> tuple[tuple[int, int], ...]:
    """``activation_modes`` for a decoder on ``layer_weights`` and ``head`` with the library
    ``lib``: int8 where some are blocks and the host prefers int8
    (``int8_decode_preferred``), on every step for K-quant rows without AMX tiles. Asked
    int8 on dense rows only: a ValueError."""
    weights = [*layer_weights, head]
    quantized = any(not w.dense for w in weights)
    if act == "int8" and not quantized:
        raise ValueError(f"native_activations='int8' rounds activations for block "
                         f"weights; this model runs dense "
                         f"{describe_weights(layer_weights, head)} rows (use "
                         "quantization=q8_0|q4_0|q4_1, or fp32 / bf16 / auto)")
    int8 = quantized and int8_decode_preferred()
    every = int8 and not lib.rlm_amx() and any(is_kquant(w) for w in weights)
    return activation_modes(act, int(lib.rlm_bf16_min_rows()), model_dtype, int8,
                            every_step=every, deterministic=deterministic)


@dataclass
class StepWeights:
    """A decoder's matrices: per layer ``{"qkv", "o", "gate_up", "down"}`` -> the parts of
    its concatenation (csrc QCat), the LM head, and ``embed`` (the embedding's blocks where
    token rows are looked up in them; None otherwise, or when it is the head)."""

    layers: list[dict[str, list[QWeight]]]
    head: QWeight
    embed: QWeight | None

    @property
    def flat(self) -> list[QWeight]:
        return [w for m in self.layers for parts in m.values() for w in parts]

    @property
    def order(self) -> list[QWeight]:
        """Every matrix once, in the order a step reads them (the arena's)."""
        return [*self.flat, self.head] + ([self.embed] if self.embed is not None
                                          and self.embed is not self.head else [])


def step_weights(blocks: dict[str, QWeight], num_layers: int, *, tied: bool,
                 embed_from_blocks: bool,
                 missing: Callable[[int | None, str, str], QWeight]) -> StepWeights:
    """The matrices a decoder of ``num_layers`` layers runs from ``blocks`` (HF name ->
    QWeight). ``missing(layer, attr, name)`` makes a weight the blocks lack (``attr``: the
    model layer's Linear, ``ATTRS``; ``layer`` None: the head), or raises. A concatenation
    stored whole (``STORED_FUSED``) is one part. Parts of one concatenation that would read
    different activation layouts (Q4 rows beside others) become one Q8 matrix
    (``concat``). ``tied``: the head is the embedding where the blocks have no
    ``lm_head``; ``embed_from_blocks``: token rows are looked up in the embedding's blocks
    (a ValueError where there are none)."""
    layers = []
    for i in range(num_layers):
        layer = {}
        for (key, names), attr in zip(FUSED.items(), ATTRS):
            full = [f"model.layers.{i}.{n}.weight" for n in names]
            whole = f"model.layers.{i}.{STORED_FUSED.get(key)}.weight"
            if whole in blocks:
                layer[key] = [blocks[whole]]
            elif all(n in blocks for n in full):
                parts = [blocks[n] for n in full]
                layer[key] = [concat(parts)] if len({p.fmt == FMT_Q4 for p in parts}) > 1 \
                    else parts
            else:
                layer[key] = [missing(i, attr, full[0])]
        layers.append(layer)
    head = blocks.get("lm_head.weight")
    if head is None and tied:
        head = blocks.get("model.embed_tokens.weight")
    if head is None:
        head = missing(None, "lm_head", "lm_head.weight")
    embed = None
    if embed_from_blocks:
        embed = blocks.get("model.embed_tokens.weight")
        if embed is None:
            raise ValueError("the model has no embedding tensor (token_embd)")
    return StepWeights(layers, head, embed)
