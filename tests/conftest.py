"""Shared fixtures: the real default model (converted once, cached), a transformers
reference, one `radixlm serve` on it for every test that needs a real server, and a tiny
random-weight model with the same tokenizer for fast scheduler tests."""

from __future__ import annotations

# radixlm before torch, as in every radixlm entry point: importing it bounds OpenMP's
# spin-wait (GOMP_SPINCOUNT), which libgomp reads once, when torch loads it. With torch
# first, this process's engines ran with libgomp's ~300k-iteration spin at every barrier.
import radixlm  # noqa: F401  # isort: skip

import copy
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from server_fakes import STARTUP_POLL_S, free_port, health_ok, wait_until

from radixlm.runtime.weights import hf_dir_from_gguf, load_tokenizer, resolve_model

# The grammar walks and schema conformance checks live beside the benchmark that reports them
# (benchmarks/bench_schema_coverage.py); the tests import them from there.
sys.path.append(str(Path(__file__).resolve().parent.parent / "benchmarks"))


@pytest.fixture(scope="session", autouse=True)
def _parse_each_gguf_once():
    """Each real-model Engine reads its GGUF's native blocks through
    ``radixlm.native.qweights.gguf_blocks``, and gguf's reader spends ~5 s of Python per
    call on the file's metadata (the 49k-token vocabulary); a dozen engines in this process
    read the same file. Here each file (path, mtime, size) is parsed once per session and
    the blocks shared read-only. The parser itself is still tested on every call in
    test_native.py, which holds its own reference to the unpatched function."""
    from radixlm.native import qweights

    parse, parsed = qweights.gguf_blocks, {}

    def parse_once(path):
        st = os.stat(path)
        key = (str(Path(path).resolve()), st.st_mtime_ns, st.st_size)
        if key not in parsed:
            blocks = parse(path)
            for w in blocks.values():
                for a in (w.qs, w.d, w.m):
                    if a is not None:
                        a.flags.writeable = False  # shared by every engine: no one writes
            parsed[key] = blocks
        return dict(parsed[key])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(qweights, "gguf_blocks", parse_once)
        yield


@pytest.fixture(scope="session", autouse=True)
def _convert_each_tokenizer_once_for_llguidance():
    """Every llguidance grammar backend, so every Engine (well over a hundred a session,
    nearly all on one vocabulary), converts its tokenizer with
    ``llguidance.hf.from_tokenizer`` (~0.4 s for 49k tokens; "the result should be cached",
    says its docstring). Here a conversion is made once per tokenizer (the Rust tokenizer's
    JSON, which holds the added tokens too), n_vocab, EOS and slices, and shared: the
    LLTokenizer is immutable, as a server's backends would share it."""
    import hashlib

    import llguidance.hf
    import transformers

    convert, made = llguidance.hf.from_tokenizer, {}

    def convert_once(hf_tokenizer, n_vocab=None, eos_token=None, slices=None):
        if not isinstance(hf_tokenizer, transformers.PreTrainedTokenizerFast):
            return convert(hf_tokenizer, n_vocab, eos_token, slices)
        text = hf_tokenizer.backend_tokenizer.to_str()
        key = (hashlib.sha256(text.encode()).hexdigest(), n_vocab, repr(eos_token),
               hf_tokenizer.eos_token_id, repr(slices))
        if key not in made:
            made[key] = convert(hf_tokenizer, n_vocab, eos_token, slices)
        return made[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llguidance.hf, "from_tokenizer", convert_once)
        yield


@pytest.fixture(scope="session", autouse=True)
def _read_each_gguf_header_once_for_transformers():
    """transformers' GGUF support reads a file's metadata with gguf's reader (~3 s of Python
    for a 49k-token vocabulary) for the config, again for the tokenizer's, at every
    ``from_pretrained(..., gguf_file=...)``; the K-quant reference tests load each file for
    every activation mode. Metadata-only reads (``return_tensors=False``) are parsed once per
    file (path, mtime, size) and handed out as deep copies; reads of tensors are not cached."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    load, parsed = gguf_utils.load_gguf_checkpoint, {}

    def load_once(path, return_tensors=False, *args, **kwargs):
        if return_tensors or args or kwargs:
            return load(path, return_tensors, *args, **kwargs)
        st = os.stat(path)
        key = (str(Path(path).resolve()), st.st_mtime_ns, st.st_size)
        if key not in parsed:
            parsed[key] = load(path, return_tensors=False)
        return copy.deepcopy(parsed[key])

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf_utils, "load_gguf_checkpoint", load_once)
        yield


@pytest.fixture(scope="session")
def model_gguf() -> Path:
    """The embedded model's GGUF, as the engine reads it."""
    return resolve_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def model_dir(model_gguf):
    """The same model as a Hugging Face directory (dequantized fp32; made once under the
    cache dir by the test reference converter): transformers' reference and the engine's
    dense path."""
    return hf_dir_from_gguf(model_gguf)


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    return load_tokenizer(model_dir)


