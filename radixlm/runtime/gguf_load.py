"""A GGUF served as a GGUF: its tensors under the runtime's (Hugging Face) names, read from a
map of the file.

Two consumers:

- the native path (``native_blocks``): every matrix as the file holds it (Q4_0 / Q4_1 /
  Q8_0, the K-quants Q4_K / Q5_K / Q6_K, dense F32 / BF16 rows), nothing dequantized and
  q/k rows left in llama.cpp's order (the native layer rotates adjacent pairs for those,
  ``rope_pairs``); norms and biases as fp32 vectors;
- the torch path (``dequantized_state``: families or devices the native library does not
  run, tensor parallel): the file dequantized in memory (fp32; q/k rows permuted back to
  Hugging Face's rotate-half order), never written anywhere.

Config and tokenizer come from the file's metadata (``native/gguf_model.py``); transformers'
GGUF reader is a test reference only.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from radixlm.native.qweights import recoded
from radixlm.native.recode import EXACT, REQUANTIZED, ROUNDED

if TYPE_CHECKING:  # (imported in dequantized_state: the native path reads a GGUF
    import torch  # before torch has loaded)

logger = logging.getLogger(__name__)

GGUF_TO_HF = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",  # Phi-3
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",  # Qwen3, Gemma 3
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",  # Gemma: norm of the attention output
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_TOP = {"token_embd": "model.embed_tokens.weight", "output_norm": "model.norm.weight",
             "output": "lm_head.weight"}
GGUF_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
DENSE_TYPES = ("F32", "F16", "BF16", "F64")


def is_gguf(path) -> bool:
    p = Path(path)
    return p.suffix == ".gguf" and p.is_file()


def hf_tensor_name(kind: str, model_type: str) -> str:
    """HF name (without ``model.layers.N.`` and ``.weight``) of GGUF block tensor ``kind``."""
    if kind == "ffn_norm" and model_type.startswith("gemma"):
        return "pre_feedforward_layernorm"
    if kind == "ffn_up" and model_type == "phi3":
        return "mlp.gate_up_proj"  # llama.cpp keeps Phi-3's fused gate ‖ up
    return GGUF_TO_HF[kind]


def permuted(model_type: str) -> bool:
    """llama.cpp permutes q/k rows for its "llama" architecture only."""
    return model_type in ("llama", "mistral")


def reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary permutation of q/k rows (interleaved -> rotate-half)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name: str, model_type: str) -> str | None:
    """The runtime's name of GGUF tensor ``gguf_name`` (None: not a model weight, e.g.
    ``rope_factors_*``, read into the config)."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in GGUF_TO_HF:
        return f"model.layers.{parts[1]}.{hf_tensor_name(parts[2], model_type)}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _GGUF_TOP and parts[1] == "weight":
        return _GGUF_TOP[parts[0]]
    return None


@functools.lru_cache(maxsize=4)
def _info(path: str, mtime_ns: int, size: int):
    from radixlm.native.gguf_model import GGUFModelInfo

    return GGUFModelInfo.from_path(path)


def gguf_info(path):
    """The file's ``GGUFModelInfo`` (config, tokenizer, end-of-turn ids, checked tensor
    shapes; one header walk), cached per file version. A damaged or unsupported file is a
    ValueError naming it."""
    p = Path(path).resolve()
    st = p.stat()
    return _info(str(p), st.st_mtime_ns, st.st_size)


def gguf_hf_config(path):
    """The model's transformers config from the file's metadata (a copy: callers edit it)."""
    import copy

    return copy.deepcopy(gguf_info(path).config)


def gguf_tokenizer(path, backend=None):
    """The transformers tokenizer (with chat template) from the file's metadata (the
    caller's own, on ``backend``: ``gguf_backend``'s, handed over; else built anew)."""
    return gguf_info(path).new_tokenizer(backend)


def gguf_start_tokenizer(path, backend=None):
    """The engine's tokenizer of the file (``GGUFModelInfo.start_tokenizer``: transformers
    imported when a call needs it, for a byte-level vocabulary; on ``backend`` where given)."""
    return gguf_info(path).start_tokenizer(backend)


def gguf_backend(path):
    """The file's byte-level vocabulary built and checked without transformers
    (``GGUFModelInfo.new_backend``; None for the other kinds). ValueError names a bad merge."""
    return gguf_info(path).new_backend()


def gguf_eos_ids(path) -> list[int]:
    """The ids the file names as ends of a turn (EOS, EOT, EOM)."""
    return list(gguf_info(path).eos_token_ids)


@dataclass
class NativeGGUF:
    """A GGUF's weights for the native path: ``blocks`` (HF name -> QWeight, every 2-D
    matrix as the file has it, views of the file map) and ``vectors`` (HF name -> fp32
    [n]: norms, biases). ``rope_pairs``: q/k rows are in llama.cpp's order."""

    blocks: dict
    vectors: dict[str, np.ndarray]
    rope_pairs: bool
    weights_bytes: int


