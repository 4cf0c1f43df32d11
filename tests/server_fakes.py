"""A fake engine following docs/ENGINE_API.md, for fast HTTP-layer tests without a model.

Tokens are characters (id = ord(c)). A request generates the letters "abcdefghij..." one per
step (`step_delay` seconds apart) up to max_new_tokens, stopping early at a `stop` string
(trimmed) or, with `choices`, emitting the first choice. Logprobs are fixed fake numbers.
`regex: "("` fails like a constraint that does not compile, `regex: "!crash"` like an
internal failure (an abort with status_code 500). An embedding counts an input's characters
by code point modulo `EMBED_DIM`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import string
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixlm.runtime.sampling_params import ALIASES as SAMPLING_ALIASES
from radixlm.runtime.sampling_params import SamplingParams

EMBED_DIM = 8  # the fake's "hidden size": the length of its embeddings
# the engine's own parameter names (and SGLang's aliases), so the fake stays in step
SAMPLING_KEYS = {f.name for f in dataclasses.fields(SamplingParams)} | set(SAMPLING_ALIASES)


def given_fields(params: SamplingParams) -> dict[str, Any]:
    """The fields of a SamplingParams that differ from the defaults: the dict a client sent
    to get it (what the fake records and reads; the server hands over validated objects)."""
    default = SamplingParams()
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)
            if getattr(params, f.name) != getattr(default, f.name)}


class QueueFullError(RuntimeError):
    """Stands in for radixlm.runtime.engine.QueueFullError (matched by name)."""


class FakeAdmission:
    """Stands in for radixlm.runtime.engine.Admission: places reserved in the fake queue."""

    def __init__(self, engine: FakeEngine, count: int) -> None:
        self.engine, self.left = engine, count

    def release(self) -> None:
        self.engine.reserved -= self.left
        self.left = 0


class FakeTokenizer:
    """Character-level tokenizer with a ChatML-like template."""

    bos_token = None
    bos_token_id = None
    eos_token = "\x00"
    eos_token_id = 0
    chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"

    def __call__(self, text: str) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(self, messages: list[dict[str, Any]], tokenize: bool = True,
                            add_generation_prompt: bool = False,
                            continue_final_message: bool = False, **_: Any) -> Any:
        if not messages:
            raise ValueError("no messages")
        if not any(m["role"] == "system" for m in messages):
            messages = [{"role": "system", "content": "You are fake."}, *messages]
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        if continue_final_message:
            text = text[:-1]
        elif add_generation_prompt:
            text += "<assistant>"
        return {"input_ids": self.encode(text)} if tokenize else text


@dataclass(frozen=True)
class FakeConfig:
    max_running_requests: int = 8
    max_queued_requests: int | None = None
    context_length: int = 64


class FakeEngine:
    """Asyncio-only stand-in for radixlm.runtime.engine.Engine."""

    def __init__(self, context_len: int = 64, step_delay: float = 0.0,
                 max_queued_requests: int | None = None) -> None:
        self.tokenizer = FakeTokenizer()
        self.config = FakeConfig(max_queued_requests=max_queued_requests,
                                 context_length=context_len)
        self.model_path = "/fake/model"
        self.model_name = "fake-model"
        self.context_len = context_len
        self.step_delay = step_delay
        self.calls: list[dict[str, Any]] = []  # kwargs of every accepted request, + "text"
        self.aborted: list[str] = []
        self.running: dict[str, int] = {}  # rid -> KV tokens held
        self.forced_waiting = 0  # reported as num_waiting
        self.reserved = 0  # places held by FakeAdmissions
        self.alive = True  # is_alive(); tests flip it to play a dead engine thread
        self.totals = {"prompt": 0, "gen": 0, "requests": 0}
        self._abort_flags: set[str] = set()

    # ---------------------------------------------------------------- contract surface

    def get_stats(self) -> dict[str, Any]:
        return {"num_running": len(self.running), "num_waiting": self.forced_waiting,
                "num_grammar_pending": 0, "kv_used_tokens": sum(self.running.values()),
                "kv_capacity": 4096, "cache_hit_rate": 0.25, "cached_tokens_total": 0,
                "prompt_tokens_total": self.totals["prompt"],
                "generation_tokens_total": self.totals["gen"], "tree_size": 0,
                "forced_tokens_total": 3, "num_requests_total": self.totals["requests"]}

    def is_alive(self) -> bool:
        return self.alive

    def reserve(self, count: int, limit: int | None = None) -> FakeAdmission:
        bound = self.config.max_queued_requests
        if limit is not None:
            bound = limit if bound is None else min(bound, limit)
        if bound is not None and count > bound:  # as Engine._check_room
            raise ValueError(f"this call needs {count} places in the waiting queue but it "
                             f"holds at most {bound}; split the call")
        if bound is not None and self.forced_waiting + self.reserved + count > bound:
            raise QueueFullError(f"waiting queue is full ({self.forced_waiting}/{bound})")
        self.reserved += count
        return FakeAdmission(self, count)

    def abort(self, rid: str) -> None:
        self.aborted.append(rid)
        self._abort_flags.add(rid)

    def flush_cache(self, tier: str | None = None) -> bool:
        return not self.running

    def shutdown(self) -> None:
        pass

    async def async_generate(self, prompt: str | None = None,
                             sampling_params: dict[str, Any] | SamplingParams | None = None,
                             input_ids: list[int] | None = None, return_logprob: bool = False,
                             logprob_start_len: int = -1, top_logprobs_num: int = 0,
                             return_text_in_logprobs: bool = False, stream: bool = False,
                             rid: str | None = None, priority: int | None = None,
                             admission: FakeAdmission | None = None) -> Any:
        if isinstance(sampling_params, SamplingParams):
            sampling_params = given_fields(sampling_params)
        kwargs = dict(prompt=prompt, sampling_params=sampling_params, input_ids=input_ids,
                      return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                      top_logprobs_num=top_logprobs_num,
                      return_text_in_logprobs=return_text_in_logprobs, rid=rid,
                      priority=priority)
        self._validate(kwargs)
        if admission is not None:
            assert admission.left >= 1, "more requests submitted than places reserved"
            admission.left -= 1
            self.reserved -= 1
        else:
            self.reserve(1).release()  # raises when full
        # the server hands over token ids it tokenized itself; "text" is what they spell
        self.calls.append({**kwargs, "text": prompt if prompt is not None
                           else self.tokenizer.decode(input_ids or [])})
        gen = self._run(kwargs)
        if stream:
            return gen
        chunks = [chunk async for chunk in gen]
        return chunks[-1]

    async def async_encode(self, prompt: str | None = None, input_ids: list[int] | None = None,
                           dimensions: int | None = None, rid: str | None = None,
                           admission: FakeAdmission | None = None) -> dict[str, Any]:
        """One input's embedding: its characters counted by ``id % EMBED_DIM``, normalised,
        after ``step_delay`` seconds a token (an abort meanwhile ends it with no vector)."""
        if dimensions is not None and not 1 <= dimensions <= EMBED_DIM:
            raise ValueError(f"dimensions={dimensions!r} must be an integer in "
                             f"[1, {EMBED_DIM}] (the model's hidden size)")
        ids = input_ids if input_ids is not None else self.tokenizer.encode(prompt or "")
        rid = rid or "encode"
        if admission is not None:
            admission.left -= 1
            self.reserved -= 1
        self.calls.append({"prompt": prompt, "input_ids": ids, "dimensions": dimensions,
                           "rid": rid, "encode": True, "text": self.tokenizer.decode(ids)})
        self.running[rid] = len(ids)
        try:  # the "prefill": step_delay seconds a token, until done or aborted
            end = asyncio.get_running_loop().time() + self.step_delay * len(ids)
            while rid not in self._abort_flags and asyncio.get_running_loop().time() < end:
                await asyncio.sleep(min(0.01, self.step_delay))
        finally:
            self.running.pop(rid, None)
        meta: dict[str, Any] = {"id": rid, "prompt_tokens": len(ids), "cached_tokens": 0,
                                "e2e_latency": 0.01}
        if rid in self._abort_flags:
            self._abort_flags.discard(rid)
            return {"embedding": None, "meta_info": {**meta, "finish_reason": {
                "type": "abort", "message": "aborted"}}}
        vec = [1e-3 + sum(1 for t in ids if t % EMBED_DIM == j) for j in range(EMBED_DIM)]
        vec = vec[:dimensions or EMBED_DIM]
        norm = sum(x * x for x in vec) ** 0.5
        return {"embedding": [x / norm for x in vec],
                "meta_info": {**meta, "finish_reason": {"type": "length", "length": 0}}}

    # ---------------------------------------------------------------- internals

    def _validate(self, kw: dict[str, Any]) -> None:
        if (kw["prompt"] is None) == (kw["input_ids"] is None):
            raise ValueError("exactly one of prompt and input_ids must be given")
        params = kw["sampling_params"] or {}
        unknown = sorted(set(params) - SAMPLING_KEYS)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        if params.get("temperature") is not None and params["temperature"] < 0:
            raise ValueError("temperature must be >= 0")
        if params.get("max_new_tokens") is not None and params["max_new_tokens"] < 0:
            raise ValueError("max_new_tokens must be >= 0")

    async def _run(self, kw: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        rid = kw["rid"]
        params = kw["sampling_params"] or {}
        ids = kw["input_ids"] or self.tokenizer.encode(kw["prompt"])
        max_new = params.get("max_new_tokens", 128)
        target = params["choices"][0] if params.get("choices") else None
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        if params.get("regex") == "!crash":  # an internal failure, as the engine reports one
            yield self._result(kw, ids, [], "", {"type": "abort", "error": "internal_error",
                                                 "status_code": 500,
                                                 "message": "internal error: injected"})
            return
        if params.get("regex") == "(":  # compiles "asynchronously" and fails, as the engine
            yield self._result(kw, ids, [], "", {"type": "abort", "error": "invalid_constraint",
                                                 "message": "invalid constraint: bad regex"})
            return
        self.running[rid] = len(ids)
        self.totals["prompt"] += len(ids)
        out: list[int] = []
        text = ""
        reason: dict[str, Any] | None = None
        try:
            while reason is None:
                if rid in self._abort_flags:
                    reason = {"type": "abort", "message": "aborted"}
                    break
                if len(out) >= max_new:
                    reason = {"type": "length", "length": max_new}
                    break
                await asyncio.sleep(self.step_delay)
                if rid in self._abort_flags:
                    continue
                if target is not None:
                    out, text = self.tokenizer.encode(target), target
                    reason = {"type": "stop", "matched": 0}
                else:
                    out.append(ord(string.ascii_lowercase[len(out) % 26]))
                    text = self.tokenizer.decode(out)
                    for s in stops:
                        if s in text:
                            text = text[:text.index(s)]
                            reason = {"type": "stop", "matched": s}
                self.running[rid] = len(ids) + len(out)
                self.totals["gen"] += 1
                yield self._result(kw, ids, out, text, reason)
            if reason["type"] != "stop":
                yield self._result(kw, ids, out, text, reason)
        finally:
            self.running.pop(rid, None)
            self._abort_flags.discard(rid)
            self.totals["requests"] += 1

    def _result(self, kw: dict[str, Any], ids: list[int], out: list[int], text: str,
                reason: dict[str, Any] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"id": kw["rid"], "prompt_tokens": len(ids),
                                "completion_tokens": len(out), "cached_tokens": 2,
                                "finish_reason": reason, "e2e_latency": 0.01, "ttft": 0.005}
        if kw["return_logprob"]:
            t = kw["return_text_in_logprobs"]

            def entry(lp: float | None, tid: int) -> tuple[Any, int, str | None]:
                return (lp, tid, chr(tid) if t else None)

            start = kw["logprob_start_len"]
            meta["input_token_logprobs"] = ([] if start < 0 else
                                            [entry(None if p == 0 else -1.0, ids[p])
                                             for p in range(start, len(ids))])
            meta["output_token_logprobs"] = [entry(-0.5, x) for x in out]
            k = kw["top_logprobs_num"]
            meta["output_top_logprobs"] = [[entry(-0.5 - j, x + j) for j in range(k)]
                                           for x in out]
            meta["input_top_logprobs"] = [None for _ in meta["input_token_logprobs"]]
        return {"text": text, "output_ids": list(out), "meta_info": meta}


# ---------------------------------------------------------------- a real server on loopback


class ScriptedTokenizer(FakeTokenizer):
    def decode(self, ids: list[int], **_: Any) -> str:  # the reasoning split passes options
        return super().decode(ids)


@dataclass(frozen=True)
class ScriptedConfig(FakeConfig):
    reasoning_parser: str | None = None


class ScriptedEngine(FakeEngine):
    """The fake engine; with ``script`` set it writes that text (a character a token, cut at
    max_new_tokens, ``step_delay`` seconds apart) and stops. The script "!crash" fails as an
    internal error does; a `json_schema` mentioning "!bad" fails to compile, as the engine's
    grammar compile reports it (an abort with `invalid_constraint`). ``reset()``: back to
    the fake engine's own behaviour and config."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tokenizer = ScriptedTokenizer()
        self.script: str | None = None
        self._config = self.config

    def reset(self) -> None:
        self.script, self.config, self.step_delay = None, self._config, 0.0

    async def _run(self, kw: dict[str, Any]):  # type: ignore[override]
        ids, params = kw["input_ids"], kw["sampling_params"] or {}
        if "!bad" in str(params.get("json_schema")):
            yield self._result(kw, ids, [], "", {"type": "abort", "error": "invalid_constraint",
                                                 "message": "invalid constraint: unsupported "
                                                            "json_schema: bad"})
            return
        if self.script is None:
            async for chunk in super()._run(kw):
                yield chunk
            return
        if self.script == "!crash":
            yield self._result(kw, ids, [], "", {"type": "abort", "status_code": 500,
                                                 "error": "internal_error",
                                                 "message": "internal error: injected"})
            return
        text = self.script[:params.get("max_new_tokens", 128)]
        for n in range(1, len(text) + 1):
            await asyncio.sleep(self.step_delay)
            end = {"type": "stop" if len(text) == len(self.script) else "length"}
            yield self._result(kw, ids, [ord(c) for c in text[:n]], text[:n],
                               end if n == len(text) else None)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` is running (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadServer:
    """uvicorn serving `app` on 127.0.0.1 in a daemon thread; `stop()` always ends it. As a
    context manager: started on entry, stopped on exit."""

    def __init__(self, app: Any) -> None:
        import threading

        import uvicorn

        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> ThreadServer:
        import time

        self.thread.start()
        for _ in range(500):  # up to ~10 s; fails loudly below otherwise
            if self.server.started:
                return self
            if not self.thread.is_alive():
                break
            time.sleep(0.02)
        raise RuntimeError("the test server did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self) -> ThreadServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_until(predicate: Any, what: str, limit_s: float = 10.0,
               interval: float = 0.01) -> None:
    """Poll `predicate` every `interval` seconds until true; fail after `limit_s` (a hang
    guard, not a timing test)."""
    import time

    end = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for: {what}")
        time.sleep(interval)


# A server that is starting shares 2 cores with the test polling it: polls go through one
# client (a new httpx client per poll builds an SSL context, ~20 ms of CPU) 10 times a second.
STARTUP_POLL_S = 0.1
_health_client = None


def health_ok(url: str, timeout: float = 5) -> bool:
    """Whether ``url``'s /health answers 200 (False while nothing listens there)."""
    global _health_client
    import httpx

    if _health_client is None:
        _health_client = httpx.Client()
    try:
        return _health_client.get(url + "/health", timeout=timeout).status_code == 200
    except httpx.TransportError:
        return False


_SERVE_SCRIPT = """
import sys, time
sys.path.insert(0, {tests!r})
from server_fakes import FakeEngine
from radixlm.server.launch import serve
from radixlm.server.state import ServerSettings
{preamble}
sys.exit(serve({{}}, ServerSettings(port={port}{settings}), {log_level!r},
               engine_factory=lambda **kw: {engine}))
"""


@contextlib.contextmanager
def fake_server_process(engine: str = "FakeEngine()", settings: str = "",
                        log_level: str = "warning",
                        preamble: str = "") -> Iterator[tuple[subprocess.Popen, str]]:
    """`launch.serve` (the real entry point: signals, exit codes) in a child process on
    127.0.0.1, its engine the Python expression `engine` (`preamble` may define a class for
    it; `settings` is extra ServerSettings keywords, e.g. ", shutdown_timeout=1"). Yields
    (process, url) once /health answers (failing with the child's stderr if it exits
    first); the process is killed on the way out if still running."""
    port = free_port()
    code = _SERVE_SCRIPT.format(tests=str(Path(__file__).parent), port=port, engine=engine,
                                settings=settings, log_level=log_level, preamble=preamble)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def up() -> bool:
            if health_ok(url):
                return True
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            return False

        wait_until(up, "the server to start", limit_s=60, interval=STARTUP_POLL_S)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
