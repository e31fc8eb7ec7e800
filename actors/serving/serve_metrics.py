"""Metrics of one Serve replica, written once, to Ray: every replica exports them, tagged.

Every metric is a ``ray.serve.metrics`` Counter / Gauge / Histogram: each replica records into its own
Ray worker, the metrics agent of its node exports the samples in Prometheus text at that node's metrics
export port (``ray start --metrics-export-port``, or ``metrics_export_port`` in ``ray.nodes()``), and the
Prometheus / Grafana setup that scrapes a Ray cluster sees **every replica**. Ray prefixes the names with
``ray_`` (counters also get ``_total``) and Serve adds the tags ``application``, ``deployment`` and
``replica`` (the replica's unique id); we add ``model`` (the served model name), and ``finish_reason``
on ``ray_blockserve_requests_total``. Ray exports every few seconds (the metrics report interval), so a
fresh sample can take ~5-10 s to show up, and a counter appears there after its first increment.

The replica's ``GET /metrics`` route is a debugging aid for **one replica only**: :meth:`exported_text`
reads its node's export and keeps this replica's ``ray_blockserve_*`` samples (so it lags as the
export does), under a leading comment naming the replica. Behind Serve's load-balanced route each
request reaches a random replica, so scrape Ray's metrics export, not ``/metrics``, to monitor a
deployment.

Metrics (as Ray exports them):
``ray_blockserve_queue_depth``, ``ray_blockserve_running_rows``, ``ray_blockserve_bounding_box_tokens``,
``ray_blockserve_effective_compute_ratio``, ``ray_blockserve_tokens_per_second``,
``ray_blockserve_engine_loop_healthy``, ``ray_blockserve_prefix_cache_hit_rate`` (gauges);
``ray_blockserve_generated_tokens_total``, ``ray_blockserve_prompt_tokens_total``,
``ray_blockserve_cached_prompt_tokens_total``,
``ray_blockserve_steps_total``, ``ray_blockserve_requests_total{finish_reason}``,
``ray_blockserve_requests_rejected_total`` (429s),
``ray_blockserve_requests_invalid_total{param}`` (400s from the engine's admission check) (counters);
``ray_blockserve_request_latency_seconds``, ``ray_blockserve_time_to_first_block_seconds``,
``ray_blockserve_queue_seconds`` (histograms).
Gauges are set after every engine step and refreshed once a second by :meth:`ServeMetrics.watch`, so an
idle replica reports its live queue and a dead engine loop reports ``engine_loop_healthy 0``.
"""
from __future__ import annotations

import threading
import time
import urllib.request
import weakref
from typing import TYPE_CHECKING

from ray.serve import metrics as ray_metrics

from actors.engine_loop import StepSummary

if TYPE_CHECKING:
    from actors.engine_loop import EngineLoop

LATENCY_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
WATCH_PERIOD_S = 1.0
EXPORT_PREFIX = "ray_blockserve_"


def replica_identity() -> dict[str, str]:
    """application / deployment / replica of the calling Serve replica ("" outside Serve)."""
    from ray.serve.context import _get_internal_replica_context

    context = _get_internal_replica_context()
    if context is None:
        return {"application": "", "deployment": "", "replica": "", "replica_full_id": ""}
    return {"application": context.app_name or "", "deployment": context.deployment,
            "replica": context.replica_tag, "replica_full_id": context.replica_id.to_full_id_str()}


def _seconds(start: float, end: float) -> float:
    return max(end - start, 0.0)  # clocks of two threads: never a negative duration


