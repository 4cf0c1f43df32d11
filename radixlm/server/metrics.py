"""Prometheus metrics, on a registry of their own per app (several apps may share a process).

Latency histograms and request counters are recorded by the server as requests finish;
engine-side counters and gauges (tokens, queue sizes, KV usage, cache hit rate, forced
tokens) are read from `engine.get_stats()` at scrape time by a custom collector.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger("radixlm.server")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0,
                2.5, 5.0)

# (stats key, metric name, help, kind)
_ENGINE_METRICS = (
    ("prompt_tokens_total", "radixlm_prompt_tokens", "Prompt tokens processed", "counter"),
    ("generation_tokens_total", "radixlm_generation_tokens", "Tokens generated", "counter"),
    ("cached_tokens_total", "radixlm_cached_tokens", "Prompt tokens served from the radix cache",
     "counter"),
    ("forced_tokens_total", "radixlm_forced_tokens", "Tokens appended by jump-forward",
     "counter"),
    ("num_requests_total", "radixlm_engine_requests", "Requests finished by the engine",
     "counter"),
    ("num_running", "radixlm_num_running_requests", "Requests in the running batch", "gauge"),
    ("num_waiting", "radixlm_num_queued_requests", "Requests in the waiting queue", "gauge"),
    ("num_grammar_pending", "radixlm_num_grammar_pending", "Requests waiting for a grammar",
     "gauge"),
    ("kv_used_tokens", "radixlm_kv_used_tokens", "KV slots in use", "gauge"),
    ("kv_capacity", "radixlm_kv_capacity_tokens", "KV pool capacity in tokens", "gauge"),
    ("cache_hit_rate", "radixlm_cache_hit_rate", "Share of prompt tokens hit in the cache",
     "gauge"),
    ("tree_size", "radixlm_radix_tree_tokens", "Tokens held by the radix tree", "gauge"),
    ("spec_verify_ct_total", "radixlm_spec_verify_steps",
     "Speculative decoding: decode steps of requests (each verifies a draft, or none)",
     "counter"),
    ("spec_draft_tokens_total", "radixlm_spec_draft_tokens",
     "Speculative decoding: draft tokens verified", "counter"),
    ("spec_accepted_tokens_total", "radixlm_spec_accepted_tokens",
     "Speculative decoding: draft tokens accepted", "counter"),
    ("tp_size", "radixlm_tp_size", "Tensor-parallel ranks of this engine", "gauge"),
    ("dp_size", "radixlm_dp_size",
     "Data-parallel size of this engine (1: a replica behind sglang-router is one rank)",
     "gauge"),
)


class _EngineStatsCollector(Collector):
    """Reads engine.get_stats() on every scrape."""

    def __init__(self, get_stats: Callable[[], dict[str, Any]]) -> None:
        self._get_stats = get_stats

    def collect(self) -> Iterator[Metric]:
        try:
            stats = self._get_stats()
        except Exception:  # noqa: BLE001 - a scrape must not fail because the engine did
            logger.exception("engine.get_stats() failed during a scrape")
            return
        for key, name, doc, kind in _ENGINE_METRICS:
            value = stats.get(key)
            if value is None:
                continue
            family = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            yield family(name, doc, value=float(value))
        used, cap = stats.get("kv_used_tokens"), stats.get("kv_capacity")
        if used is not None and cap:
            yield GaugeMetricFamily("radixlm_kv_usage_ratio", "KV pool usage (0..1)",
                                    value=float(used) / float(cap))
        yield from _spec_ratios(stats)
        yield from _tier_metrics(stats.get("hicache"))


# Per-tier figures of the hierarchical cache: (stats key, metric name, help, kind).
_TIER_METRICS = (
    ("hit_tokens", "radixlm_hicache_hit_tokens",
     "Prompt tokens admissions took from each cache tier", "counter"),
    ("promoted_tokens", "radixlm_hicache_promoted_tokens",
     "Tokens brought back to the KV pool from each slower tier", "counter"),
    ("demoted_tokens", "radixlm_hicache_demoted_tokens",
     "Tokens copied into each slower tier (evicted to host, written through to storage)",
     "counter"),
    ("evicted_tokens", "radixlm_hicache_evicted_tokens",
     "Tokens dropped from the host tier (for room, or too large for it)", "counter"),
    ("tokens", "radixlm_hicache_tokens", "Tokens each cache tier holds", "gauge"),
    ("bytes", "radixlm_hicache_bytes", "Bytes of K/V each cache tier holds", "gauge"),
    ("capacity_bytes", "radixlm_hicache_capacity_bytes", "Bytes each cache tier may hold",
     "gauge"),
)
# The storage tier's file counters: (stats key, metric name, help).
_STORAGE_COUNTERS = (
    ("corrupt_files", "radixlm_hicache_storage_corrupt_files",
     "Stored blocks that failed their checks on load (removed, never served)"),
    ("skipped_writes", "radixlm_hicache_storage_skipped_writes",
     "Blocks not written through because the write queue was full"),
    ("write_errors", "radixlm_hicache_storage_write_errors", "Block writes that failed"),
    ("evicted_files", "radixlm_hicache_storage_evicted_files",
     "Stored blocks removed to stay within --hicache-storage-size"),
)


def _tier_metrics(tiers: dict[str, Any] | None) -> Iterator[Metric]:
    """The hierarchical cache's figures by tier (label ``tier``); absent when it is off."""
    if not tiers:
        return
    for key, name, doc, kind in _TIER_METRICS:
        family = (CounterMetricFamily if kind == "counter" else GaugeMetricFamily)(
            name, doc, labels=["tier"])
        for tier, figures in tiers.items():
            if key in figures:
                family.add_metric([tier], float(figures[key]))
        yield family
    storage = tiers.get("storage")
    if storage is not None:
        for key, name, doc in _STORAGE_COUNTERS:
            yield CounterMetricFamily(name, doc, value=float(storage[key]))
        yield GaugeMetricFamily("radixlm_hicache_storage_writing",
                                "1 while the storage tier writes (0: stopped, disk full)",
                                value=float(storage["writing"]))


