"""The experiments CLI that ``python -m benchmarks`` and ``python -m research`` share.

Each experiment is an :class:`Experiment`: its module (whose ``main(argv)`` runs it), its own arguments
per ``--scale``, how it takes ``--out`` and whether it takes ``--device``. A CLI is a table of them.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

SCALES = ("smoke", "quick", "full")


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
    """One experiment of a CLI: its module (whose ``main(argv)`` runs it) and how the shared options
    reach it. ``out`` None: it prints its results and takes no ``--out``."""

    module: str
    scale_args: ScaleArgs
    out: OutArg | None
    takes_device: bool
    summary: str  # one line of the CLI's ``--help``


def describe(template: str, experiments: dict[str, Experiment], prog: str) -> str:
    """A CLI's help: ``template`` (its module docstring) with the experiments listed from their summaries."""
    usage, _, shared = template.partition("\n\n")
    width = max(map(len, experiments))
    listed = "\n".join(f"    {name:<{width}}  {experiment.summary}" for name, experiment in experiments.items())
    return (f"{usage}\n\nExperiments (``{prog} <experiment> --help`` lists each one's own "
            f"options):\n\n{listed}\n\n{shared}")


def translate(experiments: dict[str, Experiment], experiment: str, scale: str | None, device: str | None,
              out: Path | None, rest: list[str]) -> tuple[str, list[str]]:
    """The experiment's module and the arguments its own ``main`` takes."""
    chosen = experiments[experiment]
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


def run(experiments: dict[str, Experiment], prog: str, description: str, argv: list[str] | None = None):
    """Parse the shared options, then run the named experiment's ``main`` with its own arguments."""
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = argv or ["--help"]
    parser = argparse.ArgumentParser(prog=prog, description=description, add_help=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if argv[0] not in experiments:  # no experiment named: this help (an experiment's --help is its own)
        parser.add_argument("-h", "--help", action="help")
    parser.add_argument("experiment", choices=sorted(experiments))
    parser.add_argument("--scale", choices=SCALES, default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args, rest = parser.parse_known_args(argv)
    out_arg = experiments[args.experiment].out
    if out_arg is not None and out_arg.required and args.out is None:
        parser.error(f"{args.experiment} needs --out DIR (everything it writes goes there)")
    module, forwarded = translate(experiments, args.experiment, args.scale, args.device, args.out, rest)
    return importlib.import_module(module).main(forwarded)


@dataclass(frozen=True)
class Commands:
    """One CLI of experiments (``python -m benchmarks``, ``python -m research``): its help, its
    translation of the shared options, and its entry point."""

    experiments: dict[str, Experiment]
    template: str  # the module's docstring as written
    prog: str

    def describe(self) -> str:
        return describe(self.template, self.experiments, self.prog)

    def translate(self, experiment: str, scale: str | None, device: str | None, out: Path | None,
                  rest: list[str]) -> tuple[str, list[str]]:
        return translate(self.experiments, experiment, scale, device, out, rest)

    def main(self, argv: list[str] | None = None):
        return run(self.experiments, self.prog, self.describe(), argv)
