"""benchmarks/make_gguf.py's writer: a tiny random-weight GGUF read back with gguf's own
GGUFReader has the shape's metadata, the embedded model's tokenizer and the right tensor
shapes (the llama.cpp quantize step needs llama.cpp's venv and stays out of this test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import make_gguf  # noqa: E402


@pytest.fixture(scope="module")
def embedded():
    return gguf.GGUFReader(str(make_gguf.embedded_gguf()))


def _value(reader, key):
    return reader.fields[key].contents()


@pytest.mark.parametrize("shape_name,dtype", [("tiny", "F32"), ("tiny-qwen", "F16"),
                                              ("tiny-qwen3", "F16")])
def test_tiny_gguf_metadata_and_tensors(tmp_path, embedded, shape_name, dtype):
    shape = make_gguf.SHAPES[shape_name]
    path = tmp_path / "m.gguf"
    make_gguf.write_gguf(path, shape, dtype, seed=3)
    r = gguf.GGUFReader(str(path))
    arch = shape.arch
    assert _value(r, "general.architecture") == arch
    expected = {"block_count": shape.layers, "embedding_length": shape.hidden,
                "feed_forward_length": shape.ffn, "attention.head_count": shape.heads,
                "attention.head_count_kv": shape.kv_heads, "vocab_size": 49152,
                "rope.dimension_count": shape.head_dim, "attention.key_length": shape.head_dim}
    for key, want in expected.items():
        assert _value(r, f"{arch}.{key}") == want, key
    assert _value(r, f"{arch}.rope.freq_base") == pytest.approx(shape.rope_theta)
    for key in [k for k in embedded.fields if k.startswith("tokenizer.")]:
        assert _value(r, key) == _value(embedded, key), key
    assert len(_value(r, "tokenizer.ggml.tokens")) == 49152

    tensors = {t.name: t for t in r.tensors}
    names = {name for name, _ in make_gguf.tensor_specs(shape, 49152)}
    assert set(tensors) == names
    assert ("output.weight" in tensors) == (not shape.tied)
    assert ("blk.0.attn_q.bias" in tensors) == shape.qkv_bias
    assert ("blk.0.attn_q_norm.weight" in tensors) == shape.qk_norm
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    # GGUFReader lists dims innermost first: [in, out]
    want_shapes = {"token_embd.weight": [shape.hidden, 49152],
                   "blk.1.attn_q.weight": [shape.hidden, q],
                   "blk.1.attn_output.weight": [q, shape.hidden],
                   "blk.1.attn_k.weight": [shape.hidden, kv],
                   "blk.1.ffn_gate.weight": [shape.hidden, shape.ffn],
                   "blk.1.ffn_down.weight": [shape.ffn, shape.hidden],
                   "output_norm.weight": [shape.hidden]}
    for name, dims in want_shapes.items():
        assert [int(d) for d in tensors[name].shape] == dims, name
    w = tensors["blk.1.ffn_up.weight"]
    assert w.tensor_type == getattr(gguf.GGMLQuantizationType, dtype)
    values = np.asarray(w.data, dtype=np.float32)
    # the file holds the generator's bits for (seed, name), in [out, in] row order
    assert np.array_equal(np.asarray(w.data), make_gguf._random_tensor(
        w.name, (shape.ffn, shape.hidden), {"F16": np.float16, "F32": np.float32}[dtype], 3))
    assert 0.018 < float(values.std()) < 0.022
    assert abs(float(values.mean())) < 1e-3
    assert np.all(np.asarray(tensors["blk.0.attn_norm.weight"].data) == 1.0)
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32


def test_weights_are_deterministic_by_seed_and_name():
    a = make_gguf._random_tensor("blk.0.attn_v.weight", (64, 256), np.float16, seed=5)
    assert np.array_equal(a, make_gguf._random_tensor("blk.0.attn_v.weight", (64, 256),
                                                      np.float16, seed=5))
    assert not np.array_equal(a, make_gguf._random_tensor("blk.0.attn_v.weight", (64, 256),
                                                          np.float16, seed=6))
    assert not np.array_equal(a, make_gguf._random_tensor("blk.0.attn_k.weight", (64, 256),
                                                          np.float16, seed=5))


def test_bad_shape_and_type_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown shape 'llama-70b'"):
        make_gguf.make_model("llama-70b", "Q4_K_M", tmp_path)
    with pytest.raises(ValueError, match="unknown type 'Q3_K'"):
        make_gguf.make_model("tiny", "Q3_K", tmp_path)
    with pytest.raises(ValueError, match="writes F16 or F32"):
        make_gguf.write_gguf(tmp_path / "x.gguf", make_gguf.SHAPES["tiny"], "Q8_0")


# parameter counts published for the real checkpoints (their model cards' safetensors
# totals) and each one's own vocabulary: the shapes are theirs to the last weight
PUBLISHED = {"llama-1b": (1_235_814_400, 128256), "llama-3b": (3_212_749_824, 128256),
             "llama-8b": (8_030_261_248, 128256), "qwen-1.5b": (1_543_714_304, 151936),
             "qwen-7b": (7_615_616_512, 152064),
             "qwen3-4b": (4_022_468_096, 151936), "qwen3-8b": (8_190_735_360, 151936)}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_real_shapes_match_published_parameter_counts(name):
    params, vocab = PUBLISHED[name]
    assert make_gguf.n_params(make_gguf.SHAPES[name], vocab) == params


# ---------------------------------------------------------------- bench_vs_llamacpp's memory rules
@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-F16.gguf"
    make_gguf.write_gguf(path, make_gguf.SHAPES["tiny"], "F16")
    return str(path)


def test_memory_estimate_and_plan(monkeypatch, tiny_file):
    import bench_vs_llamacpp as bench

    shape, gib = make_gguf.SHAPES["tiny"], bench.GIB
    # f16 K and V: 2 layers x 2 KV heads x 64 x 4096 tokens x 2 bytes, twice
    assert bench.kv_bytes(tiny_file, 4096) == 2 * 2 * shape.layers * 2 * 64 * 4096
    need = {s: bench.memory_need(tiny_file, 4096, s) for s in ("radixlm", "llama_cpp")}
    assert need["radixlm"] == (Path(tiny_file).stat().st_size + bench.kv_bytes(tiny_file, 4096)
                               + int(bench.RUNTIME_ALLOWANCE["radixlm"]))
    systems, reserve = ["radixlm", "llama_cpp"], gib

    def plan_with(avail: int):
        monkeypatch.setattr(bench, "mem_available", lambda: reserve + avail)
        return bench.plan(tiny_file, 4096, systems, reserve)

    assert plan_with(sum(need.values())) == ([systems], {})
    assert plan_with(max(need.values())) == ([["radixlm"], ["llama_cpp"]], {})
    groups, unfit = plan_with(need["llama_cpp"])
    assert groups == [["llama_cpp"]] and list(unfit) == ["radixlm"]
    assert unfit["radixlm"]["need_gib"] == pytest.approx(need["radixlm"] / gib)


def test_memory_guard_stops_a_worker_before_it_answers(monkeypatch):
    import bench_vs_llamacpp as bench

    avail = [8 << 30]
    monkeypatch.setattr(bench, "mem_available", lambda: avail[0])
    guard = bench.MemoryGuard(reserve=1 << 30, interval=0.01)
    guard.start()
    code = ("import json, time; print(json.dumps({'construct_s': 0.5}), flush=True); "
            "time.sleep(30)")
    worker = bench.Worker("w", [sys.executable, "-c", code], guard)
    assert worker.load["construct_s"] == 0.5 and guard.tripped is None
    avail[0] = 100 << 20
    with pytest.raises(bench.WorkerGone, match="memory guard: MemAvailable 0.10 GiB fell under "
                                               r"the 1.0 GiB reserve; stopped w \(RSS"):
        worker.ask({"prompt": [1], "new": 1})
    assert worker.proc.returncode == -9
    late = bench.Worker.__new__(bench.Worker)  # a worker started after the guard tripped
    late.proc = subprocess.Popen([sys.executable, "-c", code])
    guard.watch(late)
    assert late.proc.wait(timeout=10) == -9
