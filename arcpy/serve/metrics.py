"""The server's Prometheus metrics (GET /metrics): rates, latencies, the queue, the path's health.

One registry per server (not the process-wide default), so that two servers in one process, as in
tests, keep their counts apart. prometheus_client is thread-safe: the worker thread records a
finished sequence, the event loop a response's status.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from arcpy.loop.stats import GenerationStats

CONTENT_TYPE = CONTENT_TYPE_LATEST

_SECONDS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
_RATES = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000)


class Metrics:
    def __init__(self, latched=lambda: False):
        r = self.registry = CollectorRegistry()
        self.responses = Counter("arcpy_http_responses", "HTTP responses by route and status",
                                 ["route", "status"], registry=r)
        self.sequences = Counter("arcpy_sequences", "Sequences decoded, by how they ended (arcpy's finish "
                                 "reason: stop_id, stop_string, token_budget, context_full, cancelled, fault)",
                                 ["finish_reason"], registry=r)
        self.tokens = Counter("arcpy_generated_tokens", "Tokens generated", registry=r)
        self.prompt_tokens = Counter("arcpy_prompt_tokens", "Prompt tokens read", registry=r)
        self.cached_tokens = Counter("arcpy_prompt_cached_tokens", "Prompt tokens whose KV rows an earlier "
                                     "prefill left (not prefilled again)", registry=r)
        self.cache_clears = Counter("arcpy_prefix_cache_clears", "Requests to forget the cached prefix",
                                    registry=r)
        self.ttft = Histogram("arcpy_time_to_first_token_seconds", "From the request's arrival to its first "
                              "token (queue, template, prefill)", buckets=_SECONDS, registry=r)
        self.latency = Histogram("arcpy_request_duration_seconds", "From the request's arrival to its last "
                                 "token", buckets=_SECONDS, registry=r)
        self.decode_rate = Histogram("arcpy_decode_tokens_per_second", "Per request: tokens after the first, "
                                     "per second", buckets=_RATES, registry=r)
        self.queue_depth = Gauge("arcpy_queue_depth", "Requests waiting for the engine", registry=r)
        self.running = Gauge("arcpy_running_requests", "Requests being decoded (0 or 1)", registry=r)
        self.host_waits = Counter("arcpy_host_waits", "Waits of the host for the GPU while producing tokens "
                                  "(0 per token on the device loop)", registry=r)
        self.host_waits_per_token = Gauge("arcpy_host_waits_per_token", "Host waits per token of the last "
                                          "sequence", registry=r)
        self.faults = Counter("arcpy_faults", "Requests that failed in the engine (each answered 500)", registry=r)
        self.fallbacks = Counter("arcpy_fallbacks", "Sequences whose device loop failed and went on on the host "
                                 "path", registry=r)
        self.cancel_seconds = Histogram("arcpy_cancel_seconds", "From a cancel (client gone, timeout) to the "
                                        "engine being free for the next request", buckets=_SECONDS, registry=r)
        latch = Gauge("arcpy_device_loop_latched", "1 once a device-loop failure latched the loop off for "
                      "the process", registry=r)
        latch.set_function(lambda: 1.0 if latched() else 0.0)

    def sequence(self, stats: GenerationStats, ttft: float | None, latency: float, decode_rate: float | None) -> None:
        """A sequence ended, however it ended (the worker thread)."""
        self.sequences.labels(stats.finish_reason or "unknown").inc()
        self.tokens.inc(stats.tokens)
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_tokens.inc(stats.cached_tokens)
        self.host_waits.inc(stats.host_waits)
        self.host_waits_per_token.set(stats.per_token(stats.host_waits))
        if stats.fallback:
            self.fallbacks.inc()
        if ttft is not None:
            self.ttft.observe(ttft)
        if decode_rate is not None:
            self.decode_rate.observe(decode_rate)
        self.latency.observe(latency)

    def text(self) -> bytes:
        return generate_latest(self.registry)
