"""Batch invariance on the torch path (``enable_deterministic_inference`` where the native
library does not run the model: ``weight_quant="none"`` here, tensor parallel, other
families): a greedy answer's token ids AND logprobs are the same bits alone, in a mixed
batch, beside decoding neighbours, after a cached prefix, on a full cache hit, with its
prompt chunked, with speculation's verify steps, in bf16, on an int8 K/V pool, on a tiny
Gemma 2 (soft-capping, sliding windows), and at TP=2 against its own reruns. The parts are
checked on their own too: the fixed-shape matmul, the attention's two layouts against each
other and against an fp64 reference (soft-capping and a sliding window included), the tree
sum, the ranks' fixed-order sum, and what is still refused.

The model is a 2-layer random Llama wide enough (hidden 256, head_dim 64) that the plain
torch path is not invariant on a Zen 4 (an fp32 GEMM over K = 256 sums a row in another
order at 1, 2-3 and 4+ rows; over K = 64 it does not)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from batch_fakes import extend_batch

from radixlm.runtime.attention.base import AttnLayerOptions, create_attention_backend
from radixlm.runtime.attention.invariant import (
    GATHER_MAX,
    KEY_BLOCK,
    InvariantAttentionBackend,
    tree_sum,
)
from radixlm.runtime.config import EngineConfig
from radixlm.runtime.engine import Engine
from radixlm.runtime.forward_batch import ForwardMode
from radixlm.runtime.kv_pool import KVPool
from radixlm.runtime.models.invariant import ROWS, fixed_rows_linear
from radixlm.runtime.parallel import TPGroup

NEW = 12
GREEDY = {"temperature": 0.0, "max_new_tokens": NEW, "ignore_eos": True}
SEEDED = {"temperature": 0.8, "max_new_tokens": 4, "ignore_eos": True, "sampling_seed": 3}
FLAG = {"enable_deterministic_inference": True, "weight_quant": "none",
        "max_total_tokens": 4096, "speculative_algorithm": "none", "log_level": "warning"}
HIDDEN, INTER, HEADS, KV_HEADS = 256, 512, 4, 2


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory, tokenizer):
    """A 2-layer random Llama (hidden 256, 4 heads of 64, GQA 2:1) with SmolLM2's
    tokenizer."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    out = tmp_path_factory.mktemp("wide-llama")
    vocab = len(tokenizer)
    LlamaConfig(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=INTER,
                num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                max_position_embeddings=1024, tie_word_embeddings=True,
                eos_token_id=tokenizer.eos_token_id,
                bos_token_id=tokenizer.bos_token_id).save_pretrained(out)
    tokenizer.save_pretrained(out)
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape, scale=0.08):
        return torch.randn(*shape, generator=gen) * scale

    kv = KV_HEADS * HIDDEN // HEADS
    state = {"model.embed_tokens.weight": rnd(vocab, HIDDEN, scale=1.0),
             "model.norm.weight": torch.ones(HIDDEN)}
    for i in range(2):
        p = f"model.layers.{i}."
        state.update({
            p + "input_layernorm.weight": torch.ones(HIDDEN),
            p + "post_attention_layernorm.weight": torch.ones(HIDDEN),
            p + "self_attn.q_proj.weight": rnd(HIDDEN, HIDDEN),
            p + "self_attn.k_proj.weight": rnd(kv, HIDDEN),
            p + "self_attn.v_proj.weight": rnd(kv, HIDDEN),
            p + "self_attn.o_proj.weight": rnd(HIDDEN, HIDDEN),
            p + "mlp.gate_proj.weight": rnd(INTER, HIDDEN),
            p + "mlp.up_proj.weight": rnd(INTER, HIDDEN),
            p + "mlp.down_proj.weight": rnd(HIDDEN, INTER),
        })
    save_file(state, str(out / "model.safetensors"))
    return out


def _ids(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 2000, (n,), generator=gen).tolist() for n in lengths]


