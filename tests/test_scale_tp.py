"""Tensor parallel: the weight shards against the unsharded weights (no processes), bad tp
sizes refused before any process starts, and a real tp=2 engine over gloo on the default
model in fp32 against the tp=1 engine (greedy text identical, logprobs within 1e-3), then a
killed worker: the request fails with an error, the engine reports unhealthy (/health
503) and shutdown leaves no child process."""

from __future__ import annotations

import multiprocessing
import os
import signal

import httpx
import pytest
import torch
import torch.nn.functional as F
from server_fakes import ThreadServer
from transformers import LlamaConfig

from radixlm.runtime.parallel import TPGroup, check_tp_size, local_hf_config, shard_state_dict
from radixlm.runtime.parallel.sharding import kv_heads_of_rank, q_heads_of_rank, vocab_shard

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "List three colors:\n1.",
    "In 1969, the first humans",
    "Q: What is 12 times 12?\nA:",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
]


def _config(heads: int, kv: int, head_dim: int = 4, inter: int = 30,
            vocab: int = 37) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab, hidden_size=heads * head_dim, intermediate_size=inter,
                       num_hidden_layers=1, num_attention_heads=heads,
                       num_key_value_heads=kv, head_dim=head_dim)


def _state(cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    d, h, kv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    shapes = {"self_attn.q_proj.weight": (h * d, cfg.hidden_size),
              "self_attn.k_proj.weight": (kv * d, cfg.hidden_size),
              "self_attn.v_proj.weight": (kv * d, cfg.hidden_size),
              "self_attn.o_proj.weight": (cfg.hidden_size, h * d),
              "mlp.gate_proj.weight": (cfg.intermediate_size, cfg.hidden_size),
              "mlp.up_proj.weight": (cfg.intermediate_size, cfg.hidden_size),
              "mlp.down_proj.weight": (cfg.hidden_size, cfg.intermediate_size),
              "input_layernorm.weight": (cfg.hidden_size,)}
    # float64: the sums of shards then equal the unsharded products far inside the
    # tolerance on any host's kernels (fp32 differed by 1.3e-5 on a Zen 4, summation order)
    state = {f"model.layers.0.{k}": torch.randn(*s, generator=gen, dtype=torch.float64)
             for k, s in shapes.items()}
    state["model.embed_tokens.weight"] = torch.randn(cfg.vocab_size, cfg.hidden_size,
                                                     generator=gen, dtype=torch.float64)
    return state


def _attention_block(w: dict, x: torch.Tensor, heads: int, kv: int, d: int) -> torch.Tensor:
    """Causal GQA attention + o_proj of one layer, as plain math on (T, hidden)."""
    p = "model.layers.0.self_attn."
    q = (x @ w[p + "q_proj.weight"].T).view(-1, heads, d).transpose(0, 1)
    k = (x @ w[p + "k_proj.weight"].T).view(-1, kv, d).transpose(0, 1)
    v = (x @ w[p + "v_proj.weight"].T).view(-1, kv, d).transpose(0, 1)
    k, v = k.repeat_interleave(heads // kv, 0), v.repeat_interleave(heads // kv, 0)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(0, 1).reshape(x.shape[0], heads * d) @ w[p + "o_proj.weight"].T


def _mlp(w: dict, x: torch.Tensor) -> torch.Tensor:
    p = "model.layers.0.mlp."
    return (F.silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) @ w[
        p + "down_proj.weight"].T


@pytest.mark.parametrize("heads,kv,tp", [(9, 3, 2), (9, 3, 3), (8, 4, 2), (8, 2, 4), (8, 2, 8),
                                         (6, 6, 4), (4, 1, 2)])
def test_sharded_layer_sums_to_the_unsharded_one(heads: int, kv: int, tp: int) -> None:
    cfg = _config(heads, kv)
    check_tp_size(cfg, tp, device_type=None)  # the shapes fit (the host is not asked)
    state = _state(cfg)
    x = torch.randn(5, cfg.hidden_size, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)
    full_attn = _attention_block(state, x, heads, kv, cfg.head_dim)
    full_mlp = _mlp(state, x)
    attn_sum, mlp_sum = torch.zeros_like(full_attn), torch.zeros_like(full_mlp)
    for rank in range(tp):
        local = local_hf_config(cfg, rank, tp)
        shard = shard_state_dict(state, cfg, rank, tp)
        # each rank's shapes are those its local config describes
        assert shard["model.layers.0.self_attn.q_proj.weight"].shape[0] == (
            local.num_attention_heads * cfg.head_dim)
        assert shard["model.layers.0.mlp.down_proj.weight"].shape[1] == local.intermediate_size
        attn_sum += _attention_block(shard, x, local.num_attention_heads,
                                     local.num_key_value_heads, cfg.head_dim)
        mlp_sum += _mlp(shard, x)
        assert shard["model.layers.0.input_layernorm.weight"] is state[
            "model.layers.0.input_layernorm.weight"]
    torch.testing.assert_close(attn_sum, full_attn, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mlp_sum, full_mlp, rtol=1e-5, atol=1e-5)


def test_an_unknown_weight_is_refused_not_replicated() -> None:
    cfg = _config(4, 2)
    state = {**_state(cfg), "model.layers.0.self_attn.qkv_proj.weight": torch.zeros(3, 3)}
    with pytest.raises(ValueError, match="cannot shard 'model.layers.0.self_attn.qkv_proj"):
        shard_state_dict(state, cfg, 0, 2)


def test_every_query_head_is_held_once_with_its_kv_head() -> None:
    for heads, kv, tp in [(9, 3, 2), (8, 2, 4), (32, 8, 3), (4, 1, 4)]:
        held = [h for r in range(tp) for h in q_heads_of_rank(heads, kv, r, tp)]
        assert held == list(range(heads))
        for r in range(tp):
            kv_held = kv_heads_of_rank(kv, r, tp)
            assert {h // (heads // kv) for h in q_heads_of_rank(heads, kv, r, tp)} == set(kv_held)


def test_vocab_parallel_embedding_and_head_match_the_full_table() -> None:
    table = torch.randn(37, 8, generator=torch.Generator().manual_seed(2))
    ids = torch.tensor([0, 5, 12, 13, 36, 25])
    h = torch.randn(3, 8)
    for tp in (2, 3, 4):
        groups = [TPGroup(r, tp) for r in range(tp)]
        for g in groups:
            g.all_reduce = lambda x: x  # one rank's share; summed below
            g.vocab_size = 37
        embedded = sum(g.embed(ids, vocab_shard(table, g.rank, tp)) for g in groups)
        torch.testing.assert_close(embedded, F.embedding(ids, table))
        blocks = [h @ vocab_shard(table, r, tp).T for r in range(tp)]
        torch.testing.assert_close(torch.cat(blocks, -1)[:, :37], h @ table.T)


def test_bad_tp_sizes_fail_before_any_process(model_dir) -> None:
    from radixlm.runtime.engine import Engine
    from radixlm.runtime.weights import load_hf_config

    hf = load_hf_config(model_dir)  # 9 query heads, 3 K/V heads
    with pytest.raises(ValueError, match=r"tp_size=4 cannot split num_attention_heads=9"):
        check_tp_size(hf, 4)
    cores = os.cpu_count() or 1
    with pytest.raises(ValueError, match=f"tp_size={cores + 1} exceeds this host's"):
        check_tp_size(_config(256, 256, inter=4096), cores + 1)
    with pytest.raises(ValueError, match="tp_size and dp_size must be >= 1"):
        Engine(tp_size=0, log_level="warning")
    with pytest.raises(ValueError, match="tp_size=4 cannot split"):
        Engine(tp_size=4, log_level="warning")
    assert multiprocessing.active_children() == []
    with pytest.raises(ValueError, match="radixlm serve --dp-size"):
        Engine(dp_size=2, log_level="warning")


@pytest.fixture(scope="module")
def engine_tp2():
    if (os.cpu_count() or 1) < 2:
        pytest.skip("tp=2 needs 2 CPU cores")
    from radixlm.runtime.engine import Engine

    engine = Engine(dtype="float32", tp_size=2, max_total_tokens=4096, context_length=512,
                    log_level="warning")
    yield engine
    engine.shutdown()


def test_tp2_greedy_text_is_identical_to_tp1(engine_tp2, engine_fp32) -> None:
    params = {"temperature": 0, "max_new_tokens": 16}
    tp2 = engine_tp2.generate(PROMPTS, params)
    tp1 = engine_fp32.generate(PROMPTS, params)
    assert [o["text"] for o in tp2] == [o["text"] for o in tp1]
    assert [o["output_ids"] for o in tp2] == [o["output_ids"] for o in tp1]
    engine_tp2.check_integrity()
    assert engine_tp2.get_stats()["tp_size"] == 2


def test_tp2_logprobs_match_tp1(engine_tp2, engine_fp32) -> None:
    prompt = "The quick brown fox jumps over the lazy dog because"
    kw = {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 5}
    params = {"temperature": 0, "max_new_tokens": 6}
    a = engine_tp2.generate(prompt, params, **kw)["meta_info"]
    b = engine_fp32.generate(prompt, params, **kw)["meta_info"]
    for key in ("input_token_logprobs", "output_token_logprobs"):
        assert [t for _, t, _ in a[key]] == [t for _, t, _ in b[key]]
        for (x, _, _), (y, _, _) in zip(a[key][1:], b[key][1:]):
            assert x == pytest.approx(y, abs=1e-3)
    for top_a, top_b in zip(a["output_top_logprobs"], b["output_top_logprobs"]):
        assert [t for _, t, _ in top_a] == [t for _, t, _ in top_b]


def test_tp2_prefix_cache_and_constraints_run_on_rank0(engine_tp2) -> None:
    prompt = "Here is a list of prime numbers below one hundred, written in digits: "
    engine_tp2.generate(prompt, {"max_new_tokens": 1})
    out = engine_tp2.generate(prompt, {"temperature": 0, "max_new_tokens": 12,
                                       "regex": r"[0-9]{1,2}(, [0-9]{1,2}){2}"})
    assert out["meta_info"]["cached_tokens"] > 0
    parts = out["text"].split(", ")
    assert len(parts) == 3 and all(p.isdigit() for p in parts), out["text"]


def test_worker_killed_mid_request_fails_it_and_health(engine_tp2) -> None:
    from radixlm.server.app import create_app
    from radixlm.server.state import ServerSettings

    with ThreadServer(create_app(engine_tp2, ServerSettings())) as server:
        assert httpx.get(server.base_url + "/health").status_code == 200
        workers = list(engine_tp2.runner.tp.procs)
        chunks = engine_tp2.generate("Tell me a long story.", {"max_new_tokens": 400,
                                                               "ignore_eos": True}, stream=True)
        first = next(chunks)  # decoding is under way
        assert first["meta_info"]["finish_reason"] is None
        os.kill(workers[0].pid, signal.SIGKILL)
        last = [first, *chunks][-1]  # the stream ends (never hangs) with an abort
        reason = last["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "tensor-parallel rank 1" in reason["message"]
        assert last["meta_info"]["completion_tokens"] < 400
        assert "rank 1" in (engine_tp2.fatal_error or "")
        health = httpx.get(server.base_url + "/health")
        assert health.status_code == 503 and "rank 1" in health.text
        later = engine_tp2.generate("Hello", {"max_new_tokens": 4})  # fails fast, too
        assert later["meta_info"]["finish_reason"]["type"] == "abort"
    engine_tp2.shutdown()
    assert multiprocessing.active_children() == []
