"""Engine reliability on the tiny random model (fast): atomic admission under racing
threads, bounds checked before queueing, no empty first stream item, and faults (a step
that raises, a grammar build that crashes, the scheduler thread dying) that end requests
with a 500-style reason instead of hanging or passing for a result. Also the aging order."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from radixlm.runtime.engine import Engine, EngineDeadError, QueueFullError
from radixlm.runtime.schedule_policy import age_first

PARAMS = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}
PROMPT = list(range(1000, 1040))


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096,
                max_queued_requests=8, chunked_prefill_size=16, log_level="warning") as e:
        yield e


def _hold_scheduler(engine: Engine) -> tuple[threading.Event, threading.Thread]:
    """Block the scheduler thread between steps until the returned event is set."""
    gate, entered = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        gate.wait(30)

    t = threading.Thread(target=engine.scheduler.call, args=(hold,), daemon=True)
    t.start()
    assert entered.wait(30)
    return gate, t


def test_admission_under_racing_fan_out_never_exceeds_the_bound(engine: Engine) -> None:
    """16 threads each submit a prompt with n=3 while the scheduler is held (so the
    requests pile up in its inbox): exactly 8 // 3 = 2 get in, whole; the rest are refused
    whole; the bound is free again once they finish."""
    gate, holder = _hold_scheduler(engine)
    results: list[object] = []
    start = threading.Barrier(16)

    def submit() -> None:
        start.wait()
        try:
            results.append(engine.generate(input_ids=PROMPT, sampling_params={**PARAMS, "n": 3},
                                           stream=False))
        except QueueFullError as exc:
            results.append(exc)

    threads = [threading.Thread(target=submit) for _ in range(16)]
    for t in threads:
        t.start()
    # refusals are immediate; admitted ones wait for the held scheduler
    for _ in range(300):
        if sum(isinstance(r, QueueFullError) for r in results) == 14:
            break
        threading.Event().wait(0.05)
    assert engine.scheduler.num_queued == 6
    gate.set()
    for t in threads:
        t.join(60)
    holder.join(30)
    done = [r for r in results if isinstance(r, list)]
    assert len(done) == 2 and all(len(r) == 3 for r in done)
    assert sum(isinstance(r, QueueFullError) for r in results) == 14
    assert engine.scheduler.num_queued == 0
    engine.check_integrity()


def test_a_fan_out_larger_than_the_queue_is_a_bad_request(engine: Engine) -> None:
    """n=9 against a queue of 8 can never be admitted: ValueError (HTTP 400) naming the
    bound, not a QueueFullError (429) a client would retry forever; nothing is held."""
    with pytest.raises(ValueError, match="holds at most 8"):
        engine.generate(input_ids=PROMPT, sampling_params={**PARAMS, "n": 9})
    with pytest.raises(ValueError, match="holds at most 8"):
        engine.reserve(9)
    assert engine.scheduler.num_queued == 0
    out = engine.generate(input_ids=PROMPT, sampling_params={**PARAMS, "n": 8})
    assert len(out) == 8


def test_reservation_is_all_or_none_and_released(engine: Engine) -> None:
    a = engine.reserve(5)
    with pytest.raises(QueueFullError):
        engine.reserve(4)  # 5 + 4 > 8: nothing taken
    b = engine.reserve(3)
    out = engine.generate(input_ids=PROMPT, sampling_params=PARAMS, admission=b)
    assert out["meta_info"]["completion_tokens"] == 6
    a.release()
    b.release()
    assert engine.scheduler.num_queued == 0


@pytest.mark.parametrize("kwargs, needle", [
    ({"top_logprobs_num": 1_000_000, "return_logprob": True}, "top_logprobs_num"),
    ({"sampling_params": {"repetition_penalty": 5e-324}}, "repetition_penalty"),
    ({"sampling_params": {"temperature": float("inf")}}, "temperature"),
    ({"sampling_params": {"temperature": 1e308}}, "temperature"),
    ({"sampling_params": {"stop": ["x"] * 10_000}}, "stop"),
    ({"sampling_params": {"n": 10_000}}, "n must be"),
])
def test_bad_parameters_are_refused_before_queueing(engine: Engine, kwargs, needle) -> None:
    before = engine.get_stats()["num_requests_total"]
    with pytest.raises(ValueError, match=needle):
        engine.generate(input_ids=PROMPT, **kwargs)
    assert engine.get_stats()["num_requests_total"] == before


def test_stream_never_yields_an_item_before_the_first_token(engine: Engine) -> None:
    """The 40-token prompt takes three 16-token prefill chunks before the first token."""
    prompt = list(range(2000, 2040))
    items = list(engine.generate(input_ids=prompt, sampling_params=PARAMS, stream=True))
    assert all(it["meta_info"]["completion_tokens"] >= 1 for it in items)
    assert items[-1]["meta_info"]["completion_tokens"] == 6

    async def collect() -> list[dict]:
        it = await engine.async_generate(input_ids=prompt[::-1], sampling_params=PARAMS,
                                         stream=True)
        return [x async for x in it]

    items = asyncio.run(collect())
    assert all(it["meta_info"]["completion_tokens"] >= 1 for it in items)


def test_a_step_that_raises_fails_only_its_request(engine: Engine, monkeypatch) -> None:
    runner = engine.runner
    real = runner.forward

    def forward(sb, inputs):
        if any(r.rid == "bad" for r in sb.reqs):
            raise RuntimeError("injected fault")
        return real(sb, inputs)

    monkeypatch.setattr(runner, "forward", forward)
    outs = engine.generate(input_ids=[PROMPT, PROMPT[::-1]], sampling_params=PARAMS,
                           rid=["bad", "good"])
    bad, good = outs
    assert bad["meta_info"]["finish_reason"]["status_code"] == 500
    assert "injected fault" in bad["meta_info"]["finish_reason"]["message"]
    assert good["meta_info"]["finish_reason"]["type"] == "length"
    assert good["meta_info"]["completion_tokens"] == 6
    monkeypatch.undo()
    engine.check_integrity()


def test_a_grammar_build_that_crashes_is_an_internal_error(engine: Engine, monkeypatch) -> None:
    def crash(spec):
        f: Future = Future()
        f.set_exception(MemoryError("injected: the build blew up"))
        return f

    monkeypatch.setattr(engine.grammar_backend, "compile_async", crash)
    out = engine.generate(input_ids=PROMPT, sampling_params={**PARAMS, "regex": "[ab]+"})
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason["status_code"] == 500
    assert reason["error"] == "internal_error"
    monkeypatch.undo()
    ok = engine.generate(input_ids=PROMPT, sampling_params=PARAMS)
    assert ok["meta_info"]["finish_reason"]["type"] == "length"


class _Die(BaseException):
    """Escapes the loop's `except Exception`, as a bug in the loop itself would."""


