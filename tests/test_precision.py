"""Precision as loaded, quantization on request, and the activation rule by ISA.

A safetensors checkpoint runs at its own precision (dense rows natively too: the family
tests in test_model_families.py check it against transformers); ``quantization=q8_0 |
q4_0 | q4_1`` (SGLang's ``--quantization``) turns llama.cpp's block rounding on, and every
path then runs the blocks' numbers; a GGUF runs its own blocks (quantizing an already
quantized one is refused, naming both); the server says which weights and activations run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from test_model_families import _build, _prompts

from radixlm.native import build
from radixlm.native.qweights import quantize
from radixlm.runtime.config import EngineConfig

needs_native = pytest.mark.skipif(build.load() is None,
                                  reason="the native library cannot be built here")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, tokenizer):
    """A tiny random Llama 3 (fp32 safetensors, tied head) with SmolLM2's tokenizer."""
    out = tmp_path_factory.mktemp("llama3")
    _build("llama3", tokenizer, out)
    return out


def _score(engine, ids: list[list[int]]) -> np.ndarray:
    """Every position's logprob of the given token sequences (one prefill step each)."""
    outs = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0},
                           return_logprob=True, logprob_start_len=0)
    return np.array([lp for o in outs for lp, _, _ in o["meta_info"]["input_token_logprobs"]
                     if lp is not None])


@pytest.mark.parametrize("kind", ["q8_0", "q4_0", "q4_1"])
def test_quantizers_round_as_llamacpp_does(kind):
    """Our blocks of each kind dequantize to gguf-py's own quantizer's numbers (llama.cpp's
    reference rules), up to the rounding of a scale: within one quantization step
    everywhere, identical almost everywhere."""
    import gguf

    w = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    ours = quantize(w, kind).dequantize()
    qtype = getattr(gguf.GGMLQuantizationType, kind.upper())
    theirs = gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype)
    step = np.abs(w).max() / (127 if kind == "q8_0" else 7)
    assert np.abs(ours - theirs).max() <= step
    assert (ours == theirs).mean() > 0.98
    assert np.abs(ours - w).max() > 0  # and it is a rounding


# How far the blocks' logprobs may lie from the dense checkpoint's on the tiny model
# (max, mean; measured 0.10, 0.023 for q8_0, 1.05 / 1.39, 0.37 / 0.32 for q4_0 / q4_1: its
# weights are large and its logits sharp).
VS_DENSE = {"q8_0": (0.3, 0.05), "q4_0": (3.0, 0.6), "q4_1": (3.0, 0.6)}


@needs_native
@pytest.mark.parametrize("kind", list(VS_DENSE))
def test_quantization_runs_blocks(llama_dir, tokenizer, kind):
    """``quantization=kind`` on a safetensors checkpoint: the native path runs the blocks
    (fp32 activations: the same logprobs, within 2e-3, and greedy tokens as the torch path
    on the blocks' dequantized values), the numbers differ from the dense checkpoint's by
    the rounding (more than 1e-4 somewhere, within VS_DENSE), and the start log's
    precision names it."""
    from radixlm.runtime.engine import Engine

    prompts = _prompts(len(tokenizer))
    params = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
    kw = {"max_total_tokens": 2048, "log_level": "warning"}
    with Engine(str(llama_dir), quantization=kind, native_activations="fp32", **kw) as q:
        assert q.runner.native is not None
        head = "" if kind == "q8_0" else ", head q8_0"
        assert q.runner.precision == {"weights": f"{kind}{head} (quantized at load)",
                                      "activations": "fp32"}
        outs = q.generate(input_ids=prompts, sampling_params=params)
        seqs = [p + o["output_ids"] for p, o in zip(prompts, outs)]
        native = _score(q, seqs)
    with Engine(str(llama_dir), quantization=kind, weight_quant="none", **kw) as ref:
        assert ref.runner.native is None
        assert [o["output_ids"] for o in ref.generate(input_ids=prompts,
                                                      sampling_params=params)] == [
            o["output_ids"] for o in outs]
        np.testing.assert_allclose(native, _score(ref, seqs), atol=2e-3)
    with Engine(str(llama_dir), **kw) as dense:
        assert dense.runner.precision["weights"] == "fp32"
        diff = np.abs(native - _score(dense, seqs))
    assert 1e-4 < diff.max() < VS_DENSE[kind][0] and diff.mean() < VS_DENSE[kind][1]