# 200 tokens: 4 key blocks; 150 / 90 / 33: spans; 7 and 1: gathered queries from the start
PROMPTS = _ids((150, 7, 33, 90, 1, 200), seed=0)
OTHERS = _ids((3, 40, 9, 120, 1, 66, 12), seed=1)


def answer(out: dict) -> tuple:
    """A greedy answer's identity: (token id, logprob) per output token (the bits)."""
    return tuple((tid, lp) for lp, tid, _ in out["meta_info"]["output_token_logprobs"])


def ask(engine: Engine, batch: list[list[int]], params: dict = GREEDY) -> list[tuple]:
    outs = engine.generate(input_ids=batch, sampling_params=params, return_logprob=True)
    return [answer(o) for o in outs]


def alone_cold(engine: Engine, batch: list[list[int]]) -> list[tuple]:
    got = []
    for ids in batch:
        assert engine.flush_cache()
        got += ask(engine, [ids])
    return got


@pytest.fixture(scope="module")
def engine(wide_model_dir):
    with Engine(str(wide_model_dir), dtype="float32", **FLAG) as e:
        yield e


@pytest.fixture(scope="module")
def ref(engine):
    """Each prompt alone on a flushed cache: the reference of every axis."""
    return alone_cold(engine, PROMPTS)


# ---------------------------------------------------------------- the engine, bit for bit


def test_the_torch_path_runs_and_reports_invariance(engine):
    from fastapi.testclient import TestClient

    from radixlm.server.app import create_app

    runner = engine.runner
    assert runner.native is None and isinstance(runner.attn, InvariantAttentionBackend)
    assert runner.int4 is None and all(layer.qkv.fixed_rows for layer in runner.model.layers)
    assert engine.batch_invariant is True and engine.get_stats()["batch_invariant"] is True
    client = TestClient(create_app(engine))
    info = client.get("/get_server_info").json()
    assert info["batch_invariant"] is True and info["enable_deterministic_inference"] is True
    out = engine.generate(input_ids=PROMPTS[1], sampling_params=SEEDED)
    assert out["meta_info"]["reproducible"] is True


