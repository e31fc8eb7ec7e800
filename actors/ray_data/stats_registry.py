"""Where BlockServeActors leave their stats for the driver: one small named Ray actor per job.

Each BlockServeActor instance reports a full snapshot (not a delta) after every batch it completes and
waits for the report to land before returning the batch, so when the dataset has been consumed the
registry already holds every actor's final numbers. Snapshots are keyed by the actor *instance*: an actor
that Ray restarted after a crash keeps its actor id but starts a fresh engine, and the driver adds the
instances up (see ``pipeline.stats``). It also keeps the job's :class:`~actors.ray_data.batch_deaths.DeathLedger`:
which actor instances died, why, and which batches each was running, and the groups of each convicted
batch whose rows are being isolated.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import ray

from actors.ray_data.batch_deaths import BatchIdentity, BatchRecord, DeathLedger
from actors.ray_data.batch_isolation import RowGroup


@ray.remote(num_cpus=0)
class StatsRegistry:
    def __init__(self) -> None:
        self._snapshots: dict[str, dict] = {}
        self._ledger = DeathLedger()

    def report(self, snapshot: dict) -> None:
        key = snapshot["instance_id"]
        previous = self._snapshots.get(key)
        if previous is None or previous["sequence"] < snapshot["sequence"]:
            self._snapshots[key] = snapshot

    def collect(self) -> list[dict]:
        return list(self._snapshots.values())

    def instance_started(self, actor_id: str, instance_id: str, restarted: bool) -> None:
        self._ledger.instance_started(actor_id, instance_id, restarted)

    def instance_died(self, actor_id: str, instance_id: str, cause: str) -> None:
        self._ledger.instance_died(actor_id, instance_id, cause)

    def batch_record(self, batch: BatchIdentity) -> BatchRecord:
        return self._ledger.batch_record(batch)

    def batch_started(self, instance_id: str, batch: BatchIdentity) -> None:
        self._ledger.batch_started(instance_id, batch)

    def batch_finished(self, instance_id: str, batch_key: str) -> None:
        self._ledger.batch_finished(instance_id, batch_key)

    def next_group(self, instance_id: str, batch: BatchIdentity, num_rows: int, max_deaths: int) -> RowGroup | None:
        return self._ledger.next_group(instance_id, batch, num_rows, max_deaths)

    def group_finished(self, instance_id: str, batch_key: str, outputs: list[dict]) -> None:
        self._ledger.group_finished(instance_id, batch_key, outputs)

    def isolation_result(self, batch_key: str) -> tuple[dict[int, dict], dict[int, str]]:
        return self._ledger.isolation_result(batch_key)

    def deaths(self) -> list[dict]:
        return self._ledger.death_reports()

    def isolations(self) -> list[dict]:
        """The reports of the convicted batches whose isolation finished."""
        return list(self._ledger.isolated)


class RegistryClient:
    """An actor instance's calls to the job's registry, by its name. ``report`` and the batch calls
    return once the registry has the news, so a finished dataset means a complete registry."""

    def __init__(self, registry_name: str, actor_id: str, instance_id: str):
        self.registry_name, self.actor_id, self.instance_id = registry_name, actor_id, instance_id
        self._registry = None

    @property
    def registry(self) -> ray.actor.ActorHandle:
        if self._registry is None:
            self._registry = ray.get_actor(self.registry_name)
        return self._registry

    def instance_started(self, restarted: bool) -> None:
        ray.get(self.registry.instance_started.remote(self.actor_id, self.instance_id, restarted))

    def instance_died(self, cause: str, timeout_s: float = 10.0) -> None:
        """Blocking, from the dying thread; a registry that does not answer in time is skipped."""
        try:
            ray.get(self.registry.instance_died.remote(self.actor_id, self.instance_id, cause), timeout=timeout_s)
        except Exception as error:  # dying anyway: the restarted instance reports it without a cause
            logging.getLogger(__name__).warning("could not report this instance's death: %s", error)

    async def report(self, snapshot: dict[str, Any]) -> None:
        await self._call(self.registry.report, snapshot)

    async def batch_record(self, batch: BatchIdentity) -> BatchRecord:
        return await self._call(self.registry.batch_record, batch)

    async def batch_started(self, batch: BatchIdentity) -> None:
        await self._call(self.registry.batch_started, self.instance_id, batch)

    async def batch_finished(self, batch_key: str) -> None:
        await self._call(self.registry.batch_finished, self.instance_id, batch_key)

    async def next_group(self, batch: BatchIdentity, num_rows: int, max_deaths: int) -> RowGroup | None:
        return await self._call(self.registry.next_group, self.instance_id, batch, num_rows, max_deaths)

    async def group_finished(self, batch_key: str, outputs: list[dict[str, Any]]) -> None:
        await self._call(self.registry.group_finished, self.instance_id, batch_key, outputs)

    async def isolation_result(self, batch_key: str) -> tuple[dict[int, dict], dict[int, str]]:
        return await self._call(self.registry.isolation_result, batch_key)

    @staticmethod
    async def _call(method, *args: Any) -> Any:
        return await asyncio.wrap_future(method.remote(*args).future())


def start_stats_registry(name: str) -> ray.actor.ActorHandle:
    """A registry reachable by ``name`` from the job's actors (it lives as long as the driver)."""
    return StatsRegistry.options(name=name).remote()
