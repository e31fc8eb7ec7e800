"""Which batches were in the engine when an actor died, so a batch that kills it every time ends.

Ray restarts a dead actor and retries the batches it held; a batch that kills the engine on every try
(a device fault on one shape, a crash below Python) would loop for as long as Ray retries. The job's
registry keeps a :class:`DeathLedger`: each actor instance says which batches it runs, and a death
charges every batch that was running on the dead instance. A batch charged once runs alone when it
comes back (:class:`BatchGate`), so a second death convicts it and not its neighbours. At
``max_batch_deaths`` charges the batch is convicted. Its rows are retried in smaller groups until the
rows that kill the actor are found (:mod:`actors.ray_data.batch_isolation`): while that runs, a death is
charged to the group that was running, not to the batch. With ``max_isolation_deaths`` 0, or
``should_continue_on_error=False``, a convicted batch is not run again: its rows get an error naming
the cause, or the job fails with that message.

An instance that dies reports its cause first when it can (the engine loop raised, or stalled). A
process killed outright reports nothing; the restarted instance of the same actor tells the ledger.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any

from actors.ray_data.batch_isolation import Isolation, RowGroup

UNREPORTED_CAUSE = "the actor's process ended without reporting an error (killed, or a crash below Python)"


@dataclass(frozen=True)
class BatchIdentity:
    """The same batch on every retry: a digest of its rows, and a few words a person recognises."""

    key: str
    label: str


def batch_identity(rows: list[dict[str, Any]]) -> BatchIdentity:
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]
    first = rows[0].get("messages") or rows[0].get("prompt") if rows else None
    if isinstance(first, list) and first and isinstance(first[-1], dict):
        first = first[-1].get("content")
    text = str(first) if first is not None else ""
    text = text if len(text) <= 40 else text[:37] + "..."
    return BatchIdentity(digest, f"batch {digest} ({len(rows)} rows, the first {text!r})")


@dataclass(frozen=True)
class ActorDeath:
    actor_id: str
    instance_id: str
    cause: str
    batches: tuple[str, ...]  # labels of the batches it was running
    reported_at: float


@dataclass
class BatchRecord:
    label: str
    deaths: int = 0
    last_cause: str = ""


@dataclass
class DeathLedger:
    """Actor deaths and the batches each one was running (plain data: the registry actor holds one)."""

    instances: dict[str, str] = field(default_factory=dict)  # instance id -> actor id
    running: dict[str, dict[str, str]] = field(default_factory=dict)  # instance -> batch key -> label
    batches: dict[str, BatchRecord] = field(default_factory=dict)
    deaths: list[ActorDeath] = field(default_factory=list)
    isolations: dict[str, Isolation] = field(default_factory=dict)  # convicted batch key -> its groups
    isolated: list[dict[str, Any]] = field(default_factory=list)  # the reports of finished isolations

    def instance_started(self, actor_id: str, instance_id: str, restarted: bool) -> None:
        """A restarted actor: its earlier instances that did not report their death died silently."""
        if restarted:
            for earlier, owner in list(self.instances.items()):
                if owner == actor_id and earlier in self.running:
                    self.instance_died(actor_id, earlier, UNREPORTED_CAUSE)
        self.instances[instance_id] = actor_id

    def instance_died(self, actor_id: str, instance_id: str, cause: str) -> None:
        running = self.running.pop(instance_id, {})
        for key in running:
            if key in self.isolations:
                self.isolations[key].group_died(cause)
                continue
            record = self.batches[key]
            record.deaths += 1
            record.last_cause = cause
        self.deaths.append(ActorDeath(actor_id, instance_id, cause, tuple(running.values()), time.time()))

    def batch_record(self, batch: BatchIdentity) -> BatchRecord:
        """A copy of what the batch was charged with so far."""
        record = self.batches.get(batch.key, BatchRecord(batch.label))
        return BatchRecord(record.label, record.deaths, record.last_cause)

    def batch_started(self, instance_id: str, batch: BatchIdentity) -> None:
        self.batches.setdefault(batch.key, BatchRecord(batch.label))
        self.running.setdefault(instance_id, {})[batch.key] = batch.label

    def batch_finished(self, instance_id: str, batch_key: str) -> None:
        """A finished batch is not coming back: its record goes (a long job keeps no record per batch)."""
        self.running.get(instance_id, {}).pop(batch_key, None)
        self.batches.pop(batch_key, None)
        if (isolation := self.isolations.pop(batch_key, None)) is not None:
            self.isolated.append(isolation.report())

    def next_group(self, instance_id: str, batch: BatchIdentity, num_rows: int, max_deaths: int) -> RowGroup | None:
        """The convicted batch's next group, running on this instance from now on (its death is the
        group's); None once every row is generated or flagged. The first call starts the isolation."""
        isolation = self.isolations.get(batch.key)
        if isolation is None:
            record = self.batch_record(batch)
            isolation = Isolation.of_batch(batch.label, num_rows, record.deaths, record.last_cause, max_deaths)
            self.isolations[batch.key] = isolation
        group = isolation.next_group()
        if group is not None:
            self.running.setdefault(instance_id, {})[batch.key] = group.rows_label(batch.label)
        return group

    def group_finished(self, instance_id: str, batch_key: str, outputs: list[dict[str, Any]]) -> None:
        self.running.get(instance_id, {}).pop(batch_key, None)
        self.isolations[batch_key].group_finished(outputs)

    def isolation_result(self, batch_key: str) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
        """The output rows of the generated rows, and the errors of the flagged ones, by row index."""
        isolation = self.isolations[batch_key]
        return dict(isolation.outputs), dict(isolation.flagged)

    def death_reports(self) -> list[dict[str, Any]]:
        return [asdict(death) for death in self.deaths]


def refusal_message(record: BatchRecord) -> str:
    return (f"{record.label} was running in {record.deaths} engine deaths and is not run again; "
            f"last cause: {record.last_cause}")


class BatchGate:
    """Batches share the engine, except one that was running when an actor died: it waits for the
    engine to empty and runs alone."""

    def __init__(self) -> None:
        self._condition = asyncio.Condition()
        self._running = 0
        self._alone = False
        self._waiting_alone = 0

    @contextlib.asynccontextmanager
    async def enter(self, alone: bool) -> AsyncIterator[None]:
        async with self._condition:
            if alone:
                self._waiting_alone += 1
                await self._condition.wait_for(lambda: self._running == 0)
                self._waiting_alone -= 1
                self._alone = True
            else:
                await self._condition.wait_for(lambda: not self._alone and not self._waiting_alone)
            self._running += 1
        try:
            yield
        finally:
            async with self._condition:
                self._running -= 1
                self._alone = self._alone and not alone
                self._condition.notify_all()
