"""The served model as Ollama's `/api/tags`, `/api/show` and `/api/ps` describe a model:
its name (`ollama_request.ollama_name`), weights file size and time, a digest (of the
weights' path, size and time, not of their bytes), `details` (format, family, parameter
size, quantization) and `model_info` (GGUF-style keys from the model's config)."""

from __future__ import annotations

import datetime
import hashlib
from pathlib import Path
from typing import Any

from radixlm.server.ollama_request import ollama_name
from radixlm.server.reasoning import reasoning_parser_name
from radixlm.server.state import ServerState

# /api/ps's expiry of a model that is never unloaded (Go's longest duration from 2026)
NEVER_EXPIRES = "2318-01-01T00:00:00Z"


def iso_time(seconds: float | None = None) -> str:
    """An RFC 3339 UTC time (now when ``seconds`` is None), as Ollama writes `created_at`."""
    when = (datetime.datetime.now(datetime.UTC) if seconds is None
            else datetime.datetime.fromtimestamp(seconds, datetime.UTC))
    return when.isoformat().replace("+00:00", "Z")


def _weights(path: Path) -> tuple[int, float]:
    """(bytes, modification time) of a weights file or of the files of a model folder."""
    try:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        stats = [p.stat() for p in files]
    except OSError:
        return 0, 0.0
    return sum(s.st_size for s in stats), max((s.st_mtime for s in stats), default=0.0)


def _parameter_count(hf: Any) -> int | None:
    """Weights of a decoder of the usual shape (embeddings, attention, gated MLP, norms) from
    its config; None when the config lacks the sizes."""
    try:
        h, layers = int(hf.hidden_size), int(hf.num_hidden_layers)
        inter, vocab = int(hf.intermediate_size), int(hf.vocab_size)
        heads = int(hf.num_attention_heads)
        kv = int(getattr(hf, "num_key_value_heads", None) or heads)
    except (AttributeError, TypeError, ValueError):
        return None
    head_dim = int(getattr(hf, "head_dim", None) or h // heads)
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    per_layer = attn + 3 * h * inter + 2 * h
    embed = vocab * h * (1 if getattr(hf, "tie_word_embeddings", True) else 2)
    return embed + layers * per_layer + h


def _size_label(n: int | None) -> str:
    if n is None:
        return ""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _quantization(engine: Any) -> str:
    """The weights' precision as Ollama labels it (`Q8_0`, `F16`, ...)."""
    weights = (getattr(getattr(engine, "runner", None), "precision", None) or {}).get(
        "weights", "")
    return str(weights).removeprefix("gguf ").split(",")[0].strip().upper()


def details(state: ServerState) -> dict[str, Any]:
    engine = state.engine
    family = str(getattr(getattr(engine, "hf_config", None), "model_type", "") or "")
    path = Path(str(engine.model_path))
    return {"parent_model": "", "format": "gguf" if path.suffix == ".gguf" else "safetensors",
            "family": family, "families": [family] if family else None,
            "parameter_size": _size_label(_parameter_count(getattr(engine, "hf_config", None))),
            "quantization_level": _quantization(engine)}


def model_entry(state: ServerState) -> dict[str, Any]:
    """The model as `/api/tags` lists it."""
    path = Path(str(state.engine.model_path))
    size, mtime = _weights(path)
    name = ollama_name(state)
    digest = hashlib.sha256(f"{path.resolve()}:{size}:{mtime}".encode()).hexdigest()
    return {"name": name, "model": name, "modified_at": iso_time(mtime or None), "size": size,
            "digest": digest, "details": details(state)}


def running_entry(state: ServerState) -> dict[str, Any]:
    """The model as `/api/ps` lists it: loaded for good, on the engine's device."""
    entry = model_entry(state)
    device = str(getattr(getattr(state.engine, "config", None), "device", "") or "")
    return {**entry, "expires_at": NEVER_EXPIRES,
            "size_vram": entry["size"] if device.startswith("cuda") else 0,
            "context_length": state.context_len}


def model_info(state: ServerState) -> dict[str, Any]:
    """GGUF-style metadata keys of the model's config (`general.architecture`,
    `<arch>.context_length`, ...)."""
    hf = getattr(state.engine, "hf_config", None)
    arch = str(getattr(hf, "model_type", "") or "")
    info: dict[str, Any] = {"general.architecture": arch,
                            "general.parameter_count": _parameter_count(hf)}
    if not arch:
        return info
    info[f"{arch}.context_length"] = state.context_len
    for key, attr in (("embedding_length", "hidden_size"), ("block_count", "num_hidden_layers"),
                      ("feed_forward_length", "intermediate_size"),
                      ("attention.head_count", "num_attention_heads"),
                      ("attention.head_count_kv", "num_key_value_heads")):
        if getattr(hf, attr, None) is not None:
            info[f"{arch}.{key}"] = getattr(hf, attr)
    return info


def show(state: ServerState) -> dict[str, Any]:
    """`/api/show`'s answer; `template` is the model's (Jinja) chat template."""
    entry = model_entry(state)
    capabilities = ["completion", "tools"]
    if reasoning_parser_name(state) is not None:
        capabilities.append("thinking")
    return {"modelfile": f"# served by radixlm\nFROM {state.engine.model_path}\n",
            "parameters": "", "template": getattr(state.engine.tokenizer, "chat_template", "")
            or "", "license": "", "details": entry["details"], "model_info": model_info(state),
            "capabilities": capabilities, "modified_at": entry["modified_at"]}
