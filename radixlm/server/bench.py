"""`radixlm bench serving`: load-test a running server over HTTP (radixlm native /generate or
any OpenAI-compatible /v1/completions), streaming so TTFT and inter-token latency are seen.

Datasets are generated locally: `random` (independent prompts of random words) and
`shared-prefix` (groups of prompts sharing a long system-like prefix, the radix cache's case).
Lengths are in words, which these tokenizers map to roughly one token each; the report uses
the token counts the server returns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from radixlm.server.streaming import SSE_DONE, sse_event

_WORDS = ("time person year way day thing man world life hand part child eye woman place work "
          "week case point number group problem fact water room mother area money story month "
          "lot right study book job word business issue side kind head house service friend "
          "father power hour game line end member law car city name team minute idea kid body "
          "back parent face others level office door health art war history party result "
          "change morning reason research girl guy moment air teacher force education").split()


@dataclass
class BenchRequest:
    """One prompt to send."""

    prompt: str
    output_len: int


@dataclass
class RequestResult:
    """What one request measured (times in seconds)."""

    ok: bool = False
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    e2e: float = 0.0
    itl: list[float] = field(default_factory=list)


def make_dataset(kind: str, num: int, input_len: int, output_len: int, seed: int,
                 prefix_len: int = 0, num_groups: int = 4) -> list[BenchRequest]:
    """`random` or `shared-prefix` prompts; lengths counted in words."""
    rng = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(rng.choice(_WORDS) for _ in range(max(n, 1)))

    if kind == "random":
        return [BenchRequest(words(input_len), output_len) for _ in range(num)]
    if kind == "shared-prefix":
        plen = prefix_len or max(input_len * 3 // 4, 1)
        prefixes = [words(plen) for _ in range(max(num_groups, 1))]
        return [BenchRequest(f"{prefixes[i % len(prefixes)]}\n{words(input_len - plen)}",
                             output_len) for i in range(num)]
    raise ValueError(f"unknown dataset {kind!r} (random | shared-prefix)")


async def _sse_lines(resp: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in resp.aiter_lines():
        event = sse_event(line)
        if event == SSE_DONE:
            return
        if isinstance(event, dict):
            yield event


class _TokenClock:
    """TTFT and inter-token latencies of one streamed request into `res`, from the count of
    tokens seen so far (an event that brings k tokens adds k gaps of a k-th of its wait)."""

    def __init__(self, res: RequestResult) -> None:
        self.res, self.t0 = res, time.perf_counter()
        self.last_t: float | None = None
        self.last_n = 0

    def seen(self, now: float, n: int) -> None:
        """`n` tokens have arrived by `now`."""
        if n <= self.last_n:
            return
        if self.last_t is None:
            self.res.ttft = now - self.t0
        else:
            gaps = n - self.last_n
            self.res.itl.extend([(now - self.last_t) / gaps] * gaps)
        self.last_t, self.last_n = now, n


async def _refusal(resp: httpx.Response) -> RequestResult | None:
    """The failed result of a non-200 response, else None."""
    if resp.status_code == 200:
        return None
    return RequestResult(error=f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}")


async def send_native(client: httpx.AsyncClient, req: BenchRequest,
                      opts: argparse.Namespace) -> RequestResult:
    """One streamed radixlm/SGLang /generate request."""
    body = {"text": req.prompt, "stream": True,
            "sampling_params": {"max_new_tokens": req.output_len, "temperature": 0.0,
                                "ignore_eos": not opts.no_ignore_eos}}
    res = RequestResult()
    clock = _TokenClock(res)
    async with client.stream("POST", "/generate", json=body) as resp:
        if (refused := await _refusal(resp)) is not None:
            return refused
        async for event in _sse_lines(resp):
            n = len(event.get("output_ids") or ())
            clock.seen(time.perf_counter(), n)
            meta = event.get("meta_info", {})
            res.prompt_tokens = int(meta.get("prompt_tokens", 0))
            res.output_tokens = int(meta.get("completion_tokens", n))
    res.e2e, res.ok = time.perf_counter() - clock.t0, True
    return res


async def send_openai(client: httpx.AsyncClient, req: BenchRequest,
                      opts: argparse.Namespace) -> RequestResult:
    """One streamed OpenAI /v1/completions request (usage from the final chunk); each chunk
    with text counts as one token."""
    body: dict[str, Any] = {"model": opts.model, "prompt": req.prompt, "stream": True,
                            "max_tokens": req.output_len, "temperature": 0.0,
                            "stream_options": {"include_usage": True}}
    if not opts.no_ignore_eos:
        body["ignore_eos"] = True
    res = RequestResult()
    clock = _TokenClock(res)
    chunks = 0
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if (refused := await _refusal(resp)) is not None:
            return refused
        async for event in _sse_lines(resp):
            now = time.perf_counter()
            if any(c.get("text") for c in event.get("choices") or ()):
                chunks += 1
                clock.seen(now, chunks)
            if event.get("usage"):
                res.prompt_tokens = int(event["usage"].get("prompt_tokens", 0))
                res.output_tokens = int(event["usage"].get("completion_tokens", 0))
    res.output_tokens = res.output_tokens or chunks
    res.e2e, res.ok = time.perf_counter() - clock.t0, True
    return res


def _arrival_gaps(n: int, rate: float, kind: str, seed: int) -> list[float]:
    if rate == float("inf") or rate <= 0:
        return [0.0] * n
    rng = random.Random(seed + 1)
    return [rng.expovariate(rate) if kind == "poisson" else 1.0 / rate for _ in range(n)]


async def run_benchmark(opts: argparse.Namespace) -> dict[str, Any]:
    """Send the dataset with the configured arrivals; return the summary dict."""
    dataset = make_dataset(opts.dataset, opts.num_prompts, opts.input_len, opts.output_len,
                           opts.seed, opts.shared_prefix_len, opts.num_groups)
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    limits = httpx.Limits(max_connections=opts.max_concurrency or 1000)
    async with httpx.AsyncClient(base_url=opts.base_url.rstrip("/"), headers=headers,
                                 timeout=None, limits=limits) as client:
        if opts.backend == "openai" and not opts.model:
            opts.model = (await client.get("/v1/models")).json()["data"][0]["id"]
        send = send_native if opts.backend == "radixlm" else send_openai
        sem = asyncio.Semaphore(opts.max_concurrency or len(dataset) or 1)

        async def one(req: BenchRequest) -> RequestResult:
            async with sem:
                try:
                    return await send(client, req, opts)
                except Exception as exc:  # noqa: BLE001 - counted as a failed request
                    return RequestResult(error=f"{type(exc).__name__}: {exc}")

        tasks = []
        t0 = time.perf_counter()
        for req, gap in zip(dataset, _arrival_gaps(len(dataset), opts.request_rate,
                                                    opts.arrival, opts.seed), strict=True):
            tasks.append(asyncio.ensure_future(one(req)))
            if gap:
                await asyncio.sleep(gap)
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
    return summarize(results, duration, opts)


def _pcts(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    s = sorted(values)

    def pct(q: float) -> float:
        return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]

    return {"mean": sum(s) / len(s) * 1000, "p50": pct(0.5) * 1000, "p90": pct(0.9) * 1000,
            "p99": pct(0.99) * 1000}


def summarize(results: list[RequestResult], duration: float,
              opts: argparse.Namespace) -> dict[str, Any]:
    """Throughputs and latency percentiles (latencies in ms)."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "backend": opts.backend, "base_url": opts.base_url, "dataset": opts.dataset,
        "num_prompts": len(results), "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if not r.ok})[:5],
        "request_rate": str(opts.request_rate), "max_concurrency": opts.max_concurrency,
        "duration_s": duration,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "input_token_throughput": sum(r.prompt_tokens for r in ok) / duration if duration else 0,
        "output_token_throughput": out_tokens / duration if duration else 0.0,
        "total_input_tokens": sum(r.prompt_tokens for r in ok),
        "total_output_tokens": out_tokens,
        "ttft_ms": _pcts([r.ttft for r in ok]), "tpot_ms": _pcts(tpot),
        "itl_ms": _pcts([x for r in ok for x in r.itl]), "e2e_ms": _pcts([r.e2e for r in ok]),
    }


