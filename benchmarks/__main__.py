"""One benchmarks CLI: ``python -m benchmarks <experiment> [--scale smoke|quick|full] [--device D] [--out DIR]``.

``--scale``, ``--device`` and ``--out`` mean the same everywhere; each experiment maps the scale onto
its own sizes (``EXPERIMENTS`` below) and writes its results under ``--out``. The research experiments
have a CLI of their own: ``python -m research --help``.
"""
from __future__ import annotations

from benchmarks import cli
from benchmarks.cli import SCALE_FLAG, Experiment, OutArg, ScaleArgs

PROG = "python -m benchmarks"
TEMPLATE = __doc__ or ""  # the docstring as written; ``__doc__`` becomes it with the experiments listed

EXPERIMENTS: dict[str, Experiment] = {
    "throughput": Experiment("benchmarks.throughput", SCALE_FLAG, cli.OUT_DIR, True,
                             "continuous/block_sync/static/shrink on the replays: CPU measured, H200 projected "
                             "(host model)"),
    "gpu": Experiment("benchmarks.gpu", ScaleArgs(("--smoke",), ("--requests", "32")), OutArg(required=True), False,
                      "the one prepared GPU run (``--smoke``: the same path on the CPU, CI)"),
    "host-model": Experiment("benchmarks.measure_host", ScaleArgs(smoke=("--deep-layers", "4")), None, True,
                             "measure the host model on --device and write benchmarks/calibration/host-<device>.json"),
    "host-ops": Experiment("benchmarks.host_ops", ScaleArgs(("--prompts", "4"), ("--prompts", "8")), None, False,
                           "aten operations per engine step, per layer and fixed"),
    "exactness": Experiment("benchmarks.exactness", ScaleArgs(("--prompts", "4"), ("--prompts", "16")),
                            OutArg("--out", "exactness.json"), False,
                            "batched == solo share per family, dtype, rule, cache"),
    "serve-load": Experiment("benchmarks.serve_load", ScaleArgs(("--requests", "8", "--load", "1.0"), ("--quick",)),
                             OutArg("--out", "serve_load.json"), True,
                             "online serving: continuous vs block_sync vs static loops under Poisson arrivals"),
}


COMMANDS = cli.Commands(EXPERIMENTS, TEMPLATE, PROG)
describe, translate, main = COMMANDS.describe, COMMANDS.translate, COMMANDS.main
__doc__ = describe()


if __name__ == "__main__":
    main()
