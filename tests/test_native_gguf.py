"""A GGUF read as a GGUF: the file's blocks are the only weights, every step runs natively,
nothing is converted or written, memory counts the weights once, and a model that does not
fit is refused with the numbers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from radixlm.runtime.engine import Engine

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Water boils at",
           "The three primary colors are"]


def test_every_step_runs_natively_on_the_files_blocks(engine_fp32, model_gguf):
    runner = engine_fp32.runner
    assert engine_fp32.model_path == model_gguf  # the file itself
    assert runner.gguf_native and runner.native is not None
    assert runner.native.max_rows is None  # prefill chunks too
    model = runner.model
    assert model.embed is None and model.lm_head is None  # no dense copy of any matrix
    assert all(layer.qkv is None and layer.gate_up is None for layer in model.layers)
    assert all(layer.rope_pairs for layer in model.layers)  # llama.cpp's q/k rows as they are
    assert "no dense copy" in runner.precision["weights"]


def test_greedy_equals_transformers_on_the_dequantized_weights(engine_fp32, hf_model,
                                                               tokenizer):
    """fp32 activations on the blocks == transformers fp32 on the same weights dequantized
    (transformers un-permutes llama.cpp's q/k rows; the native layer rotates their pairs):
    prompts long enough for multi-token prefill steps, then decode."""
    outs = engine_fp32.generate(PROMPTS, {"temperature": 0, "max_new_tokens": 16})
    for prompt, out in zip(PROMPTS, outs):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.inference_mode():
            ref = hf_model.generate(ids, max_new_tokens=16, do_sample=False)
        assert out["output_ids"] == ref[0, ids.shape[1]:].tolist(), prompt


def test_nothing_is_written_to_the_cache_dir(tmp_path, monkeypatch):
    from radixlm import envs

    # the native library's builds are the only thing cached: the usual folder's, so that a
    # process whose first engine this is does not compile it again (~10 s)
    (tmp_path / "native").symlink_to(envs.cache_dir() / "native", target_is_directory=True)
    monkeypatch.setenv("RADIXLM_CACHE_DIR", str(tmp_path))
    with Engine(max_total_tokens=1024, log_level="warning") as engine:
        engine.generate("Hi", {"max_new_tokens": 2})
    written = [p for p in tmp_path.rglob("*") if p.is_file()]  # (rglob: no symlinked dirs)
    assert written == []


_RSS_PROBE = r"""
import json, resource, sys
import radixlm
from radixlm.runtime.weights import resolve_model
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
import torch, transformers  # what any engine imports, before the baseline
from radixlm.runtime.engine import Engine
from radixlm.native.build import load
from radixlm.runtime.weights import load_tokenizer
path = resolve_model("smollm2-135m-instruct")
load_tokenizer(path)  # (the tokenizer and the library are not weights: before the baseline)
load()
base = rss()
engine = Engine(max_total_tokens=256, chunked_prefill_size=64, log_level="warning")
after = rss()
print(json.dumps({"file": path.stat().st_size, "delta": after - base}))
"""


def test_loading_counts_the_weights_once():
    """RSS after loading minus before (torch, transformers, a tokenizer and the library
    already loaded) stays under 1.2x the file plus 64 MB for the engine's own tables (the
    grammar backend's token tables, pool, workspaces): the weights count once, the file
    map's pages given back as the arena copies them (measured: +145 MB for the 98 MB file)."""
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["delta"] < 1.2 * got["file"] + (64 << 20), got


def test_a_model_that_does_not_fit_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match=r"does not fit in memory.*needed.*available"):
        Engine(max_total_tokens=1 << 34, log_level="warning")
