"""Scheduler behaviour on a tiny random model (fast): batching invariance, retraction under
a small pool, radix sharing, in-batch prefix dedup, aborts, and KV integrity."""

from __future__ import annotations

import random
import threading

import pytest

from radixlm.runtime.engine import Engine

PARAMS = {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True}


def prompts(n: int, seed: int = 0, shared: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(100, 40000) for _ in range(shared)]
    return [prefix + [rng.randrange(100, 40000) for _ in range(rng.randint(3, 40))]
            for _ in range(n)]


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    """Each prompt alone on a roomy engine with no sharing: the ground truth."""
    with Engine(str(tiny_model_dir), dtype="float32", disable_radix_cache=True,
                max_total_tokens=4096, log_level="warning") as engine:
        ps = prompts(12) + prompts(8, seed=1, shared=50)
        return ps, [engine.generate(input_ids=p, sampling_params=PARAMS)["output_ids"]
                    for p in ps]


@pytest.mark.parametrize("opts", [
    {"max_total_tokens": 4096},
    {"max_total_tokens": 4096, "disable_radix_cache": True, "chunked_prefill_size": 16},
    {"max_total_tokens": 4096, "chunked_prefill_size": 32, "mixed_prefill_size": 4},
    {"max_total_tokens": 4096, "max_running_requests": 3, "schedule_policy": "fcfs"},
    {"max_total_tokens": 4096, "kv_mirror_mb": 0},  # decode gathers through req_to_token
    {"max_total_tokens": 180},  # far too small for 20 requests: forces retraction
    {"max_total_tokens": 180, "radix_eviction_policy": "lfu"},
    {"max_total_tokens": 180, "disable_radix_cache": True, "chunked_prefill_size": 32},
])
def test_batched_equals_alone(tiny_model_dir, reference, opts):
    ps, expected = reference
    with Engine(str(tiny_model_dir), dtype="float32", log_level="warning", **opts) as engine:
        outs = engine.generate(input_ids=ps, sampling_params=PARAMS)
        assert [o["output_ids"] for o in outs] == expected
        assert all(o["meta_info"]["finish_reason"]["type"] == "length" for o in outs)
        stats = engine.get_stats()
        if opts["max_total_tokens"] == 180:
            assert stats["num_retractions_total"] > 0
            if not opts.get("disable_radix_cache"):
                assert stats["evicted_tokens_total"] > 0
        engine.check_integrity()


def test_a_long_prompt_does_not_hold_the_decoding_streams(tiny_model_dir, monkeypatch):
    """While requests decode, they decode in every prefill step too, and a prompt that needs
    chunking comes ``mixed_prefill_size`` tokens a step (it used to take whole chunks, the
    decoding requests waiting out its prefill); a prompt that fits the step's budget still
    comes whole. One batch, first come first served: a 4-token prompt, then a 320-token one
    (chunking: it waits for a step of its own), then a 40-token one. The answers are still
    each prompt's alone."""
    from radixlm.runtime.scheduler.admission import Admission

    steps = []
    schedule = Admission.schedule_extend

    def recorded(self):
        sb = schedule(self)
        if sb is not None:
            steps.append(list(sb.extend_lens))
        return sb

    monkeypatch.setattr(Admission, "schedule_extend", recorded)
    rng = random.Random(9)
    batch = [[5, 6, 7, 8], [rng.randrange(100, 40000) for _ in range(320)],
             [rng.randrange(100, 40000) for _ in range(40)]]
    params = [{"temperature": 0, "max_new_tokens": n, "ignore_eos": True} for n in (200, 8, 4)]
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096,
                disable_radix_cache=True, chunked_prefill_size=64, mixed_prefill_size=16,
                schedule_policy="fcfs", speculative_algorithm=None,
                log_level="warning") as engine:
        alone = [engine.generate(input_ids=p, sampling_params=s)["output_ids"]
                 for p, s in zip(batch, params)]
        steps.clear()
        outs = engine.generate(input_ids=batch, sampling_params=params)
        assert [o["output_ids"] for o in outs] == alone
        engine.check_integrity()
    assert steps[0] == [4]  # the first prompt; the long one waits for a step of its own
    assert steps[1] == [16, 40, 1]  # its first chunk, the short prompt whole, a decode row
    chunks = [lens for lens in steps if lens[0] == 16]
    assert len(chunks) == 20  # 320 prompt tokens, 16 a step
    assert all(lens[-1] == 1 and len(lens) >= 2 for lens in chunks)  # decode rows in each


def test_radix_cache_hits_on_shared_prefix(tiny_model_dir):
    ps = prompts(6, seed=3, shared=64)
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096,
                log_level="warning") as engine:
        first = engine.generate(input_ids=ps[0], sampling_params=PARAMS)
        assert first["meta_info"]["cached_tokens"] == 0
        rest = engine.generate(input_ids=ps[1:], sampling_params=PARAMS)
        assert all(r["meta_info"]["cached_tokens"] >= 64 for r in rest)
        # the whole first request (prompt + output) is cached for a follow-up turn
        follow = ps[0] + first["output_ids"] + [500, 501]
        again = engine.generate(input_ids=follow, sampling_params=PARAMS)
        assert again["meta_info"]["cached_tokens"] >= len(ps[0]) + len(first["output_ids"]) - 1
        stats = engine.get_stats()
        assert stats["cache_hit_rate"] > 0.5 and stats["tree_size"] > 0
        engine.check_integrity()
        assert engine.flush_cache()
        assert engine.get_stats()["tree_size"] == 0
        engine.check_integrity()


