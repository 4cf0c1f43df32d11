"""A GGUF file's header and tensors, read without parsing its metadata values.

gguf's ``GGUFReader`` turns every metadata value into numpy views up front: for a 49k-token
vocabulary and its merges that is ~2.7 s of Python on a 2-core host, paid by every engine
start before a weight is touched. The tensors need only the header walked past (a string
array is skipped by its lengths) and their infos read; ``read_gguf`` does that and maps the
data the way ``GGUFReader`` shows it (same dtypes, shapes and bytes), decoding only the
metadata keys asked for. The file's types, block sizes and byte shapes are gguf's own.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

# GGUF metadata value types (gguf.GGUFValueType) -> struct format; 8 string, 9 array
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


def skip_value(f: BinaryIO, vtype: int) -> None:
    """Move past one GGUF metadata value of type ``vtype``."""
    if vtype == STRING:
        f.seek(struct.unpack("<Q", f.read(8))[0], 1)
    elif vtype == ARRAY:
        elem, count = struct.unpack("<IQ", f.read(12))
        if elem in (STRING, ARRAY):
            for _ in range(count):
                skip_value(f, elem)
        else:
            f.seek(count * struct.calcsize(SCALARS[elem]), 1)
    else:
        f.seek(struct.calcsize(SCALARS[vtype]), 1)


def read_value(f: BinaryIO, vtype: int):
    """One scalar or string metadata value (arrays are skipped and read as None)."""
    if vtype == STRING:
        return f.read(struct.unpack("<Q", f.read(8))[0]).decode("utf-8", "replace")
    if vtype == ARRAY:
        skip_value(f, vtype)
        return None
    fmt = SCALARS[vtype]
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor as ``GGUFReader`` shows it: ``data`` is a read-only map of the file, typed
    for F16/F32/F64/I8-I64 (numpy shape, the file's dims reversed), bytes otherwise (one
    row of blocks per row)."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    data: np.ndarray


_TYPED = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8,
          "I16": np.int16, "I32": np.int32, "I64": np.int64}


def read_gguf(path: str | Path, keys: tuple[str, ...] = ()) -> tuple[dict, list[GGUFTensor]]:
    """``(metadata, tensors)`` of the GGUF at ``path``: ``metadata`` holds those of ``keys``
    the file has (scalars and strings); ``ValueError`` names a file that is not GGUF v2+
    or whose header runs past its end."""
    import gguf

    wanted = set(keys) | {"general.alignment"}
    meta: dict = {}
    infos = []
    try:
        with open(path, "rb") as f:
            magic, version = struct.unpack("<II", f.read(8))
            if magic != gguf.GGUF_MAGIC or version < 2:
                raise ValueError(f"{path} is not a GGUF file of version 2 or later")
            n_tensors, n_kv = struct.unpack("<QQ", f.read(16))
            for _ in range(n_kv):
                key = f.read(struct.unpack("<Q", f.read(8))[0]).decode("utf-8", "replace")
                vtype = struct.unpack("<I", f.read(4))[0]
                if key in wanted:
                    meta[key] = read_value(f, vtype)
                else:
                    skip_value(f, vtype)
            for _ in range(n_tensors):
                name = f.read(struct.unpack("<Q", f.read(8))[0]).decode("utf-8")
                (n_dims,) = struct.unpack("<I", f.read(4))
                dims = struct.unpack(f"<{n_dims}Q", f.read(8 * n_dims))
                raw_type, offset = struct.unpack("<IQ", f.read(12))
                infos.append((name, dims, raw_type, offset))
            start = f.tell()
    except (struct.error, KeyError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: damaged GGUF header ({exc})") from exc
    align = int(meta.pop("general.alignment", None) or gguf.GGUF_DEFAULT_ALIGNMENT)
    start += -start % align
    whole = np.memmap(path, dtype=np.uint8, mode="r")
    tensors = []
    for name, dims, raw_type, offset in infos:
        qtype = gguf.GGMLQuantizationType(raw_type)
        shape = tuple(reversed(dims))
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_bytes = int(np.prod(dims)) * type_size // block
        raw = whole[start + offset:start + offset + n_bytes]
        if len(raw) != n_bytes:
            raise ValueError(f"{path}: tensor {name} runs past the end of the file")
        typed = _TYPED.get(qtype.name)
        data = (raw.view(typed).reshape(shape) if typed is not None
                else raw.reshape(gguf.quant_shape_to_byte_shape(shape, qtype)))
        tensors.append(GGUFTensor(name, qtype, data))
    return meta, tensors