def format_table(summary: dict[str, Any]) -> str:
    """A human-readable table of the summary."""
    rows = [("backend", summary["backend"]), ("completed / failed",
                                               f"{summary['completed']} / {summary['failed']}"),
            ("duration (s)", f"{summary['duration_s']:.2f}"),
            ("request throughput (req/s)", f"{summary['request_throughput']:.2f}"),
            ("input tokens/s", f"{summary['input_token_throughput']:.1f}"),
            ("output tokens/s", f"{summary['output_token_throughput']:.1f}")]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        p = summary[key]
        rows.append((f"{key[:-3].upper()} ms mean/p50/p90/p99",
                     f"{p['mean']:.1f} / {p['p50']:.1f} / {p['p90']:.1f} / {p['p99']:.1f}"))
    width = max(len(k) for k, _ in rows)
    lines = ["=" * (width + 30)] + [f"{k:<{width}}  {v}" for k, v in rows] + ["=" * (width + 30)]
    if summary["errors"]:
        lines.append("errors: " + "; ".join(summary["errors"]))
    return "\n".join(lines)


def add_args(p: argparse.ArgumentParser) -> None:
    """Arguments of `radixlm bench serving`."""
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--backend", choices=["radixlm", "openai"], default="radixlm")
    p.add_argument("--model", help="model id for the openai backend (default: /v1/models)")
    p.add_argument("--api-key")
    p.add_argument("--dataset", choices=["random", "shared-prefix"], default="random")
    p.add_argument("--num-prompts", type=int, default=50)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--shared-prefix-len", type=int, default=0,
                   help="shared-prefix words (default 3/4 of --input-len)")
    p.add_argument("--num-groups", type=int, default=4, help="distinct shared prefixes")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second (inf: all at once)")
    p.add_argument("--arrival", choices=["poisson", "fixed"], default="poisson")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--no-ignore-eos", action="store_true",
                   help="do not send ignore_eos (for servers that reject it)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-json", help="also write the summary here")


def main_from_args(opts: argparse.Namespace) -> int:
    """Run, print the table and the JSON summary; non-zero exit when every request failed."""
    summary = asyncio.run(run_benchmark(opts))
    print(format_table(summary))
    text = json.dumps({**summary, "config": {k: v for k, v in asdict_safe(opts).items()
                                             if k != "api_key"}}, indent=2)
    print(text)
    if opts.output_json:
        with open(opts.output_json, "w") as f:
            f.write(text + "\n")
    return 0 if summary["completed"] else 1


def asdict_safe(opts: argparse.Namespace) -> dict[str, Any]:
    """Namespace -> JSON-able dict (callables dropped)."""
    return {k: (str(v) if v == float("inf") else v) for k, v in vars(opts).items()
            if not callable(v)}

