"""Metrics of one Serve replica, exported through Ray (every replica, tagged) and mirrored at ``/metrics``.

Every metric is a ``ray.serve.metrics`` Counter / Gauge / Histogram: each replica records into its own
Ray worker, the metrics agent of its node exports the samples in Prometheus text at that node's metrics
export port (``ray start --metrics-export-port``, or ``metrics_export_port`` in ``ray.nodes()``), and the
Prometheus / Grafana setup that scrapes a Ray cluster sees **every replica**. Ray prefixes the names with
``ray_`` (counters also get ``_total``) and Serve adds the tags ``application``, ``deployment`` and
``replica`` (the replica's unique id); we add ``model`` (the served model name), and ``finish_reason``
on ``ray_blockserve_requests_total``. Ray exports every few seconds (the metrics report interval), so a
fresh sample can take ~5-10 s to show up, and a counter appears there after its first increment.

The replica's ``GET /metrics`` route is a debugging aid for **one replica only**: it renders a local
mirror of the same metrics (without the ``ray_`` prefix) with the ``replica`` label on every sample and
a leading comment naming the replica. Behind Serve's load-balanced route each request reaches a random
replica, so scrape Ray's metrics export, not ``/metrics``, to monitor a deployment.

Metrics (as Ray exports them):
``ray_blockserve_queue_depth``, ``ray_blockserve_running_rows``, ``ray_blockserve_bounding_box_tokens``,
``ray_blockserve_effective_compute_ratio``, ``ray_blockserve_tokens_per_second``,
``ray_blockserve_engine_loop_healthy`` (gauges); ``ray_blockserve_generated_tokens_total``,
``ray_blockserve_steps_total``, ``ray_blockserve_requests_total{finish_reason}``,
``ray_blockserve_requests_rejected_total`` (429s) (counters); ``ray_blockserve_request_latency_seconds``,
``ray_blockserve_time_to_first_block_seconds``, ``ray_blockserve_queue_seconds`` (histograms).
Gauges are set after every engine step and refreshed once a second by :meth:`ServeMetrics.watch`, so an
idle replica reports its live queue and a dead engine loop reports ``engine_loop_healthy 0``.
"""
from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING

import prometheus_client
from ray.serve import metrics as ray_metrics

from actors.engine_loop import CycleReport

if TYPE_CHECKING:
    from actors.engine_loop import EngineLoop

LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
WATCH_PERIOD_S = 1.0
LOCAL_LABELS = ("model", "application", "deployment", "replica")


def replica_identity() -> dict[str, str]:
    """application / deployment / replica of the calling Serve replica ("" outside Serve)."""
    from ray.serve.context import _get_internal_replica_context

    context = _get_internal_replica_context()
    if context is None:
        return {"application": "", "deployment": "", "replica": "", "replica_full_id": ""}
    return {"application": context.app_name or "", "deployment": context.deployment,
            "replica": context.replica_tag, "replica_full_id": context.replica_id.to_full_id_str()}


class _Metric:
    """One metric written twice: to Ray (the cluster-wide export) and to the replica-local mirror.

    ``inc`` / ``set`` / ``observe`` as in both libraries; ``tags`` are the extra tag values (e.g.
    ``finish_reason``). Ray's Counter refuses ``inc(0)``, so a zero increment is skipped."""

    def __init__(self, ray_metric, local_metric, local_values: dict[str, str], extra_tags: tuple = ()):
        self._ray, self._local, self._local_values = ray_metric, local_metric, local_values
        if not extra_tags:
            self._local_child(None)  # the mirror shows the series (at 0) before its first update

    def _local_child(self, tags: dict[str, str] | None):
        return self._local.labels(**self._local_values, **(tags or {}))

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        if value <= 0:
            if value < 0:
                raise ValueError(f"a counter only goes up, got inc({value})")
            return
        self._ray.inc(float(value), tags=dict(tags) if tags else None)
        self._local_child(tags).inc(value)

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self._ray.set(float(value), tags=dict(tags) if tags else None)
        self._local_child(tags).set(float(value))

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        value = max(float(value), 0.0)  # clocks of two threads: never a negative duration
        self._ray.observe(value, tags=dict(tags) if tags else None)
        self._local_child(tags).observe(value)