def _spec_ratios(stats: dict[str, Any]) -> Iterator[Metric]:
    """Speculative decoding's acceptance rate (accepted / drafted tokens) and acceptance
    length (tokens emitted per verification step, SGLang's spec_accept_length), over the
    engine's life; absent while speculation is off."""
    verify = stats.get("spec_verify_ct_total")
    if verify is None:
        return
    drafted = stats.get("spec_draft_tokens_total") or 0
    accepted = stats.get("spec_accepted_tokens_total") or 0
    emitted = stats.get("spec_emitted_tokens_total") or 0
    yield GaugeMetricFamily("radixlm_spec_accept_rate",
                            "Speculative decoding: accepted / drafted tokens",
                            value=accepted / drafted if drafted else 0.0)
    yield GaugeMetricFamily("radixlm_spec_accept_length",
                            "Speculative decoding: tokens emitted per verification step",
                            value=emitted / verify if verify else 1.0)


class ServerMetrics:
    """The metrics of one app; `render()` gives the Prometheus text format."""

    def __init__(self, get_stats: Callable[[], dict[str, Any]]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http_requests = Counter("radixlm_http_requests", "HTTP requests answered",
                                     ["method", "route", "status"], registry=r)
        self.requests = Counter("radixlm_requests", "Generation requests finished",
                                ["finish_reason"], registry=r)
        self.rejected = Counter("radixlm_rejected_requests",
                                "Requests refused with a 4xx (or 503), by reason", ["reason"],
                                registry=r)
        self.failed = Counter("radixlm_failed_requests",
                              "Requests that failed inside the server or engine (5xx, or an "
                              "in-band stream error), by reason", ["reason"], registry=r)
        self.ttft = Histogram("radixlm_time_to_first_token_seconds",
                              "Time to first token (streamed requests)",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("radixlm_inter_token_latency_seconds",
                             "Time per output token between stream chunks",
                             buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("radixlm_e2e_request_latency_seconds",
                             "End-to-end generation request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        r.register(_EngineStatsCollector(get_stats))

    def observe_finished(self, rid: str, meta: dict[str, Any], e2e_s: float,
                         streamed: bool) -> None:
        """Count one finished request, record its latencies (TTFT from the engine's
        meta_info["ttft"] when not streamed) and log it as one JSON line."""
        finish_reason = meta.get("finish_reason")
        reason = finish_reason.get("type", "unknown") if isinstance(finish_reason, dict) else (
            str(finish_reason) if finish_reason else "unknown")
        self.requests.labels(finish_reason=reason).inc()
        self.e2e.observe(e2e_s)
        if not streamed and isinstance(meta.get("ttft"), int | float):
            self.ttft.observe(float(meta["ttft"]))
        logger.info(json.dumps({
            "event": "generation", "rid": rid, "finish_reason": reason,
            "prompt_tokens": meta.get("prompt_tokens"),
            "completion_tokens": meta.get("completion_tokens"),
            "cached_tokens": meta.get("cached_tokens"), "e2e_ms": round(e2e_s * 1000, 2),
            "streamed": streamed}))

    def count_error(self, exc: Any) -> None:
        """Count an ApiError answered to a client: internal failures (500, 504) as failed,
        everything else (4xx, 503) as a rejection; the reason is its code or status."""
        reason = str(exc.code if exc.code is not None else exc.status)
        if exc.status >= 500 and exc.status != 503:
            self.failed.labels(reason=reason).inc()
        else:
            self.rejected.labels(reason=reason).inc()

    def render(self) -> bytes:
        """All metrics in the Prometheus text exposition format."""
        return generate_latest(self.registry)
