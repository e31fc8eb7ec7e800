"""Where BlockServeActors leave their stats for the driver: one small named Ray actor per job.

Each BlockServeActor instance reports a full snapshot (not a delta) after every batch it completes and
waits for the report to land before returning the batch, so when the dataset has been consumed the
registry already holds every actor's final numbers. Snapshots are keyed by the actor *instance*: an actor
that Ray restarted after a crash keeps its actor id but starts a fresh engine, and the driver adds the
instances up (see ``pipeline.stats``).
"""
from __future__ import annotations

import ray


@ray.remote(num_cpus=0)
class StatsRegistry:
    def __init__(self) -> None:
        self._snapshots: dict[str, dict] = {}

    def report(self, snapshot: dict) -> None:
        key = snapshot["instance_id"]
        previous = self._snapshots.get(key)
        if previous is None or previous["sequence"] < snapshot["sequence"]:
            self._snapshots[key] = snapshot

    def collect(self) -> list[dict]:
        return list(self._snapshots.values())


def start_stats_registry(name: str) -> ray.actor.ActorHandle:
    """A registry reachable by ``name`` from the job's actors (it lives as long as the driver)."""
    return StatsRegistry.options(name=name).remote()
