"""The GGUF header walk (``read_gguf``) against gguf's own ``GGUFReader``: every metadata
value (arrays of strings, ints, floats and bools, nested arrays) equal to ``contents()``, and
the same tensors with the same names, types, dtypes, shapes and bytes, on the embedded model
and on a file written here with dense and block tensors and a custom alignment; damaged
files are ValueErrors that name the problem (each hostile header: tests/test_gguf_model.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from radixlm.native.gguf_file import read_gguf


def _same_as_reader(path: Path) -> list:
    import gguf

    reader = gguf.GGUFReader(str(path))
    keys = [k for k in reader.fields if not k.startswith("GGUF.")]
    meta, tensors = read_gguf(path, keys + ["absent"])
    assert list(meta) == [k for k in keys if k != "general.alignment"]
    for key, value in meta.items():
        expected = reader.fields[key].contents()
        if isinstance(value, list) and value and isinstance(value[0], list):
            value = [x for part in value for x in part]  # GGUFReader flattens nested arrays
        assert value == expected and type(value) is type(expected), key
        if isinstance(value, list) and value:
            assert type(value[0]) is type(expected[0]), key
    expected = reader.tensors
    assert [t.name for t in tensors] == [t.name for t in expected]
    for ours, theirs in zip(tensors, expected):
        assert ours.tensor_type == theirs.tensor_type, ours.name
        assert ours.data.dtype == theirs.data.dtype, ours.name
        assert ours.data.shape == theirs.data.shape, ours.name
        assert np.array_equal(np.asarray(ours.data), np.asarray(theirs.data)), ours.name
    return tensors


def test_the_embedded_model_reads_as_ggufs_reader_reads_it(model_dir):
    from radixlm.runtime.weights import gguf_source

    tensors = _same_as_reader(gguf_source(model_dir))
    assert {t.tensor_type.name for t in tensors} >= {"Q4_1", "F32"}


def _write(path: Path, alignment: int = 64) -> None:
    import gguf

    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(alignment)
    w.add_token_list([f"tok{i}" for i in range(300)])
    w.add_array("test.ints", [1, 2, 3])
    w.add_array("test.floats", [0.5, -1.25])
    w.add_array("test.bools", [True, False, True])
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_array("test.empty", [])
    w.add_string("test.name", "tiny")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tensor("dense.f32", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("dense.f16", rng.standard_normal(7).astype(np.float16))
    for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
        values = rng.standard_normal((4, 64)).astype(np.float32)
        w.add_tensor(f"blocks.{qtype.name}", gguf.quants.quantize(values, qtype),
                     raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_dense_and_block_tensors_after_string_arrays_and_an_alignment(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write(path)
    tensors = _same_as_reader(path)
    assert [t.data.shape for t in tensors] == [(3, 5), (7,), (4, 68), (4, 36)]
    meta, _ = read_gguf(path, ("test.name", "general.file_type", "test.ints", "test.floats",
                               "test.bools", "test.nested", "absent"))
    assert meta == {"test.name": "tiny", "general.file_type": 7, "test.ints": [1, 2, 3],
                    "test.floats": [0.5, -1.25], "test.bools": [True, False, True],
                    "test.nested": [[1, 2], [3]]}
    tokens = read_gguf(path, ("tokenizer.ggml.tokens",))[0]["tokenizer.ggml.tokens"]
    assert tokens == [f"tok{i}" for i in range(300)]


def test_damaged_files_are_named(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write(path)
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-100])  # into the last tensor (past its padding)
    with pytest.raises(ValueError, match="blocks.Q4_0 runs past the end"):
        read_gguf(tmp_path / "cut.gguf")
    (tmp_path / "head.gguf").write_bytes(data[:200])
    with pytest.raises(ValueError, match="'tokenizer.ggml.tokens' claims 300 values"):
        read_gguf(tmp_path / "head.gguf")
    (tmp_path / "not.gguf").write_bytes(b"GGML" + data[4:])
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(tmp_path / "not.gguf")
