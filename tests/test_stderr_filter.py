"""The job's stderr keeps every line but Ray's one known, harmless error line."""
from __future__ import annotations

import os

from pipeline.stderr_filter import benign_ray_lines_dropped

RAY_LINE = (b"[2026-12-02 16:11:32,011 E 2134 2134] core_worker.cc:2465: Actor with class name: 'MapWorker' and "
            b"ID: '3def' has constructor arguments in the object store and max_restarts > 0. If the arguments "
            b"in the object store go out of scope or are lost, the actor restart will fail.\n")


def test_ray_s_harmless_actor_start_line_is_dropped_and_every_other_line_kept(capfd):
    with benign_ray_lines_dropped():
        os.write(2, b"first line\n" + RAY_LINE)
        os.write(2, b"a real error, written in two")
        os.write(2, b" pieces\nlast line without a newline")
    assert capfd.readouterr().err == "first line\na real error, written in two pieces\nlast line without a newline"


def test_the_descriptor_is_restored_after_the_block(capfd):
    with benign_ray_lines_dropped():
        pass
    os.write(2, RAY_LINE)
    assert capfd.readouterr().err == RAY_LINE.decode()
