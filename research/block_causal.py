"""Block-causal families on the HumanEval replay, priced as SDAR-8B-Chat and LLaDA2.0-mini on an H200.

    python -m research block-causal --scale full --out benchmarks/results/block_causal
    python -m research block-causal --scale smoke --out /tmp/block-causal          # seconds (CI)

Each family runs the steered HumanEval replay (``benchmarks.replay``: real answer and prompt lengths,
the commit profile) on a replay model of its own family, with its own decoding (``configs/*.yaml``):
SDAR blocks of 4, 4 steps, ``low_confidence_dynamic`` at 0.9; LLaDA2 blocks of 32, 32 steps, at 0.95.
Our ``continuous`` schedule runs at each batch size and at batch 1. The family's own generate loop at
batch 1 is derived from the batch-1 run's trace (``research.own_generate``): the same steps, its own
forwards. Each trace is priced for the family's real shape on an H200 (``benchmarks.perfmodel``).

* SDAR's replay model is the ``tiny-sdar`` fixture.
* LLaDA2's has the ``tiny-llada2`` fixture's widths and LLaDA2.0-mini's routing: 256 experts, 8 a
  token, 8 groups of which 4 are kept. Its routers and experts are drawn at random, with no expert
  bias. Each forward's distinct experts per MoE layer (``model.experts_touched()``) price its expert
  reads. This assumes the real router spreads a forward's tokens as this random one does.
* The host model counts the operations of the replay model's steps at two depths, per kind of step.
  It takes seconds per operation and the step gap from a host-model file (``--host-model``).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from benchmarks.perfmodel.hardware import MODELS
from benchmarks.perfmodel.host_model import CALIBRATION_DIR, KINDS, HostModel
from benchmarks.perfmodel.moe import scaled_experts_touched
from benchmarks.perfmodel.projection import load_constants, project
from benchmarks.results_io import write_results
from research.own_generate import OWN_GENERATE, carried_experts

HOST_FILE = CALIBRATION_DIR / "host-cpu.json"
SCALES = {"smoke": {"requests": 6, "batch_sizes": "4"}, "quick": {"requests": 48, "batch_sizes": "16"},
          "full": {"requests": 164, "batch_sizes": "16,64"}}
COUNT_DEPTHS = (2, 6)  # layers of the replay models whose operations the host model counts
ENGINE_ONE = "engine, batch 1"  # continuous at batch 1: a batch-1 loop with the engine's steps
OWN_ONE = "own generate, batch 1"  # the family's own loop, derived from ENGINE_ONE's trace


@dataclass(frozen=True)
class Family:
    fixture: str
    shape: str  # a key of benchmarks.perfmodel.hardware.MODELS
    engine: dict  # EngineConfig fields: the family's own decoding (configs/<model>.yaml)
    routing: dict | None = None  # MoEConfig fields replaced in the replay model


FAMILIES = {
    "sdar-8b": Family("tiny-sdar", "sdar-8b", {"block_length": 4, "decoding": "low_confidence_dynamic",
                                               "steps_per_block": 4, "threshold": 0.9}),
    "llada2-mini": Family("tiny-llada2", "llada2-mini",
                          {"block_length": 32, "decoding": "low_confidence_dynamic", "steps_per_block": 32,
                           "threshold": 0.95},
                          {"num_experts": 256, "experts_per_token": 8, "n_group": 8, "topk_group": 4}),
}


def replay_model(family: Family, layers: int | None = None, seed: int = 0):
    """The family's fixture with its routing replaced and ``layers`` layers (None: the fixture's). Weights
    the fixture has are kept; new ones are drawn (normal, std 1/sqrt(fan-in); norms 1; expert bias 0)."""
    import torch

    from benchmarks.host_ops import FIXTURES
    from engine.models import load_model
    from engine.models.transformer import BidirectionalTransformer

    lm = load_model(FIXTURES / family.fixture, dtype="float32")
    if family.routing is None and layers is None:
        return lm
    config = lm.model.config
    moe = dataclasses.replace(config.moe, **family.routing) if family.routing else config.moe
    config = dataclasses.replace(config, moe=moe, num_layers=layers or config.num_layers)
    model = BidirectionalTransformer(config).eval().requires_grad_(False)
    fixture = lm.model.state_dict()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if name in fixture and fixture[name].shape == tensor.shape:
                tensor.copy_(fixture[name])
            elif name.endswith("expert_bias") or name.endswith("experts_touched"):
                tensor.zero_()
            elif tensor.dim() == 1:
                tensor.fill_(1.0)
            else:
                tensor.copy_(torch.randn(tensor.shape, generator=generator) * tensor.shape[-1] ** -0.5)
    return dataclasses.replace(lm, model=model)


def count_host(family: Family, host_file: Path, prompts: int = 8) -> HostModel:
    """Operations per kind of step on the replay model at two depths (fixed + per layer), priced at the
    file's seconds per operation and gap."""
    from benchmarks.measure_host import _per_kind, _steps
    from benchmarks.replay import replay
    from engine import BlockServeEngine, EngineConfig

    timed = HostModel.from_dict(json.loads(Path(host_file).read_text()))
    ops = {}
    for layers in COUNT_DEPTHS:
        lm = replay_model(family, layers)
        workload = replay("humaneval", lm, prompts)
        engine = BlockServeEngine(workload.steered(lm), EngineConfig(max_batch_size=4, **family.engine))
        steps = _steps(engine, workload.prompt_token_ids, workload.workload.params, counting=True)
        ops[layers] = _per_kind(steps, 50)
    low, high = COUNT_DEPTHS
    kinds = [kind for kind in KINDS if kind in ops[low] and kind in ops[high]]
    per_layer = {kind: (ops[high][kind] - ops[low][kind]) / (high - low) for kind in kinds}
    fixed = {kind: ops[low][kind] - low * per_layer[kind] for kind in kinds}
    source = (f"operations counted on the {family.fixture} replay model at {low} and {high} layers; seconds "
              f"per operation and gap from {Path(host_file).name} ({timed.source})")
    return HostModel(fixed, per_layer, timed.seconds_per_op, timed.gap_s, source)