def test_same_uncached_prefix_is_prefilled_once(tiny_model_dir):
    shared, n = 200, 8
    ps = prompts(n, seed=4, shared=shared)
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=8192,
                log_level="warning") as engine:
        engine.generate(input_ids=ps, sampling_params={**PARAMS, "max_new_tokens": 2})
        prefilled = engine.get_stats()["prefill_tokens_total"]
        unique = sum(len(p) - shared for p in ps)
        assert prefilled < shared + unique + n  # not n * shared
        assert prefilled >= shared + unique - n


def test_aborts_and_concurrency_keep_pool_consistent(tiny_model_dir):
    ps = prompts(16, seed=5, shared=30)
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=400,
                log_level="warning") as engine:
        results = {}

        def worker(i):
            results[i] = engine.generate(input_ids=ps[i], rid=f"r{i}", sampling_params={
                **PARAMS, "max_new_tokens": 60})

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for i in range(0, 16, 3):
            engine.abort(f"r{i}")
        for t in threads:
            t.join(timeout=120)
        assert len(results) == 16
        kinds = {r["meta_info"]["finish_reason"]["type"] for r in results.values()}
        assert kinds <= {"length", "abort"} and "length" in kinds
        for r in results.values():
            if r["meta_info"]["finish_reason"]["type"] == "length":
                assert len(r["output_ids"]) == 60
        engine.check_integrity()
        stats = engine.get_stats()
        assert stats["num_running"] == 0 and stats["num_waiting"] == 0


def test_request_larger_than_pool_is_rejected(tiny_model_dir):
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=64,
                log_level="warning") as engine:
        with pytest.raises(ValueError, match="KV pool"):
            engine.generate(input_ids=list(range(100, 150)),
                            sampling_params={"max_new_tokens": 30})
        out = engine.generate(input_ids=list(range(100, 110)),
                              sampling_params={"max_new_tokens": 30, "temperature": 0})
        assert len(out["output_ids"]) == 30


def test_queue_limit(tiny_model_dir):
    from radixlm.runtime.engine import QueueFullError

    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096,
                max_queued_requests=2, log_level="warning") as engine:
        held = engine.reserve(1)  # one place taken: a batch of 2 does not fit now
        with pytest.raises(QueueFullError):
            engine.generate(input_ids=prompts(2), sampling_params=PARAMS)
        held.release()
        with pytest.raises(ValueError, match="holds at most 2"):  # never fits: a bad call
            engine.generate(input_ids=prompts(3), sampling_params=PARAMS)
        assert len(engine.generate(input_ids=prompts(2), sampling_params=PARAMS)) == 2


def test_failure_in_one_request_spares_its_neighbours(tiny_model_dir):
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096,
                log_level="critical") as engine:
        sched = engine.scheduler.postprocessor  # the part that applies sampled tokens
        original = sched._on_token

        def flaky(req, token, logprob):
            if req.rid == "bad" and len(req.output_ids) >= 3:
                raise RuntimeError("boom")
            return original(req, token, logprob)

        sched._on_token = flaky
        ps = prompts(3, seed=9)
        outs = engine.generate(input_ids=ps, sampling_params=PARAMS, rid=["ok1", "bad", "ok2"])
        assert outs[1]["meta_info"]["finish_reason"]["type"] == "abort"
        assert "boom" in outs[1]["meta_info"]["finish_reason"]["message"]
        assert [len(o["output_ids"]) for o in (outs[0], outs[2])] == [20, 20]
        engine.check_integrity()
        again = engine.generate(input_ids=ps[0], sampling_params=PARAMS)  # loop still alive
        assert again["output_ids"] == outs[0]["output_ids"]


def test_forward_failure_of_one_request_aborts_only_that_request(tiny_model_dir, reference):
    """The model raises whenever a poisoned token is in the step: the step is retried one
    request at a time and only the poisoned request is aborted; the others finish with the
    same tokens as when run alone."""
    poison = 99  # prompts use ids >= 100
    ps, expected = reference[0][:4], reference[1][:4]
    assert all(poison not in out for out in expected)
    bad = [*ps[2][:2], poison, *ps[2][2:]]
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096,
                log_level="critical") as engine:
        # whichever path runs the step (torch model, or native small steps) fails alike
        for runner_part in (engine.runner.model, engine.runner.native):
            if runner_part is None:
                continue
            original = runner_part.forward

            def fragile(batch, *args, _original=original):
                if bool((batch.input_ids == poison).any()):
                    raise RuntimeError("poisoned token")
                return _original(batch, *args)

            runner_part.forward = fragile
        outs = engine.generate(input_ids=[ps[0], ps[1], bad, ps[3]], sampling_params=PARAMS)
        reason = outs[2]["meta_info"]["finish_reason"]
        assert reason["type"] == "abort" and "poisoned token" in reason["message"]
        for i in (0, 1, 3):
            assert outs[i]["output_ids"] == expected[i], i
        engine.check_integrity()
