"""A GGUF's weights placed while torch imports (runtime/early.py): the engine's module and the
early path import no torch, the placement starts before torch does, the placed arena is the
decoder's and holds the bytes the decoder would have placed itself (the K-quant rows repacked
in one C call, as one by one), and the refusals still come before anything is allocated."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from test_native_kquants import write_tiny_gguf

from radixlm.native import arena as arena_mod
from radixlm.runtime import early
from radixlm.runtime import engine as E
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.engine import Engine

_TORCH_FREE = r"""
import sys
import radixlm.runtime.engine, radixlm.runtime.early, radixlm.native.plan, radixlm.native.arena
import radixlm.runtime.models.shape, radixlm.runtime.memory, radixlm.runtime.weights
import radixlm.runtime.gguf_load
print("torch" in sys.modules)
"""


def test_the_engine_module_and_the_early_path_import_no_torch():
    out = subprocess.run([sys.executable, "-c", _TORCH_FREE], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"


_ORDER_PROBE = r"""
import json, sys
from radixlm.runtime import early
from radixlm.runtime import engine as E
order, started = [], []
start, classes = early.start, E.runtime_classes
def start_(*a):
    order.append(("start", "torch" in sys.modules))
    started.append(start(*a))
    return started[-1]
def classes_():
    order.append(("runtime", "torch" in sys.modules))
    return classes()
early.start, E.runtime_classes = start_, classes_
engine = E.Engine(max_total_tokens=512, log_level="warning")
text = engine.generate("Hi", {"max_new_tokens": 2, "temperature": 0})["text"]
same = engine.runner.native.arena is started[0].placing.result().arena
print(json.dumps({"order": order, "same_arena": same, "text": text}))
engine.shutdown()
"""


def test_a_fresh_start_places_the_weights_beside_torchs_import():
    """In a fresh process the placement is started before the runtime (torch) is imported,
    and the decoder runs the arena it placed."""
    out = subprocess.run([sys.executable, "-c", _ORDER_PROBE], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["order"] == [["start", False], ["runtime", False]]
    assert got["same_arena"] and got["text"]


def _captured(monkeypatch) -> list:
    """The EarlyWeights each engine start made (None where it placed nothing early)."""
    made = []
    start = early.start
    monkeypatch.setattr(early, "start", lambda *a: made.append(start(*a)) or made[-1])
    return made


def _arena_bytes(engine) -> np.ndarray:
    a = engine.runner.native.arena
    return a._buf[:a.copied_bytes]


@pytest.fixture(scope="module")
def kquant_file(tmp_path_factory):
    """A tiny Llama in Q4_K / Q5_K / Q6_K / Q8_0 (test_native_kquants's mix)."""
    from test_native_kquants import _type_of

    return write_tiny_gguf(tmp_path_factory.mktemp("early") / "tiny-kmix.gguf", "tiny",
                           _type_of)


@pytest.mark.parametrize("which", ["embedded", "kquants"])
def test_early_and_runner_placement_are_the_same_bytes_and_answers(which, kquant_file,
                                                                   monkeypatch):
    """The arena placed early and the one the runner places itself (early declined) hold the
    same bytes in the same layout, and answer alike to the bit (greedy ids and logprobs):
    the embedded model (Q4_1 / Q8_0 rows) and a K-quant file (on 512-bit builds its rows
    repacked in the one call)."""
    model = None if which == "embedded" else str(kquant_file)
    made = _captured(monkeypatch)
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    prompts = ["The capital of France is", "def fibonacci(n):"]
    with Engine(model, max_total_tokens=1024, log_level="warning") as first:
        assert made and first.runner.native.arena is made[0].placing.result().arena
        ours = first.generate(prompts, params, return_logprob=True)
        ours_bytes = _arena_bytes(first).copy()
    monkeypatch.setattr(early, "eligible", lambda *a: False)
    with Engine(model, max_total_tokens=1024, log_level="warning") as second:
        assert made[1] is None  # (not placed early this time)
        theirs = second.generate(prompts, params, return_logprob=True)
        assert np.array_equal(ours_bytes, _arena_bytes(second))
    for a, b in zip(ours, theirs, strict=True):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]