def experts_in_shape(counts: list[float] | None, trace, replay_moe, shape) -> list[float] | None:
    """The replay model's per-forward distinct experts carried to the shape's experts
    (``benchmarks.perfmodel.moe.scaled_experts_touched``; the identity when the routing is the same)."""
    if counts is None or not shape.experts:
        return None
    if len(counts) != len(trace):
        raise RuntimeError(f"{len(counts)} expert counts for {len(trace)} forwards")
    return [scaled_experts_touched(count, record.forward_tokens, replay_moe.num_experts,
                                   replay_moe.experts_per_token, shape.experts, shape.experts_per_token)
            for count, record in zip(counts, trace)]


def project_run(trace, tokens: int, shape_name: str, host: HostModel, experts: list[float] | None) -> dict:
    shape, constants = MODELS[shape_name], load_constants("h200")
    gpu_only = dataclasses.replace(host, seconds_per_op=0.0, gap_s=0.0)
    main = project(trace, tokens, shape, "h200", constants, host=host, experts=experts)
    row = {key: main[key] for key in ("tokens_per_s", "mfu", "total_s", "prefill_s", "refresh_s", "window_s",
                                      "calls", "calls_by_kind", "host_bound_calls", "experts_read_mean")}
    row["gpu_only_tokens_per_s"] = project(trace, tokens, shape, "h200", constants, host=gpu_only,
                                           experts=experts)["tokens_per_s"]
    row["old_tokens_per_s"] = project(trace, tokens, shape, "h200", constants, experts=experts)["tokens_per_s"]
    if shape.experts:  # the same trace with uniform routing's expected experts (perfmodel/moe.py)
        uniform = project(trace, tokens, shape, "h200", constants, host=gpu_only)
        row["uniform_routing_gpu_only_tokens_per_s"] = uniform["tokens_per_s"]
        row["uniform_routing_experts_read_mean"] = uniform["experts_read_mean"]
    return row


def _engine_row(label: str, family: Family, workload, lm, size: int, host: HostModel) -> tuple[dict, list, list]:
    """One run of ``continuous`` at batch ``size``: its row, trace and per-forward experts (or None)."""
    from benchmarks.systems import run_system
    from benchmarks.throughput import steps_per_block

    steered = workload.steered(lm)
    result = run_system(steered, "continuous", workload.workload, max_batch_size=size, **family.engine)
    trace, tokens = result.extra["trace"], result.stats["generated_tokens"]
    experts = experts_in_shape(steered.model.experts_per_forward(), trace, lm.model.config.moe,
                               MODELS[family.shape])
    row = {"schedule": "continuous", "max_batch_size": size, "cpu_tokens_per_s": result.tokens_per_s,
           "forwards": len(trace), "rows_per_forward": result.stats["rows_per_forward"],
           "row_steps_per_block": steps_per_block(result), "generated_tokens": tokens,
           "forward_tokens_per_generated_token": sum(r.forward_tokens for r in trace) / tokens,
           "outputs_digest": result.extra["outputs_digest"],
           "projected": project_run(trace, tokens, family.shape, host, experts)}
    print(f"  [{family.shape}] {label:>16}: {len(trace)} forwards, H200* {row['projected']['tokens_per_s']:.0f} "
          f"tok/s (GPU time only {row['projected']['gpu_only_tokens_per_s']:.0f})", flush=True)
    return row, trace, experts


def _own_row(family: Family, engine_trace: list, engine_experts: list | None, tokens: int, host: HostModel) -> dict:
    """The family's own generate loop for the engine's batch-1 requests (``research.own_generate``)."""
    shape = MODELS[family.shape]
    own = OWN_GENERATE[family.shape](engine_trace, family.engine["block_length"])
    experts = (carried_experts(own, engine_trace, engine_experts, shape.experts, shape.experts_per_token)
               if engine_experts is not None else None)
    return {"schedule": "own generate (derived)", "max_batch_size": 1, "forwards": len(own),
            "rows_per_forward": 1.0, "generated_tokens": tokens,
            "forward_tokens_per_generated_token": sum(r.forward_tokens for r in own) / tokens,
            "projected": project_run(own, tokens, family.shape, host, experts)}


