"""A GGUF's weights placed while torch imports (runtime/early.py): the engine's module
imports no torch, the placement starts before torch does, the placed arena is the decoder's
and holds the bytes the decoder would have placed itself, and the refusals still come before
anything is allocated."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

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
from radixlm.native import arena
from radixlm.runtime import early
from radixlm.runtime import engine as E
order, placed = [], []
start, classes, place = early.start, E.runtime_classes, early.place_early
def start_(*a):
    order.append(("start", "torch" in sys.modules))
    return start(*a)
def classes_():
    order.append(("runtime", "torch" in sys.modules))
    return classes()
def place_(*a):
    out = place(*a)
    placed.append(out)
    return out
early.start, E.runtime_classes, early.place_early = start_, classes_, place_
engine = E.Engine(max_total_tokens=512, log_level="warning")
text = engine.generate("Hi", {"max_new_tokens": 2, "temperature": 0})["text"]
same = engine.runner.native.arena is placed[0].placed.arena
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


def _arena_bytes(engine) -> np.ndarray:
    a = engine.runner.native.arena
    return a._buf[:a.copied_bytes]


def test_early_and_runner_placement_are_the_same_bytes_and_answers(monkeypatch):
    """The arena placed early and the one the runner places itself (early declined) hold the
    same bytes in the same layout, and answer alike to the bit (greedy ids and logprobs)."""
    captured = []
    place = early.place_early
    monkeypatch.setattr(early, "place_early",
                        lambda *a: captured.append(place(*a)) or captured[-1])
    params = {"temperature": 0, "max_new_tokens": 12}
    prompts = ["The capital of France is", "def fibonacci(n):"]
    with Engine(max_total_tokens=1024, log_level="warning") as first:
        assert captured and first.runner.native.arena is captured[0].placed.arena
        ours = first.generate(prompts, params, return_logprob=True)
        ours_bytes = _arena_bytes(first).copy()
    monkeypatch.setattr(early, "eligible", lambda *a: False)
    with Engine(max_total_tokens=1024, log_level="warning") as second:
        assert len(captured) == 1  # (not placed early this time)
        theirs = second.generate(prompts, params, return_logprob=True)
        assert np.array_equal(ours_bytes, _arena_bytes(second))
    for a, b in zip(ours, theirs, strict=True):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]


def _no_arena(monkeypatch) -> list:
    made = []
    init = arena_mod.Arena.__init__

    def tracked(self, *a, **k):
        made.append(1)
        init(self, *a, **k)

    monkeypatch.setattr(arena_mod.Arena, "__init__", tracked)
    return made


def _started(monkeypatch) -> list:
    futures = []
    start = early.start
    monkeypatch.setattr(early, "start", lambda *a: futures.append(start(*a)) or futures[-1])
    return futures


def test_a_model_that_does_not_fit_is_refused_before_the_arena(monkeypatch):
    made, futures = _no_arena(monkeypatch), _started(monkeypatch)
    monkeypatch.setattr(early, "available_memory", lambda: 64 << 20)
    with pytest.raises(ValueError, match=r"does not fit in memory.*needed, 0\.06 GiB available"):
        Engine(max_total_tokens=1024, log_level="warning")
    assert futures and futures[0] is not None
    assert isinstance(futures[0].exception(timeout=60), ValueError)
    assert made == []


def test_a_damaged_vocabulary_is_refused_before_the_arena(monkeypatch):
    made, futures = _no_arena(monkeypatch), _started(monkeypatch)

    def damaged(path):
        raise ValueError("vocabulary damaged (test)")

    monkeypatch.setattr(E, "checked_vocabulary", damaged)
    with pytest.raises(ValueError, match="vocabulary damaged"):
        Engine(max_total_tokens=1024, log_level="warning")
    assert futures and futures[0] is not None
    assert "vocabulary damaged" in str(futures[0].exception(timeout=60))
    assert made == []


def test_weights_placed_for_another_dtype_are_placed_again(monkeypatch):
    """Where the runner's dtype is not the one the early plan assumed, the runner places the
    weights itself (the early arena let go), and the engine runs."""
    captured = []
    place = early.place_early
    monkeypatch.setattr(early, "place_early",
                        lambda *a: captured.append(place(*a)) or captured[-1])
    monkeypatch.setattr(early, "cpu_dtype_name", lambda *a: "bfloat16")
    with Engine(max_total_tokens=1024, dtype="float32", log_level="warning") as engine:
        assert captured and captured[0].dtype == "bfloat16"
        assert engine.runner.native.arena is not captured[0].placed.arena
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