def test_a_dead_scheduler_thread_fails_every_request_and_refuses_new_ones(tiny_model_dir):
    with Engine(str(tiny_model_dir), dtype="float32", max_total_tokens=4096,
                log_level="critical") as engine:
        gate, holder = _hold_scheduler(engine)
        q = engine.generate(input_ids=PROMPT, sampling_params={**PARAMS, "max_new_tokens": 50},
                            stream=True)

        def die() -> None:
            raise _Die("injected")

        engine.scheduler.step = die
        gate.set()
        holder.join(30)
        items = list(q)  # ends (no hang) with an internal-error abort
        reason = items[-1]["meta_info"]["finish_reason"]
        assert reason["status_code"] == 500 and reason["error"] == "engine_dead"
        engine.scheduler.thread.join(30)
        assert not engine.is_alive()
        with pytest.raises(EngineDeadError):
            engine.generate(input_ids=PROMPT, sampling_params=PARAMS)
        assert engine.scheduler.num_queued == 0


def _req(name: str, created_at: float) -> SimpleNamespace:
    return SimpleNamespace(rid=name, created_at=created_at)


def test_age_first_moves_long_waiters_to_the_front_oldest_first() -> None:
    ordered = [(_req("hit", 9.5), 40), (_req("young", 9.0), 0), (_req("old2", 5.0), 0),
               (_req("old1", 1.0), 0)]
    out = age_first(ordered, now=10.0, max_wait_s=2.0)  # type: ignore[arg-type]
    assert [r.rid for r, _ in out] == ["old1", "old2", "hit", "young"]
    assert age_first(ordered[:2], now=10.0, max_wait_s=2.0) == ordered[:2]  # type: ignore
