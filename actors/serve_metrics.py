"""Prometheus metrics of one replica, in its own registry (served at ``/metrics``).

Each replica owns a ``CollectorRegistry``, so two replicas (or a test's second app) in one process never
collide on metric names; a Prometheus scrape of ``/metrics`` reaches one replica at a time.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from actors.serve_loop import CycleReport

LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class ServeMetrics:
    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        self.model_name = model_name

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, ["model"], registry=self.registry).labels(model_name)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, ["model"], buckets=LATENCY_BUCKETS_S,
                             registry=self.registry).labels(model_name)

        self.queue_depth = gauge("blockserve_queue_depth", "Requests accepted and waiting for a row")
        self.running_rows = gauge("blockserve_running_rows", "Rows in the batch after the last engine step")
        self.bounding_box_tokens = gauge("blockserve_bounding_box_tokens",
                                         "rows x widest row materialized by the last engine step")
        self.effective_compute_ratio = gauge(
            "blockserve_effective_compute_ratio",
            "Mean unfinished requests per batch slot over all denoising steps since start")
        self.tokens_per_s = gauge("blockserve_tokens_per_second",
                                  "Generated tokens per second of engine time since start")
        self.loop_healthy = gauge("blockserve_engine_loop_healthy", "1 while the engine loop serves")
        self.generated_tokens = Counter("blockserve_generated_tokens", "Tokens in finished outputs",
                                        ["model"], registry=self.registry).labels(model_name)
        self.steps = Counter("blockserve_steps", "Denoising steps run (one forward each)", ["model"],
                             registry=self.registry).labels(model_name)
        self.requests = Counter("blockserve_requests", "Requests finished by the engine, by reason",
                                ["model", "finish_reason"], registry=self.registry)
        self.rejected = Counter("blockserve_requests_rejected", "Requests refused (429): queue full",
                                ["model"], registry=self.registry).labels(model_name)
        self.latency = histogram("blockserve_request_latency_seconds", "Arrival to last block")
        self.time_to_first_block = histogram("blockserve_time_to_first_block_seconds",
                                             "Arrival to the first committed block")
        self.queue_time = histogram("blockserve_queue_seconds", "Arrival to admission into a row")
        self.loop_healthy.set(1)

    def record_cycle(self, report: CycleReport) -> None:
        """Called by the engine loop after every engine step (on the loop thread)."""
        self.queue_depth.set(report.num_waiting)
        self.running_rows.set(report.num_running)
        if report.cycle.num_rows:
            self.steps.inc()
            self.bounding_box_tokens.set(report.cycle.bounding_box_tokens)
        self.effective_compute_ratio.set(report.stats.effective_compute_ratio)
        self.tokens_per_s.set(report.stats.tokens_per_s)
        for stream, output in report.finished:
            self.requests.labels(self.model_name, output.finish_reason).inc()
            self.generated_tokens.inc(len(output.token_ids))
            self.latency.observe(output.finish_time - stream.arrival_time)
            if stream.first_scheduled_time is not None:
                self.queue_time.observe(stream.first_scheduled_time - stream.arrival_time)
                self.time_to_first_block.observe(stream.first_block_time - stream.arrival_time)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