@needs_native
def test_quantized_default_activations_follow_the_isa_rule(llama_dir):
    """Blocks made at load are block weights like a GGUF's: every step runs int8
    activation blocks where the CPU has u8 x s8 SIMD (batch-invariant), and the start log
    says so."""
    from radixlm.native.build import ACT_F32, ACT_INT8, int8_decode_preferred
    from radixlm.runtime.engine import Engine

    with Engine(str(llama_dir), quantization="q8_0", max_total_tokens=1024,
                log_level="warning") as engine:
        int8 = int8_decode_preferred()
        assert engine.runner.native.act_modes == (((1, ACT_INT8),) if int8
                                                  else ((1, ACT_F32),))
        assert engine.runner.precision["activations"] == ("int8" if int8 else "fp32")


@needs_native
def test_int8_activations_on_dense_weights_are_refused(llama_dir):
    from radixlm.runtime.engine import Engine

    with pytest.raises(ValueError, match="native_activations='int8'.*dense fp32"):
        Engine(str(llama_dir), native_activations="int8", max_total_tokens=1024,
               log_level="warning")


def test_bad_quantization_values_are_refused_by_name():
    """An unknown block type names the choices (in-process and from the CLI's flags);
    weight_quant="int4" beside another block type names both."""
    from radixlm.cli import build_parser, engine_kwargs_from_args

    for value in ("q5_k", "awq", "Q8_0", ""):
        with pytest.raises(ValueError, match=r"quantization must be one of q8_0, q4_0, q4_1"):
            EngineConfig(quantization=value)
    args = build_parser().parse_args(["serve", "--quantization", "fp8"])
    with pytest.raises(ValueError, match=r"one of q8_0, q4_0, q4_1 .* got 'fp8'"):
        EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    args = build_parser().parse_args(["serve", "--quantization", "q4_1",
                                      "--native-activations", "fp32"])
    config = EngineConfig.from_kwargs(**engine_kwargs_from_args(args))
    assert (config.quantization, config.native_activations) == ("q4_1", "fp32")
    with pytest.raises(ValueError, match="weight_quant='int4'.*quantization='q8_0'"):
        EngineConfig(weight_quant="int4", quantization="q8_0")
    assert EngineConfig(weight_quant="int4", quantization="q4_1").quantization == "q4_1"


def test_quantizing_a_quantized_gguf_is_refused_naming_both(model_dir):
    """The embedded model is a Q4_1 GGUF: --quantization q8_0 on it names the file's type
    and the one asked, before any weight is loaded."""
    from radixlm.runtime.engine import Engine

    with pytest.raises(ValueError, match=r"quantization='q8_0'.*already quantized "
                                         r"\(file type Q4_1; tensors Q4_1, Q8_0\)"):
        Engine(quantization="q8_0", max_total_tokens=1024, log_level="warning")


def test_server_info_says_which_weights_and_activations_run(llama_dir):
    from radixlm.runtime.engine import Engine
    from radixlm.server.app import create_app

    with Engine(str(llama_dir), max_total_tokens=1024, log_level="warning") as engine:
        info = TestClient(create_app(engine)).get("/get_server_info").json()
    assert (info["weights"], info["activations"]) == ("fp32", "fp32")
    assert info["quantization"] is None and info["dtype"] == "auto"
    assert info["max_total_num_tokens"] == 1024  # SGLang's name for the pool's tokens


@pytest.mark.parametrize("checkpoint,native_bf16,expected", [
    ("float32", True, torch.float32), ("float16", True, torch.float32),
    ("bfloat16", True, torch.bfloat16), ("bfloat16", False, torch.float32),
    (None, True, torch.bfloat16), (None, False, torch.float32)])