def test_single_and_mixed(engine, ref):
    """Alone again; inside batches of 2-8 requests of other lengths, at other positions;
    all the prompts at once (one prefill step of 481 tokens)."""
    assert len(set(ref)) == len(ref)
    assert alone_cold(engine, PROMPTS[:2]) == ref[:2]
    for size in (2, 5, 8):
        assert engine.flush_cache()
        batch = [OTHERS[(i + size) % len(OTHERS)] for i in range(size - 1)]
        k = size % len(PROMPTS)
        batch.insert(size // 2, PROMPTS[k])
        assert ask(engine, batch)[size // 2] == ref[k], size
    assert engine.flush_cache()
    assert ask(engine, PROMPTS) == ref


def test_mixed_with_decoding_neighbours(engine, ref):
    """A prompt that arrives while others decode: its prefill shares steps with their
    one-token rows, its decode steps are rows beside others at other positions."""
    longer = {**GREEDY, "max_new_tokens": 3 * NEW}
    for k in (0, 4):
        assert engine.flush_cache()
        streams = [engine.generate(input_ids=ids, sampling_params=longer, stream=True)
                   for ids in OTHERS[:4]]
        for s in streams:
            next(s)  # each has its first token: decoding
        assert ask(engine, [PROMPTS[k]])[0] == ref[k], k
        for s in streams:
            for _ in s:
                pass


def test_prefix_and_radix_cache(engine, ref):
    """A cached prefix of no block length (the rest computed), and full hits (prompt and
    answer in the tree: only the last token runs), alone and as a batch of hits."""
    assert engine.flush_cache()
    for ids, expected in zip(PROMPTS, ref):
        if len(ids) > 20:
            engine.generate(input_ids=ids[:len(ids) * 2 // 3 + 1], sampling_params={
                "max_new_tokens": 1})
            out = engine.generate(input_ids=ids, sampling_params=GREEDY, return_logprob=True)
            assert out["meta_info"]["cached_tokens"] > 10
            assert answer(out) == expected
    assert engine.flush_cache()
    for ids, expected in zip(PROMPTS, ref):
        engine.generate(input_ids=ids, sampling_params=GREEDY)
        out = engine.generate(input_ids=ids, sampling_params=GREEDY, return_logprob=True)
        assert out["meta_info"]["cached_tokens"] == len(ids) - 1
        assert answer(out) == expected
    assert ask(engine, PROMPTS) == ref


@pytest.mark.parametrize("chunk", [16, 37])
def test_chunked_prefill(wide_model_dir, ref, chunk):
    with Engine(str(wide_model_dir), dtype="float32", chunked_prefill_size=chunk,
                **FLAG) as e:
        assert alone_cold(e, PROMPTS[-1:]) == ref[-1:]
        assert e.flush_cache()
        assert ask(e, PROMPTS) == ref


def test_speculation_verify_steps(wide_model_dir, ref):
    """n-gram drafts verified in steps of several tokens: the same bits as decoding."""
    with Engine(str(wide_model_dir), dtype="float32",
                **{**FLAG, "speculative_algorithm": "NGRAM"}) as e:
        outs = [e.generate(input_ids=ids, sampling_params=GREEDY, return_logprob=True)
                for ids in PROMPTS]
        assert sum(o["meta_info"]["spec_verify_ct"] for o in outs) > 0  # drafts ran
        assert [answer(o) for o in outs] == ref


def test_bf16(wide_model_dir):
    """The host's bf16 (or fp32 where it has none): alone, batched, chunked, a hit."""
    with Engine(str(wide_model_dir), **FLAG) as e:
        assert e.batch_invariant
        alone = alone_cold(e, PROMPTS)
        assert e.flush_cache()
        assert ask(e, [*OTHERS[:3], *PROMPTS])[3:] == alone
        assert ask(e, PROMPTS) == alone  # (every prompt cached)
    with Engine(str(wide_model_dir), chunked_prefill_size=23, **FLAG) as e:
        assert ask(e, PROMPTS) == alone


def test_int8_kv_pool(wide_model_dir):
    """K/V stored as int8 rows (read back dequantized): alone, batched, a hit."""
    with Engine(str(wide_model_dir), dtype="float32", kv_cache_dtype="int8", **FLAG) as e:
        alone = alone_cold(e, PROMPTS[:3])
        assert e.flush_cache()
        assert ask(e, [OTHERS[0], *PROMPTS[:3]])[1:] == alone
        assert ask(e, PROMPTS[:3]) == alone


def test_a_family_with_softcap_and_windows(tmp_path, tokenizer):
    """A tiny Gemma 2 (attention and final soft-capping, an 8-token window on alternate
    layers, norms stored as w - 1): alone, batched, chunked, a hit."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    cfg = Gemma2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                       final_logit_softcapping=6.0, sliding_window=8,
                       max_position_embeddings=256, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.15)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    prompts = _ids((90, 5, 70), seed=2)
    with Engine(str(tmp_path), dtype="float32", **FLAG) as e:
        assert e.runner.model.cfg.attn_softcap == 2.0 and e.batch_invariant
        alone = alone_cold(e, prompts)
        assert e.flush_cache()
        assert ask(e, [OTHERS[1], *prompts])[1:] == alone
        assert ask(e, prompts) == alone  # full hits
    with Engine(str(tmp_path), dtype="float32", chunked_prefill_size=13, **FLAG) as e:
        assert ask(e, prompts) == alone


def test_tp2_against_its_own_reruns(wide_model_dir):
    """Two ranks (gloo): a prompt alone, in a batch, and on a hit, the same bits."""
    with Engine(str(wide_model_dir), dtype="float32", tp_size=2, **FLAG) as e:
        assert e.batch_invariant and e.runner.tp.fixed_order
        alone = alone_cold(e, PROMPTS[-2:])
        assert e.flush_cache()
        assert ask(e, [OTHERS[3], *PROMPTS[-2:], OTHERS[1]])[1:3] == alone
        assert ask(e, PROMPTS[-2:]) == alone  # full hits


# ---------------------------------------------------------------- what is still refused


@pytest.mark.parametrize("kwargs, named", [
    ({"attention_backend": "triton"}, "attention_backend='triton'"),
    ({"device": "cuda"}, "device='cuda'"),
])
def test_what_cannot_be_honoured_is_refused_by_name(kwargs, named):
    with pytest.raises(ValueError, match=f"enable_deterministic_inference cannot honour "
                                         f"{named}"):
        EngineConfig(enable_deterministic_inference=True, **kwargs)
    EngineConfig(**kwargs)  # fine without the flag
    for accepted in ({"attention_backend": "torch"}, {"weight_quant": "none"},
                     {"tp_size": 2}):
        EngineConfig(enable_deterministic_inference=True, **accepted)


def test_a_head_dim_off_the_alignment_is_refused():
    pool = KVPool(64, 1, 1, 24, torch.float32, torch.device("cpu"), 2, 32)
    with pytest.raises(ValueError, match="cannot honour head_dim=24 on the torch path"):
        create_attention_backend("torch", pool, 2, 1, 24, invariant=True)


# ---------------------------------------------------------------- the parts


def test_fixed_rows_linear_gives_a_row_the_same_bits_in_any_batch():
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        w = torch.randn(320, 576, generator=gen).to(dtype)
        bias = torch.randn(320, generator=gen).to(dtype)
        row = torch.randn(576, generator=gen).to(dtype)
        alone = fixed_rows_linear(row[None], w, bias)[0]
        for m in (2, 3, 5, ROWS, ROWS + 1, 3 * ROWS + 7):
            x = torch.randn(m, 576, generator=gen).to(dtype)
            for at in (0, m // 2, m - 1):
                x[at] = row
                assert torch.equal(fixed_rows_linear(x, w, bias)[at], alone), (dtype, m, at)
        x = torch.randn(40, 576, generator=gen).to(dtype)
        tol = 1e-5 if dtype == torch.float32 else 2e-2  # (bf16: the bias rounds once more)
        torch.testing.assert_close(fixed_rows_linear(x, w, bias), F.linear(x, w, bias),
                                   atol=tol, rtol=tol)


def test_activations_give_a_row_the_same_bits_in_any_batch():
    """The MLP's gelu-tanh / SiLU one row a call (``act_and_mul``): a row's bits at any
    batch size and position (widths off the vector length; the gate a strided view of
    gate ‖ up), with the plain op's values; no rows is no rows; fp32 and bf16."""
    from radixlm.kernels import ref as kref
    from radixlm.runtime.models.invariant import act_and_mul

    gen = torch.Generator().manual_seed(3)
    cases = [(partial(act_and_mul, "gelu_tanh"), kref.gelu_tanh_and_mul, 192),
             (partial(act_and_mul, "silu"), kref.silu_and_mul, 200)]
    for dtype in (torch.float32, torch.bfloat16):
        for fn, plain, width in cases:
            x = (torch.randn(205, width, generator=gen) * 3).to(dtype)
            whole = fn(x)
            tol = 1e-6 if dtype == torch.float32 else 1e-2
            torch.testing.assert_close(whole, plain(x), atol=tol, rtol=tol)
            for size, at in ((1, 7), (2, 40), (90, 40), (90, 0), (170, 3)):
                assert torch.equal(fn(x[at:at + size]), whole[at:at + size]), (size, at)
            assert fn(x[:0]).shape == (0, whole.shape[1])


def test_exp_and_tanh_give_an_element_its_bits_wherever_it_falls():
    """The invariant attention's ``exp_`` and soft-cap ``tanh`` run over whole score tensors:
    an element's bits must not depend on the call's size, its offset in it or the thread
    split (3 threads split 70001 elements mid-vector; the reference is 16-element calls);
    the soft-cap alike (fp32, as the model and the attention apply it). (SiLU fails this
    comparison on torch 2.13 on x86: its scalar tail rounds otherwise, hence
    ``act_and_mul``.)"""
    from radixlm.kernels.ref import softcap

    base = torch.randn(1 << 17, generator=torch.Generator().manual_seed(5)) * 8
    threads = torch.get_num_threads()

    def mismatches(fn) -> int:
        ref = torch.cat([fn(base[i:i + 16]) for i in range(0, 4096, 16)]).view(torch.int32)
        bad = 0
        try:
            for n_threads in (1, 3):
                torch.set_num_threads(n_threads)
                for n, off in ((4096, 0), (4103, 3), (70001, 13), (1 << 17, 0)):
                    n = min(n, base.numel() - off)
                    got = fn(base[off:off + n])[:4096 - off].view(torch.int32)
                    bad += int((got != ref[off:]).sum())
        finally:
            torch.set_num_threads(threads)
        return bad

    assert mismatches(torch.exp) == 0
    assert mismatches(torch.tanh) == 0
    assert mismatches(partial(softcap, cap=30.0)) == 0


def test_tree_sum_ignores_trailing_identities():
    """A sum over n blocks is the same bits padded (with -0.0) to any power of two."""
    x = torch.randn(5, 5, 7, generator=torch.Generator().manual_seed(1))
    for n in range(1, 6):
        sums = []
        for width in (1 << (n - 1).bit_length(), 8, 16):
            padded = torch.full((5, width, 7), -0.0)
            padded[:, :n] = x[:, :n]
            sums.append(tree_sum(padded, 1))
        assert all(torch.equal(t, sums[0]) for t in sums), n
        torch.testing.assert_close(sums[0], x[:, :n].sum(1))


def test_ranks_sum_in_rank_order(monkeypatch):
    """More than 2 ranks under the flag: each element summed rank 0, 1, 2, ... (the ring's
    order depends on its chunking), the result written into the tensor."""
    from radixlm.runtime.parallel import group as group_module

    shares = [torch.tensor([1.0, 3e-8, -1.0]), torch.tensor([1e-8, 1.0, 1e-8]),
              torch.tensor([-1.0, -1.0, 1.0]), torch.tensor([2e-8, 2e-8, 2e-8])]

    def all_gather(parts, x):
        for part, share in zip(parts, shares):
            part.copy_(share)

    monkeypatch.setattr(group_module.dist, "all_gather", all_gather)
    tp = TPGroup(0, 4)
    tp.fixed_order = True
    x = shares[0].clone()
    assert tp.all_reduce(x) is x
    expected = ((shares[0] + shares[1]) + shares[2]) + shares[3]
    assert torch.equal(x, expected)


ATTN_HEADS, ATTN_KV, ATTN_DIM = 6, 2, 32
LAYER_OPTS = [AttnLayerOptions(ATTN_DIM**-0.5),
              AttnLayerOptions(ATTN_DIM**-0.5, softcap=3.0, window=40)]
LENGTHS = (150, 70, 6)  # request -> context tokens (6: gathered queries only)


class AttentionRun:
    """Runs the invariant backend over a schedule of steps (each a list of (request, new
    tokens)) on a fresh pool whose slots are handed out in a shuffled order; every
    request's q/k/v at a position are fixed, so any schedule must give each query the same
    output."""

    def __init__(self, qkv: dict, seed: int) -> None:
        self.qkv = qkv
        self.pool = KVPool(1024, 2, ATTN_KV, ATTN_DIM, torch.float32, torch.device("cpu"), 8,
                           256)
        self.backend = create_attention_backend("torch", self.pool, ATTN_HEADS, ATTN_KV,
                                                ATTN_DIM, invariant=True, layers=LAYER_OPTS)
        gen = torch.Generator().manual_seed(seed)
        self.free = (torch.randperm(1023, generator=gen) + 1).tolist()
        self.rows = (torch.randperm(8, generator=gen)).tolist()[:len(LENGTHS)]
        self.lens = [0] * len(LENGTHS)
        self.free_pop = lambda n: [self.free.pop() for _ in range(n)]
        self.out: dict[tuple[int, int, int], torch.Tensor] = {}  # (req, layer, pos)

    def step(self, work: list[tuple[int, int]]) -> None:
        lens = {self.rows[r]: self.lens[r] for r, _ in work}
        batch = extend_batch(self.pool, ForwardMode.EXTEND,
                             [(self.rows[r], n) for r, n in work], lens, self.free_pop,
                             [r for r, _ in work])
        for r, _ in work:
            self.lens[r] = lens[self.rows[r]]
        prefix, starts = batch.prefix_lens_cpu, batch.extend_start_loc.tolist()
        self.backend.init_forward_metadata(batch)
        for layer in range(2):
            q, k, v = (torch.cat([self.qkv[r][layer][i][p:p + n]
                                  for (r, n), p in zip(work, prefix)]) for i in range(3))
            o = self.backend.forward(q, k, v, layer, batch)
            for (r, n), p, s in zip(work, prefix, starts):
                for j in range(n):
                    self.out[r, layer, p + j] = o[s + j]


def _reference(q, k, v, opt: AttnLayerOptions) -> torch.Tensor:
    """fp64 causal attention of ``q [L, H, D]`` over ``k, v [L, Hkv, D]`` (one request)."""
    group = ATTN_HEADS // ATTN_KV
    k = k.double().repeat_interleave(group, 1)
    v = v.double().repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), k) * opt.scale
    if opt.softcap is not None:
        s = torch.tanh(s / opt.softcap) * opt.softcap
    pos = torch.arange(q.shape[0])
    allowed = pos[None, :] <= pos[:, None]
    if opt.window is not None:
        allowed &= pos[None, :] > pos[:, None] - opt.window
    s = s.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


