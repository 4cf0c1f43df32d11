"""A GGUF file's header and tensors, read in one pass over a map of the file.

gguf's ``GGUFReader`` turns every metadata value into numpy views up front: for a 49k-token
vocabulary and its merges that is ~2.7 s of Python on a 2-core host, paid by every engine
start before a weight is touched. ``read_gguf`` walks the header once, decoding only the
metadata keys asked for (a string array is skipped by its lengths, a number array is one
``frombuffer``), and maps the tensors the way ``GGUFReader`` shows them (same dtypes, shapes
and bytes). The file's types, block sizes and byte shapes are gguf's own.

A file is untrusted input: every count, length, type, shape and offset is checked against
the file before anything is allocated from it, and a bad one is a ``ValueError`` that names
the file and the problem.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# GGUF metadata value types (gguf.GGUFValueType) -> struct format (numpy reads the same
# strings as dtypes); 8 string, 9 array
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
VERSIONS = (2, 3)
MAX_DIMS = 4  # GGML_MAX_DIMS
_STRUCTS = {t: struct.Struct(f) for t, f in SCALARS.items()}
_DTYPES = {t: np.dtype(f) for t, f in SCALARS.items()}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_HEAD = struct.Struct("<IIQQ")  # magic, version, n_tensors, n_kv
_U32_U64 = struct.Struct("<IQ")  # an array's element type and count; a tensor's type, offset
# the fewest bytes one entry can take: a key/name length, a type, a value or dims and offset
_MIN_KV, _MIN_TENSOR_INFO = 8 + 4 + 1, 8 + 4 + 8 + 4 + 8
_MIN_ELEM = {STRING: 8, ARRAY: 12}
_INT64_MAX = 2**63 - 1


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


class _Header:
    """A cursor over the mapped file that never reads past its end."""

    def __init__(self, buf: mmap.mmap, path: str | Path):
        self.buf, self.path, self.size, self.pos = buf, path, len(buf), 0

    def error(self, problem: str) -> ValueError:
        return ValueError(f"{self.path}: {problem}")

    def left(self) -> int:
        return self.size - self.pos

    def take(self, n: int, what: str) -> int:
        """Move past ``n`` bytes; return where they start."""
        start = self.pos
        if n > self.size - start:
            raise self.error(f"GGUF header cut: {what} needs {n} bytes at byte {start}, "
                             f"the file has {self.size}")
        self.pos = start + n
        return start

    def unpack(self, fmt: struct.Struct, what: str) -> tuple:
        return fmt.unpack_from(self.buf, self.take(fmt.size, what))

    def string(self, what: str, errors: str = "replace", decode: bool = True) -> str | None:
        (n,) = self.unpack(_U64, what)
        if n > self.left():
            raise self.error(f"{what} is {n} bytes long, more than the {self.left()} bytes "
                             "left in the file (a cut or damaged header)")
        start = self.take(n, what)
        if not decode:
            return None
        try:
            return self.buf[start:start + n].decode("utf-8", errors)
        except UnicodeDecodeError as exc:
            raise self.error(f"{what} is not UTF-8 ({exc})") from exc

    def value(self, vtype: int, key: str, decode: bool):
        """One metadata value (``None`` where ``decode`` is false: skipped)."""
        if vtype in _STRUCTS:
            (value,) = self.unpack(_STRUCTS[vtype], f"the value of {key!r}")
            return value
        if vtype == STRING:
            return self.string(f"the value of {key!r}", decode=decode)
        if vtype == ARRAY:
            return self.array(key, decode)
        raise self.error(f"metadata key {key!r} has unknown value type {vtype}")

    def array(self, key: str, decode: bool) -> list | None:
        elem, count = self.unpack(_U32_U64, f"the array head of {key!r}")
        width = _STRUCTS[elem].size if elem in _STRUCTS else _MIN_ELEM.get(elem)
        if width is None:
            raise self.error(f"metadata array {key!r} has unknown element type {elem}")
        if count > self.left() // width:
            raise self.error(f"metadata array {key!r} claims {count} values, more than the "
                             f"{self.left()} bytes left in the file could hold (a cut or "
                             "damaged header)")
        if elem in _STRUCTS:
            start = self.take(count * width, f"the values of {key!r}")
            return (np.frombuffer(self.buf, _DTYPES[elem], count, start).tolist() if decode
                    else None)
        if elem == STRING:
            return self.strings(count, key, decode)
        values = [self.array(key, decode) for _ in range(count)]
        return values if decode else None

    def strings(self, count: int, key: str, decode: bool) -> list[str] | None:
        """``count`` strings of array ``key``: the one loop a vocabulary needs."""
        buf, pos, size, unpack = self.buf, self.pos, self.size, _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(count):
            if pos + 8 > size:
                self.pos = pos
                raise self.error(f"GGUF header cut in the strings of {key!r} (string {i} of "
                                 f"{count}, at byte {pos} of {size})")
            (n,) = unpack(buf, pos)
            end = pos + 8 + n
            if end > size:
                raise self.error(f"string {i} of {key!r} is {n} bytes long, more than the "
                                 f"{size - pos - 8} bytes left in the file (a cut or damaged "
                                 "header)")
            if decode:
                append(buf[pos + 8:end].decode("utf-8", "replace"))
            pos = end
        self.pos = pos
        return out if decode else None


def _walk(h: _Header, wanted: set[str]) -> tuple[dict, list[tuple], int]:
    """``(metadata, [(name, dims, raw_type, offset)], end of the tensor infos)``."""
    if h.size < 4 or h.buf[:4] != b"GGUF":
        raise h.error("not a GGUF file (no GGUF magic)")
    _, version, n_tensors, n_kv = h.unpack(_HEAD, "the GGUF header")
    if version not in VERSIONS:
        raise h.error(f"GGUF version {version} is not supported "
                      f"(versions {', '.join(map(str, VERSIONS))} are)")
    if n_kv > h.left() // _MIN_KV or n_tensors > h.left() // _MIN_TENSOR_INFO:
        raise h.error(f"the header claims {n_tensors} tensors and {n_kv} metadata values, "
                      f"more than the file's {h.size} bytes could hold (a cut or damaged "
                      "header)")
    meta: dict = {}
    keys: set[str] = set()
    for _ in range(n_kv):
        key = h.string("a metadata key")
        if key in keys:
            raise h.error(f"metadata key {key!r} appears twice")
        keys.add(key)
        (vtype,) = h.unpack(_U32, f"the type of {key!r}")
        value = h.value(vtype, key, key in wanted)
        if key in wanted:
            meta[key] = value
    if n_tensors > h.left() // _MIN_TENSOR_INFO:
        raise h.error(f"the header claims {n_tensors} tensors, more than the "
                      f"{h.left()} bytes left in the file could hold (a cut or damaged "
                      "header)")
    infos, names = [], set()
    for i in range(n_tensors):
        name = h.string(f"the name of tensor {i}", errors="strict")
        if name in names:
            raise h.error(f"tensor {name} appears twice")
        names.add(name)
        (n_dims,) = h.unpack(_U32, f"the dims of {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise h.error(f"tensor {name} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
        dims = struct.unpack_from(f"<{n_dims}Q", h.buf, h.take(8 * n_dims, f"dims of {name}"))
        raw_type, offset = h.unpack(_U32_U64, f"the type and offset of {name}")
        infos.append((name, dims, raw_type, offset))
    return meta, infos, h.pos


def _tensor_layout(h: _Header, infos: list[tuple], data_start: int,
                   align: int) -> list[tuple]:
    """Check each tensor's type, shape and place in the file; ``[(name, qtype, shape,
    start, n_bytes)]`` in file order."""
    import gguf

    known = {t.value: t for t in gguf.GGML_QUANT_SIZES}
    out = []
    for name, dims, raw_type, offset in infos:
        qtype = known.get(raw_type)
        if qtype is None:
            raise h.error(f"tensor {name} has unknown type id {raw_type}")
        if 0 in dims:
            raise h.error(f"tensor {name} has a zero dimension (dims {list(dims)})")
        n_elements = int(np.prod(dims, dtype=object))
        if n_elements > _INT64_MAX:
            raise h.error(f"tensor {name} dims {list(dims)} overflow 64 bits")
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        if dims[0] % block:
            raise h.error(f"tensor {name} ({qtype.name}) has rows of {dims[0]} values, not a "
                          f"multiple of its block size {block}")
        if offset % align:
            raise h.error(f"tensor {name} offset {offset} is not a multiple of the "
                          f"alignment {align}")
        n_bytes = n_elements // block * type_size
        start = data_start + offset
        if start + n_bytes > h.size:
            raise h.error(f"tensor {name} runs past the end of the file ({n_bytes} bytes at "
                          f"byte {start}, the file has {h.size})")
        out.append((name, qtype, tuple(reversed(dims)), start, n_bytes))
    ordered = sorted(out, key=lambda t: t[3])
    for a, b in zip(ordered, ordered[1:]):
        if a[3] + a[4] > b[3]:
            raise h.error(f"tensors {a[0]} and {b[0]} overlap in the file")
    return out


def read_gguf(path: str | Path, keys: Iterable[str] = ()) -> tuple[dict, list[GGUFTensor]]:
    """``(metadata, tensors)`` of the GGUF at ``path``.

    ``metadata`` holds those of ``keys`` the file has, as ``GGUFReader``'s ``contents()``
    gives them: scalars, strings, and arrays as lists (of lists, for nested arrays). The
    tensors map the file (nothing is read until used). ``ValueError`` names a file that is
    not GGUF v2/v3 or whose header is cut or damaged: bad counts or lengths, unknown value
    or tensor types, bad dims, duplicate keys or tensor names, misaligned, overlapping or
    out-of-file tensor data."""
    import gguf

    wanted = set(keys) | {"general.alignment"}
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            raise ValueError(f"{path}: not a GGUF file (it is empty)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            h = _Header(buf, path)
            meta, infos, end = _walk(h, wanted)
            align = meta.pop("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
            if not isinstance(align, int) or align <= 0 or align & (align - 1):
                raise h.error(f"general.alignment {align!r} is not a power of two")
            layout = _tensor_layout(h, infos, end + -end % align, align)
    whole = np.memmap(path, dtype=np.uint8, mode="r") if layout else None
    tensors = []
    for name, qtype, shape, start, n_bytes in layout:
        raw = whole[start:start + n_bytes]
        typed = _TYPED.get(qtype.name)
        data = (raw.view(typed).reshape(shape) if typed is not None
                else raw.reshape(gguf.quant_shape_to_byte_shape(shape, qtype)))
        tensors.append(GGUFTensor(name, qtype, data))
    return meta, tensors
