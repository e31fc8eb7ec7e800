"""Drop one known, harmless Ray error line from the job's stderr, so a healthy run prints no error.

Ray Data passes object references to every actor it starts, and Ray's core worker then logs an
``E ... core_worker.cc`` line about restarts at each actor start (ray-project/ray#57733, open). The
line comes from C++ and writes to file descriptor 2 directly, so Python's logging cannot filter it:
:func:`benign_ray_lines_dropped` routes descriptor 2 through a pipe and forwards every other line.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
from collections.abc import Iterator

BENIGN_RAY_LINES = (re.compile(rb"has constructor arguments in the object store and max_restarts > 0"),)


@contextlib.contextmanager
def benign_ray_lines_dropped(patterns: tuple[re.Pattern, ...] = BENIGN_RAY_LINES) -> Iterator[None]:
    """Within the block, lines written to descriptor 2 that match ``patterns`` are dropped."""
    sys.stderr.flush()
    original = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    forwarder = threading.Thread(target=_forward, args=(read_end, original, patterns), daemon=True,
                                 name="stderr-filter")
    forwarder.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # the pipe's last writer goes, so the forwarder reads its end and stops
        forwarder.join(timeout=5)
        if not forwarder.is_alive():
            os.close(original)


def _forward(read_end: int, destination: int, patterns: tuple[re.Pattern, ...]) -> None:
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            _write(destination, [line + b"\n" for line in lines], patterns)
        _write(destination, [pending] if pending else [], patterns)


def _write(destination: int, lines: list[bytes], patterns: tuple[re.Pattern, ...]) -> None:
    kept = memoryview(b"".join(line for line in lines if not any(p.search(line) for p in patterns)))
    while kept:
        kept = kept[os.write(destination, kept):]