def test_dtype_auto_is_the_checkpoints_own(monkeypatch, checkpoint, native_bf16, expected):
    """dtype auto on a CPU: a checkpoint's stated dtype where the host computes it natively
    (fp16 widened to fp32, exactly; bf16 widened where bf16 is emulated); none stated (a
    GGUF): bf16 where native, else fp32. An explicit dtype wins."""
    from radixlm.runtime import device

    monkeypatch.setattr(device, "cpu_has_native_bf16", lambda: native_bf16)
    config = EngineConfig(device="cpu")
    assert device.pick_device_dtype(config, checkpoint)[1] == expected
    assert device.pick_device_dtype(EngineConfig(device="cpu", dtype="bfloat16"),
                                    checkpoint)[1] == torch.bfloat16


@needs_native
def test_dense_rows_on_an_int8_kv_pool(llama_dir, tokenizer):
    """A checkpoint's dense rows beside an int8 K/V pool (--kv-cache-dtype int8): the native
    steps store and read the pool's int8 rows as the torch path does (greedy tokens equal,
    logprobs within 2e-3 of the torch path's on the same pool format; steps small enough
    for the native library: one sequence at a time), and the rounding is really there
    (more than 1e-4 from the fp32 pool's somewhere)."""
    from radixlm.runtime.engine import Engine

    prompts = _prompts(len(tokenizer))
    params = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
    kw = {"max_total_tokens": 2048, "log_level": "warning"}

    def run(engine):
        outs = [engine.generate(input_ids=p, sampling_params=params, return_logprob=True)
                for p in prompts]
        seqs = [p + o["output_ids"] for p, o in zip(prompts, outs)]
        decode = [lp for o in outs for lp, _, _ in o["meta_info"]["output_token_logprobs"]]
        return seqs, np.array(decode), np.concatenate([_score(engine, [s]) for s in seqs])

    with Engine(str(llama_dir), kv_cache_dtype="int8", **kw) as native:
        assert native.runner.native is not None
        assert native.runner.precision == {"weights": "fp32", "activations": "fp32"}
        steps, forward = [], native.runner.native.forward
        native.runner.native.forward = lambda batch: steps.append(batch) or forward(batch)
        seqs, decode, scores = run(native)
        assert len(steps) >= len(prompts) * params["max_new_tokens"]
    with Engine(str(llama_dir), kv_cache_dtype="int8", weight_quant="none", **kw) as ref:
        assert ref.runner.native is None
        ref_seqs, ref_decode, ref_scores = run(ref)
    assert ref_seqs == seqs
    np.testing.assert_allclose(decode, ref_decode, atol=2e-3)
    np.testing.assert_allclose(scores, ref_scores, atol=2e-3)
    with Engine(str(llama_dir), **kw) as fp32_kv:
        assert np.abs(scores - run(fp32_kv)[2]).max() > 1e-4


@needs_native
def test_float32_asked_runs_fp32_activations_on_every_step():
    """dtype="float32" on a GGUF: every native step reads fp32 activations (the default
    would run int8 small steps where the CPU has u8 x s8 SIMD); an explicit mode still
    wins, and dtype auto keeps the host's rule."""
    from radixlm.native.build import ACT_F32, ACT_INT8, int8_decode_preferred
    from radixlm.runtime.engine import Engine

    with Engine(dtype="float32", max_total_tokens=1024, log_level="warning") as engine:
        assert engine.runner.native.act_modes == ((1, ACT_F32),)
        assert engine.runner.precision["activations"] == "fp32"
    assert EngineConfig(dtype="float32", native_activations="int8").activations == "int8"
    assert EngineConfig(dtype="auto").activations == "auto"
    if int8_decode_preferred():
        with Engine(max_total_tokens=1024, log_level="warning") as engine:
            assert engine.runner.native.act_modes[0] == (1, ACT_INT8)