def test_rows_repacked_in_one_call_are_placed_as_one_by_one(kquant_file):
    """``Arena.place_all`` (the file's K-quant rows repacked in one C call, each one's file
    pages given back after) against ``Arena.place`` a matrix at a time: the same bytes at the
    same offsets, the same C views (relative to each arena), and the file's pages given back
    as there (RssFile grows by the pages the rows share at their ends alone)."""
    from radixlm.native.build import load
    from radixlm.native.plan import decoder_modes, step_weights
    from radixlm.runtime.gguf_load import native_blocks
    from radixlm.runtime.weights import load_hf_config

    lib = load()
    hf = load_hf_config(kquant_file)
    blocks = native_blocks(kquant_file, hf).blocks
    weights = step_weights(blocks, hf.num_hidden_layers, tied=True, embed_from_blocks=True,
                           missing=early._missing)
    modes = decoder_modes(lib, "int8", "float32", weights.flat, weights.head)
    for w in weights.order:
        arena_mod.give_back(w)
    before = _rss_file_kb()
    one = arena_mod.arena_for(lib, weights, modes, 2)
    views_one = {}
    for w in weights.order:
        views_one[id(w)] = one.place(w)
        if not one.in_place(w):
            arena_mod.give_back(w)
    left_one = _rss_file_kb() - before
    for w in weights.order:
        arena_mod.give_back(w)
    before = _rss_file_kb()
    many = arena_mod.arena_for(lib, weights, modes, 2)
    batched = [w for w in weights.order if many.batched(w)]
    assert bool(batched) == bool(lib.rlm_kx_rows() or lib.rlm_kx32_rows())  # (512-bit builds)
    views_many = many.place_all(weights.order, 2, arena_mod.give_back)
    left_many = _rss_file_kb() - before  # (KiB; the pages the rows share at their ends)
    assert left_many <= left_one + 16
    assert left_many < sum(w.qs.nbytes for w in batched) // 1024 // 4 or not batched
    assert one.copied_bytes == many.copied_bytes
    assert np.array_equal(one._buf[:one.copied_bytes], many._buf[:many.copied_bytes])
    for w in weights.order:
        a, b = views_one[id(w)][0], views_many[id(w)][0]
        assert (a.fmt, a.n, a.k) == (b.fmt, b.n, b.k)
        assert ([_where(getattr(a, f), one) for f in ("qs", "d", "m", "qx")]
                == [_where(getattr(b, f), many) for f in ("qs", "d", "m", "qx")])


def _where(address: int | None, arena) -> tuple[str, int] | None:
    """An address as an offset in ``arena``, else as it is (the file map's, or None)."""
    base = arena._buf.ctypes.data
    if address is not None and base <= address < base + arena._buf.nbytes:
        return ("arena", address - base)
    return None if address is None else ("elsewhere", address)


def _rss_file_kb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    raise AssertionError("no RssFile in /proc/self/status")


def _no_arena(monkeypatch) -> list:
    made = []
    init = arena_mod.Arena.__init__

    def tracked(self, *a, **k):
        made.append(1)
        init(self, *a, **k)

    monkeypatch.setattr(arena_mod.Arena, "__init__", tracked)
    return made


def test_a_model_that_does_not_fit_is_refused_before_the_arena(monkeypatch):
    made = _no_arena(monkeypatch)
    monkeypatch.setattr(early, "available_memory", lambda: 64 << 20)
    with pytest.raises(ValueError, match=r"does not fit in memory.*needed, 0\.06 GiB available"):
        Engine(max_total_tokens=1024, log_level="warning")
    assert made == []


def test_a_damaged_vocabulary_is_refused_before_the_arena(monkeypatch):
    made = _no_arena(monkeypatch)

    def damaged(path):
        raise ValueError("vocabulary damaged (test)")

    monkeypatch.setattr(E, "checked_vocabulary", damaged)
    with pytest.raises(ValueError, match="vocabulary damaged"):
        Engine(max_total_tokens=1024, log_level="warning")
    assert made == []


def test_weights_placed_for_another_dtype_are_placed_again(monkeypatch):
    """Where the runner's dtype is not the one the early plan assumed, the runner places the
    weights itself (the early arena let go), and the engine runs."""
    made = _captured(monkeypatch)
    monkeypatch.setattr(early, "cpu_dtype_name", lambda *a: "bfloat16")
    with Engine(max_total_tokens=1024, dtype="float32", log_level="warning") as engine:
        assert made and made[0].dtype == "bfloat16"
        assert engine.runner.native.arena is not made[0].placing.result().arena
        assert engine.generate("Hi", {"max_new_tokens": 2})["text"]


def test_eligible_only_where_the_runner_reads_the_file_natively_on_a_cpu(
        model_gguf, model_dir, tmp_path, monkeypatch):
    from radixlm.runtime.weights import load_hf_config

    hf = load_hf_config(model_gguf)

    def ok(**kw) -> bool:
        return early.eligible(EngineConfig(**kw), model_gguf, hf)

    assert ok()
    assert ok(device="cpu")
    assert not ok(device="cuda")
    assert not ok(tp_size=2)
    assert not ok(quantization="q8_0")
    assert not ok(weight_quant="none")
    assert not ok(kv_cache_dtype="fp8_e4m3")
    assert not early.eligible(EngineConfig(), model_dir, load_hf_config(model_dir))
    gpu = tmp_path / "nvidiactl"
    gpu.write_text("")
    monkeypatch.setattr(early, "_GPU_DEVICES", (str(gpu),))
    assert not ok() and ok(device="cpu")  # (an "auto" device may be that GPU)


def test_the_placement_threads_follow_torchs_default(monkeypatch):
    """OMP_NUM_THREADS where set (a number), else this process's CPUs; where the platform
    has no affinity call, every CPU."""
    import os

    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert early._threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    assert early._threads() == len(os.sched_getaffinity(0))
    monkeypatch.delattr(os, "sched_getaffinity")
    assert early._threads() == (os.cpu_count() or 1)
