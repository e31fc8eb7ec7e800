"""A batch is in the job's death ledger before any code of the actor runs on it.

Ray retries the batches of an actor whose process died, as long as ``max_task_retries`` allows, by
whatever name the failure comes (``ActorDiedError``, or ``ActorUnavailableError`` when the connection
broke first). A batch that kills its actor on every try uses up those retries and fails the job,
unless the :class:`~actors.ray_data.batch_deaths.DeathLedger` convicts it first. The ledger only
charges batches it knew were running, so each batch is recorded before anything that could end the
process: the actor's own code, or a subclass's.

Each door of the actor (``__call__``, ``generate_rows``) is wrapped by :func:`admitting`, and so is a
subclass's override of one (:func:`wrap_overridden_doors`, from ``__init_subclass__``). The wrapper
looks the batch up, waits at the :class:`~actors.ray_data.batch_deaths.BatchGate`, records the batch
as running, and only then calls the door. A door called from inside another (a subclass's
``generate_rows`` calling the base's) finds its batch admitted already and runs as it is.

After ``max_batch_deaths`` charges the batch is convicted. Its rows then go through the same door in
smaller groups, one at a time and alone in the engine, each recorded as running before the door's code
(:mod:`actors.ray_data.batch_isolation`). A death at a door's entry is thus charged to the group, as a
death in the engine is. The door's answer holds every row: generated, or flagged with its own error.
"""
from __future__ import annotations

import contextvars
import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from actors.ray_data.actor_config import ActorConfig
from actors.ray_data.batch_deaths import BatchGate, BatchIdentity, batch_identity, refusal_message
from actors.ray_data.stats_registry import RegistryClient

Rows = list[dict[str, Any]]


class AdmittingActor(Protocol):
    """What admission needs of a BlockServeActor."""

    config: ActorConfig
    registry: RegistryClient | None
    gate: BatchGate

    async def refuse(self, rows: Rows, messages: list[str]) -> Rows:
        """The output rows of rows that are not run, each with its message as its error."""


DoorMethod = Callable[[AdmittingActor, Any], Awaitable[Any]]

# per asyncio task, so per batch: the batches of one actor run side by side on its event loop
ADMITTED: contextvars.ContextVar[bool] = contextvars.ContextVar("blockserve_batch_admitted", default=False)
DOOR_ATTRIBUTE = "_blockserve_door"  # marks a method that is wrapped already


@dataclass(frozen=True)
class Door:
    """How one entry point of the actor reads its argument's rows, answers with a batch's output rows in
    its own shape (a refused or isolated batch is answered so), and runs part of a batch."""

    rows: Callable[[Any, Any], Rows]  # (actor, the door's argument) -> its row dicts
    answer: Callable[[Any, Any, Rows], Any]  # (actor, the door's argument, output rows) -> the door's result
    part: Callable[[Any, Any, int, int], Any]  # (actor, argument, start, end) -> the argument of those rows
    outputs: Callable[[Any, Any], Rows]  # (actor, the door's result) -> its output rows


def admitting(door: Door) -> Callable[[DoorMethod], DoorMethod]:
    """Decorate a door method so that its batch is admitted (:func:`admit`) before the method runs."""

    def wrap(method: DoorMethod) -> DoorMethod:
        @functools.wraps(method)
        async def admitted(actor: AdmittingActor, argument: Any) -> Any:
            if actor.registry is None or ADMITTED.get():
                return await method(actor, argument)
            return await admit(actor, door, method, argument)

        setattr(admitted, DOOR_ATTRIBUTE, door)
        return admitted

    return wrap


def wrap_overridden_doors(cls: type, doors: dict[str, Door]) -> None:
    """Give a subclass's own ``__call__`` or ``generate_rows`` the admission of the base's door."""
    for name, door in doors.items():
        method = vars(cls).get(name)
        if method is None or getattr(method, DOOR_ATTRIBUTE, None) is not None:
            continue
        if not inspect.iscoroutinefunction(method):
            raise TypeError(f"{cls.__name__}.{name} must be a coroutine function (async def), as the base's is")
        setattr(cls, name, admitting(door)(method))


async def admit(actor: AdmittingActor, door: Door, method: DoorMethod, argument: Any) -> Any:
    """The batch as the registry's ledger allows: isolated (or refused) after ``max_batch_deaths``
    charges, alone after one, beside other batches otherwise; running in the ledger from before the
    door's code."""
    rows = door.rows(actor, argument)
    batch = batch_identity(rows)
    record = await actor.registry.batch_record(batch)
    if record.deaths >= actor.config.max_batch_deaths:
        if not actor.config.isolates_rows:
            return door.answer(actor, argument, await actor.refuse(rows, [refusal_message(record)] * len(rows)))
        return door.answer(actor, argument, await isolate(actor, door, method, argument, batch, rows))
    async with actor.gate.enter(alone=record.deaths > 0):
        await actor.registry.batch_started(batch)
        token = ADMITTED.set(True)
        try:
            return await method(actor, argument)
        finally:  # not reached when the process ends: the batch stays running in the ledger
            ADMITTED.reset(token)
            await actor.registry.batch_finished(batch.key)


async def isolate(actor: AdmittingActor, door: Door, method: DoorMethod, argument: Any, batch: BatchIdentity,
                  rows: Rows) -> Rows:
    """A convicted batch's output rows: its groups run through the door alone, one at a time, until
    the ledger has every row generated or flagged. A death ends this call; Ray's retry goes on."""
    async with actor.gate.enter(alone=True):
        try:
            while (group := await actor.registry.next_group(batch, len(rows),
                                                            actor.config.max_isolation_deaths)) is not None:
                token = ADMITTED.set(True)
                try:
                    result = await method(actor, door.part(actor, argument, group.start, group.end))
                finally:
                    ADMITTED.reset(token)
                await actor.registry.group_finished(batch.key, door.outputs(actor, result))
            generated, flagged = await actor.registry.isolation_result(batch.key)
            indices = sorted(flagged)
            errors = await actor.refuse([rows[i] for i in indices], [flagged[i] for i in indices]) if indices else []
        finally:  # not reached when the process ends: the group stays running in the ledger
            await actor.registry.batch_finished(batch.key)
    settled = {**generated, **dict(zip(indices, errors))}
    return [settled[index] for index in range(len(rows))]
