"""The models `radixlm run` can load, as `radixlm list` shows them: the embedded alias(es),
the converted-weights cache (`<cache dir>/models`, one Hugging Face directory per GGUF
converted), and model paths given to `radixlm run` before (a small history file in the user
cache dir, newest first). Each with its size on disk and its quantization."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from radixlm import envs
from radixlm.native.gguf_file import read_gguf

HISTORY_FILE = "run_history.json"
HISTORY_LEN = 20


@dataclass(frozen=True)
class ModelEntry:
    """One loadable model: `name` is what `radixlm run NAME` takes."""

    name: str
    kind: str  # "embedded" | "cache" | "history"
    path: Path
    size_bytes: int
    quantization: str


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def gguf_quantization(path: Path) -> str:
    """The GGUF file's `general.file_type` (e.g. "Q4_1"), read from its header alone.

    gguf's own GGUFReader parses every field up front (seconds of Python for a 49k-token
    vocabulary); this walks the header alone and decodes only that key."""
    import gguf

    try:
        value = read_gguf(path, ("general.file_type",))[0].get("general.file_type")
        if value is not None:
            return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_")
    except (OSError, ValueError, KeyError):
        pass
    return "unknown"


def dir_quantization(path: Path) -> str:
    """A Hugging Face directory's quantization: its `quantization_config`, else its dtype;
    a directory converted from a GGUF says which file type it came from."""
    source = path / "radixlm_source.json"
    origin = ""
    if source.exists():
        try:
            gguf_path = Path(json.loads(source.read_text())["gguf"])
            origin = f" (from {gguf_quantization(gguf_path)} GGUF)" if gguf_path.exists() \
                else " (its GGUF is gone)"
        except (ValueError, KeyError, OSError):
            origin = ""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return "unknown"
    quant = config.get("quantization_config") or {}
    if quant:
        bits = quant.get("bits")
        return f"{quant.get('quant_method', 'quantized')}{f' {bits}-bit' if bits else ''}"
    return str(config.get("torch_dtype") or config.get("dtype") or "unknown") + origin


def quantization(path: Path) -> str:
    return gguf_quantization(path) if path.is_file() else dir_quantization(path)


def history_path() -> Path:
    return envs.cache_dir() / HISTORY_FILE


def read_history() -> list[str]:
    """Model paths given to `radixlm run` before, newest first (missing ones left out)."""
    try:
        names = json.loads(history_path().read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(names, list):
        return []
    return [n for n in names if isinstance(n, str) and Path(n).exists()]


def remember(model: str) -> None:
    """Put a model path at the top of the history (aliases are always listed anyway)."""
    path = Path(model).expanduser()
    if not path.exists():
        return
    name = str(path.resolve())
    names = [name] + [n for n in read_history() if n != name]
    target = history_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(names[:HISTORY_LEN], indent=1))
    tmp.replace(target)


def known_models() -> list[ModelEntry]:
    """Every model `radixlm run` can load here: aliases, the cache, then the history."""
    from radixlm.runtime.weights import alias_paths

    out: list[ModelEntry] = []
    for name, path in alias_paths().items():
        if path is not None and path.exists():
            out.append(ModelEntry(name, "embedded", path, _size(path), quantization(path)))
    cache = envs.cache_dir() / "models"
    dirs = sorted(cache.iterdir()) if cache.is_dir() else []
    seen = set()
    for d in dirs:
        if d.is_dir() and (d / "config.json").exists() and ".tmp" not in d.name:
            seen.add(str(d.resolve()))
            out.append(ModelEntry(str(d), "cache", d, _size(d), quantization(d)))
    for name in read_history():
        if name not in seen:
            path = Path(name)
            out.append(ModelEntry(name, "history", path, _size(path), quantization(path)))
    return out


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def format_table(entries: list[ModelEntry]) -> str:
    """`radixlm list`'s table."""
    rows = [("NAME", "KIND", "SIZE", "QUANTIZATION")]
    rows += [(e.name, e.kind, human_size(e.size_bytes), e.quantization) for e in entries]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}"
                     for r in rows)


def unknown_model_message(model: str, reason: str) -> str:
    """What `radixlm run` says when it cannot load `model`."""
    lines = [f"radixlm run: cannot load model {model!r}: {reason}", "Models it can load:"]
    entries = known_models()
    lines += [f"  {e.name}  ({e.kind}, {human_size(e.size_bytes)}, {e.quantization})"
              for e in entries] or ["  (none found)"]
    lines.append("or a local Hugging Face directory, or a .gguf file (`radixlm list` shows "
                 "them with sizes)")
    return "\n".join(lines)