@pytest.fixture(scope="session")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def engine_fp32():
    """The real model in fp32 (close comparisons with transformers and the reference
    path): fp32 activations in every native step too (the default runs int8 activation
    blocks on a GGUF where the CPU has u8 x s8 SIMD, llama.cpp's numbers). Not
    batch-invariant: the fp32 kernels sum in an order chosen by the step's size (under 4
    tokens, from 4, AVX2's panel from 16), so a token's logits can differ in the last bits
    between two runs scheduled into other steps (alone or batched, a cache hit or a miss):
    tests that compare two runs exactly use ``engine_default``."""
    from radixlm.runtime.engine import Engine

    engine = Engine(dtype="float32", native_activations="fp32", max_total_tokens=16384,
                    log_level="warning")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def engine_default():
    """The real model on the defaults, for tests that compare two runs exactly (alone and
    batched, a cache hit and a miss, streamed and not): the GGUF runs every step natively
    in int8 activation blocks, one rounding at every step size (batch-invariant,
    ``STEP_INVARIANT_MODES``), so a token's logits are the same bits however its steps
    were scheduled and the comparisons hold by construction."""
    from radixlm.runtime.engine import Engine

    engine = Engine(max_total_tokens=16384, log_level="warning")
    assert engine.batch_invariant, engine.runner.precision
    yield engine
    engine.shutdown()


class RealServer:
    """`radixlm serve` on the default model in a child process on loopback, shared by the
    modules that drive a real server (each start costs ~10-30 s on 2 cores). A test may
    stop it (test_server_e2e's SIGTERM test does): ``ensure_up`` starts a fresh one."""

    CONTEXT = 512
    MAX_TOTAL_TOKENS = 8192
    MAX_RUNNING = 16

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self._log = None

    def ensure_up(self) -> RealServer:
        if self.proc is None or self.proc.poll() is not None:
            self.stop()
            self._start()
        return self

    def _start(self) -> None:
        root = Path(__file__).resolve().parent.parent
        port = free_port()
        cmd = [sys.executable, "-m", "radixlm.cli", "serve", "--port", str(port),
               "--context-length", str(self.CONTEXT),
               "--max-total-tokens", str(self.MAX_TOTAL_TOKENS),
               # the default activations: int8 blocks at every step size (batch-invariant),
               # so a cache hit's answer is the miss's bit for bit, and a request's the same
               # alone or beside others (fp32 activations would not be: their kernels sum
               # by step size, and a hit recomputes the prompt's last token in a 1-token
               # step, unlike its prefill, which can flip a near-tie)
               "--max-running-requests", str(self.MAX_RUNNING), "--log-level", "warning"]
        env = {**os.environ, "PYTHONPATH": str(root)}
        log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"radixlm-e2e-{port}.log", "w+")  # noqa: SIM115
        self._log, self.url = log, f"http://127.0.0.1:{port}"
        self.proc = proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            cwd=root)

        def up() -> bool:
            if proc.poll() is not None:
                log.seek(0)
                raise AssertionError(f"server exited with {proc.returncode}:\n"
                                     f"{log.read()[-3000:]}")
            return health_ok(self.url)

        try:
            wait_until(up, "the server to start", limit_s=300, interval=STARTUP_POLL_S)
            # what the modules' comparisons of two answers rest on (see cmd above)
            info = httpx.get(self.url + "/get_server_info", timeout=60).json()
            assert info["batch_invariant"] is True, info.get("activations")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=60)
            self.proc = None
        if self._log is not None:  # (its tail is in any start failure's message)
            self._log.close()
            Path(self._log.name).unlink(missing_ok=True)
            self._log = None


# Tests that stop the shared real server: they run after every other test of the session, so
# that the server starts once (a restart for the modules after them costs ~10-30 s).
STOPS_THE_REAL_SERVER = ("tests/test_server_e2e.py::test_sigterm_drains_and_exits_0",)


def pytest_collection_modifyitems(session, config, items) -> None:
    last = [item for item in items if item.nodeid in STOPS_THE_REAL_SERVER]
    if last:
        items[:] = [item for item in items if item not in last] + last


@pytest.fixture(scope="session")
def _real_server_holder() -> Iterator[RealServer]:
    holder = RealServer()
    try:
        yield holder
    finally:
        holder.stop()


@pytest.fixture(scope="module")
def real_server(_real_server_holder: RealServer) -> RealServer:
    """The shared real server, started (again, if a test stopped it) for this module."""
    return _real_server_holder.ensure_up()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer):
    """A 2-layer random Llama with SmolLM2's tokenizer (GQA 4:2, head_dim 16)."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    out = tmp_path_factory.mktemp("tiny-llama")
    vocab = len(tokenizer)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=1024, tie_word_embeddings=True,
                      eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    cfg.save_pretrained(out)
    tokenizer.save_pretrained(out)
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape, scale=0.08):
        return torch.randn(*shape, generator=gen) * scale

    state = {"model.embed_tokens.weight": rnd(vocab, 64, scale=1.0),
             "model.norm.weight": torch.ones(64)}
    for i in range(2):
        p = f"model.layers.{i}."
        state.update({
            p + "input_layernorm.weight": torch.ones(64),
            p + "post_attention_layernorm.weight": torch.ones(64),
            p + "self_attn.q_proj.weight": rnd(64, 64),
            p + "self_attn.k_proj.weight": rnd(32, 64),
            p + "self_attn.v_proj.weight": rnd(32, 64),
            p + "self_attn.o_proj.weight": rnd(64, 64),
            p + "mlp.gate_proj.weight": rnd(128, 64),
            p + "mlp.up_proj.weight": rnd(128, 64),
            p + "mlp.down_proj.weight": rnd(64, 128),
        })
    save_file(state, str(out / "model.safetensors"))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return out