def test_attention_layouts_agree_bit_for_bit_and_with_a_reference():
    """The same queries in one step (spans), token by token (gathered), and in chunks of
    37 / 5 / 1 beside each other: every output the same bits; each within 1e-5 of fp64."""
    assert LENGTHS[2] <= GATHER_MAX < min(LENGTHS[:2]) and LENGTHS[0] > 2 * KEY_BLOCK
    gen = torch.Generator().manual_seed(2)
    qkv = {r: [[torch.randn(n, h, ATTN_DIM, generator=gen)
                for h in (ATTN_HEADS, ATTN_KV, ATTN_KV)] for _ in range(2)]
           for r, n in enumerate(LENGTHS)}
    whole = AttentionRun(qkv, seed=0)
    whole.step([(r, n) for r, n in enumerate(LENGTHS)])
    stepwise = AttentionRun(qkv, seed=1)
    for i in range(max(LENGTHS)):
        stepwise.step([(r, 1) for r, n in enumerate(LENGTHS) if i < n])
    chunked = AttentionRun(qkv, seed=2)
    plans = {0: [37, 37, 37, 37, 2], 1: [5, 1, 64], 2: [1, 1, 1, 3]}
    for i in range(5):
        chunked.step([(r, plans[r][i]) for r in plans if i < len(plans[r])])
    assert whole.out.keys() == stepwise.out.keys() == chunked.out.keys()
    for key, o in whole.out.items():
        assert torch.equal(o, stepwise.out[key]), key
        assert torch.equal(o, chunked.out[key]), key
    for r, n in enumerate(LENGTHS):
        for layer, opt in enumerate(LAYER_OPTS):
            got = torch.stack([whole.out[r, layer, p] for p in range(n)])
            want = _reference(*qkv[r][layer], opt)
            torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