class ServeMetrics:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.identity = replica_identity()
        self.registry = prometheus_client.CollectorRegistry()  # this replica's mirror, for /metrics
        local_values = {"model": model_name, **{key: self.identity[key] for key in LOCAL_LABELS[1:]}}

        def make(kind: str, name: str, doc: str, extra_tags: tuple[str, ...] = ()) -> _Metric:
            tag_keys = ("model", *extra_tags)
            if kind == "histogram":
                ray_metric = ray_metrics.Histogram(name, doc, boundaries=list(LATENCY_BUCKETS_S),
                                                   tag_keys=tag_keys)
                local = prometheus_client.Histogram(name, doc, [*LOCAL_LABELS, *extra_tags],
                                                    buckets=LATENCY_BUCKETS_S, registry=self.registry)
            else:
                ray_metric = getattr(ray_metrics, kind.capitalize())(name, doc, tag_keys=tag_keys)
                local = getattr(prometheus_client, kind.capitalize())(
                    name, doc, [*LOCAL_LABELS, *extra_tags], registry=self.registry)
            ray_metric.set_default_tags({"model": model_name})
            return _Metric(ray_metric, local, local_values, extra_tags)

        self.queue_depth = make("gauge", "blockserve_queue_depth", "Requests accepted and waiting for a row")
        self.running_rows = make("gauge", "blockserve_running_rows",
                                 "Rows in the batch after the last engine step")
        self.bounding_box_tokens = make("gauge", "blockserve_bounding_box_tokens",
                                        "rows x widest row materialized by the last engine step")
        self.effective_compute_ratio = make(
            "gauge", "blockserve_effective_compute_ratio",
            "Mean unfinished requests per batch slot over all denoising steps since start")
        self.tokens_per_s = make("gauge", "blockserve_tokens_per_second",
                                 "Generated tokens per second of engine time since start")
        self.loop_healthy = make("gauge", "blockserve_engine_loop_healthy", "1 while the engine loop serves")
        self.generated_tokens = make("counter", "blockserve_generated_tokens", "Tokens in finished outputs")
        self.steps = make("counter", "blockserve_steps", "Denoising steps run (one forward each)")
        self.requests = make("counter", "blockserve_requests", "Requests finished by the engine, by reason",
                             ("finish_reason",))
        self.rejected = make("counter", "blockserve_requests_rejected", "Requests refused (429): queue full")
        self.latency = make("histogram", "blockserve_request_latency_seconds", "Arrival to last block")
        self.time_to_first_block = make("histogram", "blockserve_time_to_first_block_seconds",
                                        "Arrival to the first committed block")
        self.queue_time = make("histogram", "blockserve_queue_seconds", "Arrival to admission into a row")
        self.loop_healthy.set(1)
        self._watcher: threading.Thread | None = None
        self._stop_watch = threading.Event()

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
            self.requests.inc(tags={"finish_reason": output.finish_reason})
            if output.token_ids:  # Ray's Counter refuses an increment of 0 (an answer that is just EOS)
                self.generated_tokens.inc(len(output.token_ids))
            self.latency.observe(output.finish_time - stream.arrival_time)
            if stream.first_scheduled_time is not None:
                self.queue_time.observe(stream.first_scheduled_time - stream.arrival_time)
                self.time_to_first_block.observe(stream.first_block_time - stream.arrival_time)

    # -- live gauges -------------------------------------------------------------------------------
    def refresh(self, loop: EngineLoop) -> None:
        """Set the gauges that must not wait for the next engine step (an idle or dead loop has none)."""
        self.queue_depth.set(loop.num_waiting)
        self.running_rows.set(loop.num_running)
        self.loop_healthy.set(loop.health_problem() is None)

    def watch(self, loop: EngineLoop, period_s: float = WATCH_PERIOD_S) -> ServeMetrics:
        """Refresh the live gauges every ``period_s`` on a daemon thread, while ``loop`` exists."""
        loop_ref = weakref.ref(loop)

        def run() -> None:
            while not self._stop_watch.wait(period_s):
                current = loop_ref()
                if current is None:
                    return
                try:
                    self.refresh(current)
                except Exception:  # pragma: no cover - metrics must never take the replica down
                    pass
                del current

        self._watcher = threading.Thread(target=run, name="blockserve-metrics-watch", daemon=True)
        self._watcher.start()
        return self

    def stop(self) -> None:
        self._stop_watch.set()

    # -- the replica's /metrics route --------------------------------------------------------------
    def exposition(self) -> bytes:
        """Prometheus text of THIS replica only (every sample carries its ``replica`` label)."""
        header = (f"# BlockServe metrics of ONE replica: replica=\"{self.identity['replica']}\" "
                  f"({self.identity['replica_full_id'] or 'not in Serve'}), model=\"{self.model_name}\".\n"
                  "# The whole deployment: Ray's metrics export (ray_blockserve_*, every replica tagged).\n")
        return header.encode() + prometheus_client.generate_latest(self.registry)
