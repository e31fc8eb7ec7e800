"""A convicted batch's rows, retried in smaller groups so that only the rows that kill the actor are flagged.

A batch convicted by the :class:`~actors.ray_data.batch_deaths.DeathLedger` is not flagged whole. Its
rows run again in halves, each alone in the engine; a group that ends the actor's process is split in
halves in its turn, down to single rows. A row flagged this way ended the process each time it was being
generated, the last time with no other row beside it. A row that never ends it is generated.

One poison row in a batch of ``n`` rows costs ``log2(n)`` more deaths: one per level of halving.
``max_isolation_deaths`` caps the deaths of one batch's isolation; at the cap, the rows not generated
yet are flagged. The state lives in the job's registry, since each death ends the actor that ran it:

    batch of 16, row 13 kills:  [0-7] ok  [8-15] dies  [8-11] ok  [12-15] dies
                                [12-13] dies  [12] ok  [13] dies: flagged  [14-15] ok
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class RowGroup:
    """Rows ``[start, end)`` of a convicted batch, and the deaths of the actor's process they were all
    present in (the batch's own deaths included)."""

    start: int
    end: int
    deaths: int
    last_cause: str

    @property
    def size(self) -> int:
        return self.end - self.start

    def rows_label(self, batch_label: str) -> str:
        rows = f"row {self.start}" if self.size == 1 else f"rows {self.start}-{self.end - 1}"
        return f"{rows} of {batch_label}"

    def halves(self) -> list[RowGroup]:
        middle = self.start + self.size // 2
        return [RowGroup(self.start, middle, self.deaths, self.last_cause),
                RowGroup(middle, self.end, self.deaths, self.last_cause)]

    def died(self, cause: str) -> RowGroup:
        return RowGroup(self.start, self.end, self.deaths + 1, cause)


def flag_message(group: RowGroup, batch_label: str, max_deaths: int) -> str:
    """The error of each row of a group that is not generated."""
    if group.size == 1:
        return (f"the actor's process died all {group.deaths} times this row was being generated, the "
                f"last time with no other row ({group.rows_label(batch_label)}); last cause: {group.last_cause}")
    return (f"the actor's process died all {group.deaths} times this row was being generated, each time "
            f"beside others of {group.rows_label(batch_label)}; their isolation stopped at "
            f"max_isolation_deaths ({max_deaths}); last cause: {group.last_cause}")


@dataclass
class Isolation:
    """One convicted batch's groups: those still to run (the next first), the one running, and the
    output rows and errors of the rows already settled, by their index in the batch."""

    label: str
    num_rows: int
    max_deaths: int
    pending: list[RowGroup]
    started_at: float = field(default_factory=time.time)
    running: RowGroup | None = None
    deaths: int = 0
    outputs: dict[int, dict[str, Any]] = field(default_factory=dict)
    flagged: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of_batch(cls, label: str, num_rows: int, deaths: int, last_cause: str, max_deaths: int) -> Isolation:
        whole = RowGroup(0, num_rows, deaths, last_cause)
        isolation = cls(label, num_rows, max_deaths, whole.halves() if num_rows > 1 else [])
        if num_rows == 1:
            isolation.flag(whole)
        return isolation

    def next_group(self) -> RowGroup | None:
        """The group to run now, marked running; None once every row is settled."""
        if self.running is not None:  # its run ended without a death charged: run it again
            self.pending.insert(0, self.running)
        self.running = self.pending.pop(0) if self.pending else None
        return self.running

    def group_finished(self, outputs: list[dict[str, Any]]) -> None:
        group, self.running = self.running, None
        if group is not None:
            self.outputs.update(zip(range(group.start, group.end), outputs))

    def group_died(self, cause: str) -> None:
        """Split the running group (a single row is flagged); at ``max_deaths``, flag every row left."""
        group, self.running = self.running.died(cause), None
        self.deaths += 1
        if self.deaths >= self.max_deaths:
            for left in [group, *self.pending]:
                self.flag(left)
            self.pending = []
        elif group.size == 1:
            self.flag(group)
        else:
            self.pending[:0] = group.halves()

    def flag(self, group: RowGroup) -> None:
        message = flag_message(group, self.label, self.max_deaths)
        self.flagged.update((index, message) for index in range(group.start, group.end))

    def report(self) -> dict[str, Any]:
        """What the job's summary says of it: rows generated and flagged, deaths and the seconds it took."""
        finished_at = time.time()
        return {"batch": self.label, "rows": self.num_rows, "rows_generated": len(self.outputs),
                "rows_flagged": len(self.flagged), "deaths": self.deaths, "started_at": self.started_at,
                "finished_at": finished_at, "wait_s": finished_at - self.started_at}