def run_family(name: str, requests: int, batch_sizes: list[int], host_file: Path) -> dict:
    from benchmarks.replay import replay

    family = FAMILIES[name]
    host = count_host(family, host_file)
    lm = replay_model(family)
    workload = replay("humaneval", lm, requests)
    rows = {}
    for size in [*batch_sizes, 1]:
        label = ENGINE_ONE if size == 1 else f"continuous@{size}"
        rows[label], trace, experts = _engine_row(label, family, workload, lm, size, host)
    rows[OWN_ONE] = _own_row(family, trace, experts, rows[ENGINE_ONE]["generated_tokens"], host)
    ratios = {f"{label} over {base}": {key: row["projected"][key] / rows[base]["projected"][key]
                                       for key in ("tokens_per_s", "gpu_only_tokens_per_s")}
              for label, row in rows.items() if label.startswith("continuous@") for base in (ENGINE_ONE, OWN_ONE)}
    digests = {row["outputs_digest"] for row in rows.values() if "outputs_digest" in row}
    return {"shape": dataclasses.asdict(MODELS[family.shape]), "fixture": family.fixture,
            "engine": family.engine, "routing": family.routing, "host_model": host.to_dict(),
            "notes": workload.workload.notes, "identical_outputs": len(digests) == 1, "systems": rows,
            "ratios": ratios}


def markdown(result: dict) -> str:
    """The tables to print and to put in RESULTS.md (``block_causal.md`` beside the JSON)."""
    lines = []
    for family in result["families"].values():
        notes, shape = family["notes"], family["shape"]
        lines += [f"### {shape['name']} shapes: replay-humaneval, {notes['requests']} requests, replay model "
                  f"`{family['fixture']}`, blocks of {family['engine']['block_length']}; outputs identical: "
                  f"**{family['identical_outputs']}**", "",
                  r"| run | forwards | rows per forward | row-steps per block | forward tokens per generated token | "
                  r"**H200 tok/s\*** (host model) | H200 tok/s\* (GPU time only) | old projection tok/s\* | MFU\* | "
                  "experts read per MoE layer |", "|---|---|---|---|---|---|---|---|---|---|"]
        for label, row in family["systems"].items():
            p = row["projected"]
            experts = f"{p['experts_read_mean']:.0f}" if shape["experts"] else "dense"
            steps = f"{row['row_steps_per_block']:.2f}" if "row_steps_per_block" in row else "(same)"
            lines.append(f"| {label} | {row['forwards']} | {row['rows_per_forward']:.2f} | "
                         f"{steps} | {row['forward_tokens_per_generated_token']:.1f} | "
                         f"**{p['tokens_per_s']:.0f}** | {p['gpu_only_tokens_per_s']:.0f} | "
                         f"{p['old_tokens_per_s']:.0f} | "
                         f"{p['mfu']:.1%} | {experts} |")
        lines += ["", f"{OWN_ONE}: the engine's batch-1 steps as the family's own loop runs them; its host time "
                  "counts the engine's operations per step, not its own.",
                  "", "| ratio | host model | GPU time only |", "|---|---|---|"]
        lines += [f"| {key} | {value['tokens_per_s']:.2f} | {value['gpu_only_tokens_per_s']:.2f} |"
                  for key, value in family["ratios"].items()]
        if shape["experts"]:
            lines += ["", "Uniform routing instead of the recorded experts (GPU time only, tok/s\\*): " + ", ".join(
                f"{label} {row['projected']['uniform_routing_gpu_only_tokens_per_s']:.0f} "
                f"({row['projected']['uniform_routing_experts_read_mean']:.0f} experts)"
                for label, row in family["systems"].items())]
        lines.append("")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m research block-causal", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", default="full", choices=sorted(SCALES))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/block_causal"))
    parser.add_argument("--families", default=",".join(FAMILIES), help="comma-separated: " + ", ".join(FAMILIES))
    parser.add_argument("--requests", type=int, default=None, help="requests per run (HumanEval has 164)")
    parser.add_argument("--batch-sizes", default=None, help="comma-separated batch sizes of the continuous runs")
    parser.add_argument("--host-model", type=Path, default=HOST_FILE,
                        help="host-model JSON whose seconds per operation and gap price the counted operations")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    for key, value in SCALES[args.scale].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


@contextlib.contextmanager
def torch_threads(count: int):
    """Run with ``count`` torch threads, then restore: on tiny models more threads only add
    synchronisation, and on a shared CPU far worse."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    sizes = [int(size) for size in str(args.batch_sizes).split(",")]
    result = {"requests": args.requests, "batch_sizes": sizes, "device": "h200", "families": {}}
    with torch_threads(args.threads):  # the results' machine line then says how many threads ran
        for name in args.families.split(","):
            result["families"][name] = run_family(name, args.requests, sizes, args.host_model)
        path = write_results(args.out, "block_causal", result, ["block-causal", *(argv or [])],
                             program="python -m research")
    table = markdown(result)
    (args.out / "block_causal.md").write_text(table)
    print(table)
    print(f"wrote {path}")
    return result
