"""A failed job's one-line message: Ray's wrapper line and the remote exception that caused it."""
from __future__ import annotations

import re

ROOT_CAUSE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")


class JobFailedError(RuntimeError):
    """The dataset failed part-way; ``deaths`` are the actor deaths the registry saw until then."""

    def __init__(self, error: Exception, deaths: list[dict]):
        super().__init__(f"{_first_line(error)}{_root_cause(error)}")
        self.error, self.deaths = error, deaths


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {next(iter(str(error).splitlines()), '')}"


def _root_cause(error: BaseException) -> str:
    """`` caused by <the first exception of its chain>`` for a remote error: Ray's task errors carry the
    actor's traceback as text, its first exception line being the cause."""
    for line in str(error).splitlines():
        line = line.strip()
        if ROOT_CAUSE.match(line) and not line.startswith("ray.exceptions."):
            return f" caused by {line}"
    return ""