def _dense_rows(t, name: str):
    from radixlm.native.qweights import dense_rows

    data = np.asarray(t.data)
    kind = t.tensor_type.name
    if kind == "F32":
        return dense_rows(data)
    if kind == "BF16":
        return dense_rows(data.view(np.uint16).reshape(data.shape[0], -1))
    if kind in ("F16", "F64"):  # no native rows of these: fp32 (exact for F16)
        return dense_rows(np.asarray(data, dtype=np.float32))
    raise ValueError(f"tensor {name}: dense type {kind} is not supported")


def native_blocks(path, hf_config) -> NativeGGUF:
    """The file's tensors for the native library (see ``NativeGGUF``); a quantized type it
    does not run is a ValueError naming the type and the tensor."""
    import gguf

    from radixlm.native.qweights import from_gguf_raw

    mt = hf_config.model_type
    blocks, vectors, total = {}, {}, 0
    for t in gguf_info(path).tensors:  # (the header walked once: cached)
        name = hf_name(t.name, mt)
        if name is None:
            continue
        kind = t.tensor_type.name
        total += t.data.nbytes
        if t.data.ndim == 1 or (kind in DENSE_TYPES and 1 in t.data.shape):
            vectors[name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type),
                                       dtype=np.float32).reshape(-1)
        elif kind in DENSE_TYPES:
            blocks[name.removesuffix(".weight") + ".weight"] = _dense_rows(t, t.name)
        else:
            w = from_gguf_raw(kind, np.asarray(t.data))
            if w is None:
                w = _recoded(t, kind, path)
            blocks[name] = w
    rewritten = sorted({(w.origin, w.kind) for w in blocks.values()
                        if w.origin and w.origin.lower() != w.kind})
    if exact := [f"{o} as {k.upper()}" for o, k in rewritten if o in EXACT]:
        logger.info("%s: %s tensors run as blocks of the same numbers (no native kernel for "
                    "the type: more bytes a step reads)", Path(path).name, ", ".join(exact))
    if rounded := [o for o, _ in rewritten if o in ROUNDED]:
        logger.info("%s: %s tensors run as Q8_0 blocks of the file's values, each block's "
                    "scale rounded to fp16 (no native kernel for the type: more bytes a "
                    "step reads)", Path(path).name, ", ".join(rounded))
    if lossy := [o for o, _ in rewritten if o in REQUANTIZED]:
        logger.warning("%s: %s tensors run re-quantized to Q8_0 (no native format holds their "
                       "numbers: close to the file's, not equal)", Path(path).name,
                       ", ".join(lossy))
    return NativeGGUF(blocks, vectors, permuted(mt), total)


# Quantized types the native library has no kernel for (radixlm/native/recode.py): Q3_K,
# Q5_0 and IQ4_NL run as Q6_K / Q8_0 blocks of the same numbers, IQ4_XS as Q8_0 blocks of its
# values under fp16 block scales, Q2_K and Q5_1 re-quantized to Q8_0 (named in the start log
# and the weights label, e.g. "q6_k (from Q3_K)"). Q4_K, Q5_K and Q6_K run in their own
# super-blocks (csrc/kquants.c).
RECODED_TYPES = (*EXACT, *ROUNDED, *REQUANTIZED)


def _recoded(t, kind: str, path):
    if kind not in RECODED_TYPES:
        raise ValueError(f"{path}: tensor {t.name} has type {kind}, which the native library "
                         "does not run (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, F32, F16, BF16; "
                         f"{', '.join(RECODED_TYPES)} in another format)")
    return recoded(kind, np.asarray(t.data))


def dequantized_state(path, hf_config, dtype=None) -> dict[str, torch.Tensor]:
    """Every model tensor of the file dequantized under HF names, q/k rows in Hugging Face's
    order (the torch path's weights), in memory: in fp32, each cast to ``dtype`` as it is
    made where one is given (the bits ``.to(dtype)`` of the fp32 state gives; the whole
    fp32 state is never held: a 1.5B file's torch path peaked at 10.3 GiB with it in bf16)."""
    import gguf
    import torch

    mt = hf_config.model_type
    n_head, n_kv = hf_config.num_attention_heads, hf_config.num_key_value_heads
    logger.info("dequantizing %s for the torch path", Path(path).name)
    state: dict[str, torch.Tensor] = {}
    for t in gguf_info(path).tensors:
        name = hf_name(t.name, mt)
        if name is None:
            continue
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        kind = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if kind in ("attn_q", "attn_k") and permuted(mt):
            w = reverse_permute(w, n_head if kind == "attn_q" else n_kv)
        if mt.startswith("gemma") and name.endswith("norm.weight"):
            w = w - 1.0  # llama.cpp stores Gemma's RMSNorm scales as 1 + w
        tensor = torch.from_numpy(np.array(w, dtype=np.float32, order="C", copy=True))
        state[name] = tensor if dtype in (None, torch.float32) else tensor.to(dtype)
    return state