class ServeMetrics:
    def __init__(self, model_name: str):
        self.model_name = model_name
        self.identity = replica_identity()

        def make(kind: str, name: str, doc: str, extra_tags: tuple[str, ...] = ()):
            options = {"boundaries": list(LATENCY_BUCKETS_S)} if kind == "Histogram" else {}
            metric = getattr(ray_metrics, kind)(name, doc, tag_keys=("model", *extra_tags), **options)
            metric.set_default_tags({"model": model_name})
            return metric

        self.queue_depth = make("Gauge", "blockserve_queue_depth", "Requests accepted and waiting for a row")
        self.running_rows = make("Gauge", "blockserve_running_rows",
                                 "Rows in the batch after the last engine step")
        self.bounding_box_tokens = make("Gauge", "blockserve_bounding_box_tokens",
                                        "rows x widest row materialized by the last engine step")
        self.effective_compute_ratio = make(
            "Gauge", "blockserve_effective_compute_ratio",
            "Mean unfinished requests per batch slot over all denoising steps since start")
        self.tokens_per_s = make("Gauge", "blockserve_tokens_per_second",
                                 "Generated tokens per second of engine time since start")
        self.tokens_per_forward = make("Gauge", "blockserve_tokens_per_forward",
                                       "Generated tokens per row forward since start (the rule's parallelism)")
        self.rule_counters = make("Gauge", "blockserve_rule_counter",
                                  "The decoding rule's own counts since start, by counter (DecodingRule.counters)",
                                  ("counter",))
        self.loop_healthy = make("Gauge", "blockserve_engine_loop_healthy", "1 while the engine loop serves")
        self.generated_tokens = make("Counter", "blockserve_generated_tokens", "Tokens in finished outputs")
        self.prompt_tokens = make("Counter", "blockserve_prompt_tokens", "Prompt tokens of finished requests")
        self.cached_prompt_tokens = make("Counter", "blockserve_cached_prompt_tokens",
                                         "Prompt tokens read from the prefix cache instead of computed")
        self.prefix_cache_hit_rate = make("Gauge", "blockserve_prefix_cache_hit_rate",
                                          "Cached over all prompt tokens of the requests finished so far")
        self.steps = make("Counter", "blockserve_steps", "Denoising steps run (one forward each)")
        self.requests = make("Counter", "blockserve_requests", "Requests finished by the engine, by reason",
                             ("finish_reason",))
        self.rejected = make("Counter", "blockserve_requests_rejected", "Requests refused (429): queue full")
        self.invalid = make("Counter", "blockserve_requests_invalid",
                            "Requests refused (400) by the engine's admission check, by the body field at fault",
                            ("param",))
        self.latency = make("Histogram", "blockserve_request_latency_seconds", "Arrival to last block")
        self.time_to_first_block = make("Histogram", "blockserve_time_to_first_block_seconds",
                                        "Arrival to the first committed block")
        self.queue_time = make("Histogram", "blockserve_queue_seconds", "Arrival to admission into a row")
        self.loop_healthy.set(1)

    def record_step(self, summary: StepSummary) -> None:
        """Called by the engine loop after every engine step (on the loop thread)."""
        self.queue_depth.set(summary.num_waiting)
        self.running_rows.set(summary.num_running)
        if summary.step.num_rows:
            self.steps.inc()
            self.bounding_box_tokens.set(summary.step.bounding_box_tokens)
        self.effective_compute_ratio.set(summary.stats.effective_compute_ratio)
        self.tokens_per_s.set(summary.stats.tokens_per_s)
        self.tokens_per_forward.set(summary.stats.tokens_per_forward)
        for name, count in summary.stats.counters.items():
            self.rule_counters.set(count, tags={"counter": name})
        self.prefix_cache_hit_rate.set(summary.stats.prefix_cache_hit_rate)
        for stream, output in summary.finished:
            self.requests.inc(tags={"finish_reason": output.finish_reason})
            for counter, count in ((self.generated_tokens, len(output.token_ids)),
                                   (self.prompt_tokens, len(output.prompt_token_ids)),
                                   (self.cached_prompt_tokens, output.num_cached_tokens)):
                if count:  # Ray's Counter refuses an increment of 0 (an answer that is just EOS)
                    counter.inc(count)
            self.latency.observe(_seconds(stream.arrival_time, output.finish_time))
            if stream.first_scheduled_time is not None:
                self.queue_time.observe(_seconds(stream.arrival_time, stream.first_scheduled_time))
                self.time_to_first_block.observe(_seconds(stream.arrival_time, stream.first_block_time))

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
            while (current := loop_ref()) is not None:
                try:
                    self.refresh(current)
                except Exception:  # pragma: no cover - metrics must never take the replica down
                    pass
                del current
                time.sleep(period_s)

        threading.Thread(target=run, name="blockserve-metrics-watch", daemon=True).start()
        return self

    # -- the replica's /metrics route --------------------------------------------------------------
    def exported_text(self, timeout_s: float = 5.0) -> str:
        """Prometheus text of THIS replica only, as its node's Ray metrics agent exports it (every
        sample carries this replica's ``replica`` tag). Blocking: a local HTTP request."""
        import ray

        node_id = ray.get_runtime_context().get_node_id()
        node = next(node for node in ray.nodes() if node["NodeID"] == node_id)
        url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            exported = response.read().decode()
        mine = f'replica="{self.identity["replica"]}"'
        lines = [line for line in exported.splitlines()
                 if line.startswith((f"# HELP {EXPORT_PREFIX}", f"# TYPE {EXPORT_PREFIX}"))
                 or (line.startswith(EXPORT_PREFIX) and mine in line)]
        header = (f"# BlockServe metrics of ONE replica: replica=\"{self.identity['replica']}\" "
                  f"({self.identity['replica_full_id'] or 'not in Serve'}), model=\"{self.model_name}\", "
                  "as Ray's metrics export of its node shows them (a few seconds behind).\n"
                  "# The whole deployment: Ray's metrics export (ray_blockserve_*, every replica tagged).\n")
        return header + "\n".join(lines) + "\n"
