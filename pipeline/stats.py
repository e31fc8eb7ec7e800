"""Driver-side accounting: actor snapshots -> stats.json, a printed table and stats.png.

Each BlockServeActor instance reports cumulative snapshots (see ``actors.ray_data.stats_registry``); an actor
that Ray restarted contributes one snapshot per incarnation, which are added up here. The engine's
per-step means (effective compute ratio, useful row fraction) are combined weighted by denoising steps;
so is the padding fraction, a per-forward token ratio (a step is one forward; the engine does not export
its token totals, so this is an approximation when forward sizes differ a lot between actors).

Every rate and share names its denominator, the same for an actor, a node (``per_node``) and the TOTAL:
``*_active`` is over the group's active time (each actor's first row in to its last row out, summed over
its actors), ``*_wall`` over the job's wall time for each of its actors (:data:`DEFINITIONS`).
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np

from engine.models.layout import DEFAULT_BLOCK_LENGTH

DEFINITIONS = {  # stats.json's "definitions": what each rate and share is over, one denominator per word
    "active_s": "an actor's active time: its first row in to its last row out (a group: its actors' sum)",
    "wall_s": "the job's wall time: generation started to the last row written",
    "tokens_per_active_s": "generated tokens / active_s",
    "tokens_per_wall_s": "generated tokens / the job's wall_s",
    "busy_share_of_active": "engine busy time (inside step()) / active_s",
    "busy_share_of_wall": "engine busy time / (actors x the job's wall_s)",
    "error_share_of_rows": "error rows / rows",
    "prefix_cache_hit_rate": "prompt tokens read from the prefix cache / prompt tokens",
    "gpu_utilization": "NVML's utilization in %, the mean of samples taken at most once a second after engine steps",
    "effective_compute_ratio": "per step, unfinished requests / max_batch_size; mean over steps",
    "useful_row_fraction": "per step, rows of unfinished requests / rows computed; mean over steps",
    "padding_fraction": "pad positions / bounding-box positions of the forwards run",
    "share_of_job": "stats.png's per-node panel: a node's rows, tokens or busy time / the job's total of each",
}
TOP_ERRORS = 3  # most common error messages kept per actor and for the job


def _weighted(snapshots: list[dict], key: str, weight: str) -> float:
    total = sum(s["engine"][weight] for s in snapshots)
    return sum(s["engine"][key] * s["engine"][weight] for s in snapshots) / total if total else 0.0


def _share(part: float, whole: float) -> float | None:
    return min(part / whole, 1.0) if whole else None


def summarize(snapshots: list[dict], wall_s: float) -> dict:
    """One row of numbers for a group of actor-instance snapshots (an actor, a node, or all of them)."""
    generated = sum(s["engine"]["generated_tokens"] for s in snapshots)
    prompt = sum(s["engine"].get("prompt_tokens", 0) for s in snapshots)
    cached = sum(s["engine"].get("cached_prompt_tokens", 0) for s in snapshots)
    row_forwards = sum(s["engine"].get("row_forwards", 0) for s in snapshots)
    rows = sum(s["rows"] for s in snapshots)
    error_rows = sum(s["error_rows"] for s in snapshots)
    busy = sum(s["busy_s"] for s in snapshots)
    active = sum(s["active_s"] for s in snapshots)
    actor_wall = len({s["actor_id"] for s in snapshots}) * wall_s
    utilizations = [s["gpu_utilization"] for s in snapshots if s["gpu_utilization"] is not None]
    return {
        "tensor_parallel_size": next((s["tensor_parallel_size"] for s in snapshots if "tensor_parallel_size" in s),
                                     None),
        "rows": rows,
        "error_rows": error_rows,
        "error_share_of_rows": error_rows / rows if rows else 0.0,
        **errors_of(snapshots),
        "batches": sum(s["batches"] for s in snapshots),
        "generated_tokens": generated,
        "prompt_tokens": prompt,
        "cached_prompt_tokens": cached,
        "prefix_cache_hit_rate": cached / prompt if prompt else 0.0,
        "busy_s": busy,
        "active_s": active,
        "tokens_per_active_s": generated / active if active else 0.0,
        "tokens_per_wall_s": generated / wall_s if wall_s else 0.0,
        "busy_share_of_active": _share(busy, active),
        "busy_share_of_wall": _share(busy, actor_wall),
        "idle_between_batches_s": sum(s.get("idle_s", 0.0) for s in snapshots),
        "denoise_steps": sum(s["engine"]["denoise_steps"] for s in snapshots),
        "row_forwards": row_forwards,
        "tokens_per_forward": generated / row_forwards if row_forwards else 0.0,
        "counters": dict(sum((Counter(s["engine"].get("counters", {})) for s in snapshots), Counter())),
        "effective_compute_ratio": _weighted(snapshots, "effective_compute_ratio", "denoise_steps"),
        "useful_row_fraction": _weighted(snapshots, "useful_row_fraction", "denoise_steps"),
        "padding_fraction": _weighted(snapshots, "padding_fraction", "denoise_steps"),
        "memory_peak_bytes": max((s["memory_peak_bytes"] for s in snapshots), default=0),
        "gpu_utilization": sum(utilizations) / len(utilizations) if utilizations else None,
    }


def errors_of(snapshots: list[dict]) -> dict:
    """The group's first error message (by time) and its :data:`TOP_ERRORS` most common ones with their rows."""
    counts = Counter()
    for snapshot in snapshots:
        counts.update(snapshot.get("errors", {}))
    firsts = [s["first_error"] for s in snapshots if s.get("first_error")]
    return {"first_error": min(firsts, key=lambda e: e["at"])["message"] if firsts else None,
            "common_errors": [{"message": m, "rows": n} for m, n in counts.most_common(TOP_ERRORS)]}


def decoded_block_length(snapshots: list[dict], configured: int | None) -> int:
    """The block the actors decoded with: configured, else the one their engines settled on (a
    block-causal model's trained block), else the engine's default."""
    return configured or next((s["block_length"] for s in snapshots if s.get("block_length")),
                              DEFAULT_BLOCK_LENGTH)


def latency_samples_by_bin(snapshots: list[dict], bin_tokens: int) -> dict[str, np.ndarray]:
    """Sampled row latencies grouped by generated tokens in bins (0, b], (b, 2b], ... (label -> s)."""
    tokens = np.array([t for s in snapshots for t in s["samples"]["num_generated_tokens"]], dtype=float)
    latency = np.array([t for s in snapshots for t in s["samples"]["latency_s"]], dtype=float)
    bins = np.maximum(np.ceil(tokens / bin_tokens), 1).astype(int)
    return {f"{(b - 1) * bin_tokens + 1}-{b * bin_tokens}": latency[bins == b]
            for b in sorted(set(bins.tolist()))}


def latency_by_output_length(snapshots: list[dict], bin_tokens: int) -> list[dict]:
    return [{"output_tokens": label, "rows": int(len(values)), "p50_s": float(np.percentile(values, 50)),
             "p90_s": float(np.percentile(values, 90)), "max_s": float(values.max())}
            for label, values in latency_samples_by_bin(snapshots, bin_tokens).items()]


def per_node(snapshots: list[dict], wall_s: float) -> list[dict]:
    """One entry per Ray node that ran actors: its actors and their summed numbers, node ids sorted."""
    by_node: dict[str, list[dict]] = defaultdict(list)
    for snapshot in snapshots:
        by_node[snapshot["node_id"]].append(snapshot)
    nodes = []
    for node_id, group in sorted(by_node.items()):
        actor_ids = sorted({s["actor_id"] for s in group})
        nodes.append({"node_id": node_id, "actors": len(actor_ids), "actor_ids": actor_ids,
                      "devices": sorted({s["device"] for s in group}),
                      "restarts": len(group) - len(actor_ids), **summarize(group, wall_s)})
    return nodes


def aggregate(snapshots: list[dict], wall_s: float, bin_tokens: int, deaths: list[dict] = (),
              isolations: list[dict] = ()) -> dict:
    """``deaths``: the registry's :class:`~actors.ray_data.batch_deaths.ActorDeath` records, kept as they
    are; ``isolations``: its reports of convicted batches (:mod:`actors.ray_data.batch_isolation`)."""
    by_actor: dict[str, list[dict]] = defaultdict(list)
    for snapshot in snapshots:
        by_actor[snapshot["actor_id"]].append(snapshot)
    per_actor = []
    for actor_id, group in sorted(by_actor.items()):
        graphs = [s["compiled_graphs"] for s in group if s.get("compiled_graphs") is not None]
        per_actor.append({"actor_id": actor_id, "node_id": group[0]["node_id"], "device": group[0]["device"],
                          "incarnations": len(group), "compiled_graphs": max(graphs, default=None),
                          "compile_failures": {k: v for s in group for k, v in s.get("compile_failures", {}).items()},
                          **summarize(group, wall_s)})
    totals = {"actors": len(by_actor), "restarts": len(snapshots) - len(by_actor), "wall_s": wall_s,
              **summarize(snapshots, wall_s)}
    return {"definitions": DEFINITIONS, "per_actor": per_actor, "per_node": per_node(snapshots, wall_s),
            "totals": totals, "latency_by_output_length": latency_by_output_length(snapshots, bin_tokens),
            "actor_deaths": list(deaths), "batch_isolation": isolation_totals(isolations)}


def isolation_totals(isolations: list[dict]) -> dict:
    """The convicted batches whose rows were retried in smaller groups: their rows, generated and
    flagged, the deaths it cost and the seconds it took (summed over batches), and each batch's report."""
    keys = ("rows", "rows_generated", "rows_flagged", "deaths", "wait_s")
    return {"batches": len(isolations), **{key: sum(i[key] for i in isolations) for key in keys},
            "per_batch": list(isolations)}


def describe_isolation(totals: dict) -> list[str]:
    if not totals or not totals["batches"]:
        return []
    return [f"{totals['batches']} convicted batch(es) of {totals['rows']} rows retried in smaller groups: "
            f"{totals['rows_generated']} rows generated, {totals['rows_flagged']} flagged, at the cost of "
            f"{totals['deaths']} more actor deaths and {totals['wait_s']:.1f} s"]


def describe_deaths(deaths: list[dict]) -> list[str]:
    """One line per actor that died: how often, and the cause of its last death."""
    by_actor: dict[str, list[dict]] = defaultdict(list)
    for death in sorted(deaths, key=lambda d: d["reported_at"]):
        by_actor[death["actor_id"]].append(death)
    lines = []
    for actor_id, group in sorted(by_actor.items()):
        times = "once" if len(group) == 1 else f"{len(group)} times"
        lines.append(f"actor {actor_id[:8]} died {times} (Ray restarted it and retried its batches); "
                     f"last cause: {group[-1]['cause']}")
    return lines


def describe_compilation(per_actor: list[dict]) -> list[str]:
    """Graphs each actor compiled, and any shape that fell back to eager (compile=True only)."""
    compiled = [a for a in per_actor if a.get("compiled_graphs") is not None]
    if not compiled:
        return []
    lines = ["compiled graphs per actor: " + ", ".join(f"{a['actor_id'][:8]} {a['compiled_graphs']}"
                                                         for a in compiled)]
    for actor in compiled:
        for shape, cause in actor["compile_failures"].items():
            lines.append(f"  actor {actor['actor_id'][:8]} runs {shape} eagerly: {cause}")
    return lines


# -- presentation ----------------------------------------------------------------------------------
def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


def percent(value: float | None) -> str:
    """A share as a whole percentage ("-" when it is not known)."""
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{100 * value:.0f}%"


def describe_job(stats: dict) -> str:
    """The job in a line: model, actors and their tensor-parallel size, tokens over the job's wall."""
    totals, model = stats["totals"], stats.get("run", {}).get("model")
    return (f"{'' if model is None else f'{model}: '}{totals['actors']} actor(s) x tensor_parallel_size "
            f"{totals['tensor_parallel_size'] or '?'}; {totals['generated_tokens']} tokens in "
            f"{totals['wall_s']:.1f} s of job wall = {totals['tokens_per_wall_s']:.1f} tok/s")


def describe_errors(totals: dict) -> list[str]:
    """How many rows failed, the first message, and the most common ones with their rows."""
    if not totals["error_rows"]:
        return [f"errors: none of {totals['rows']} rows"]
    lines = [f"errors: {totals['error_rows']} of {totals['rows']} rows ({percent(totals['error_share_of_rows'])} "
             f"of rows) failed; the first: {totals['first_error']}"]
    lines += [f"  {error['rows']} rows: {error['message']}" for error in totals["common_errors"]]
    return lines


def format_table(stats: dict) -> str:
    header = ("actor", "device", "rows", "errors", "tokens", "tok/s", "busy s", "busy/active", "busy/wall",
              "ECR", "useful", "padding", "mem peak", "GPU util")
    lines = []

    def row(name: str, device: str, s: dict) -> tuple:
        gpu = s["gpu_utilization"]
        return (name, device, s["rows"], s["error_rows"], s["generated_tokens"], f"{s['tokens_per_active_s']:.1f}",
                f"{s['busy_s']:.1f}", percent(s["busy_share_of_active"]), percent(s["busy_share_of_wall"]),
                f"{s['effective_compute_ratio']:.2f}", f"{s['useful_row_fraction']:.2f}",
                f"{s['padding_fraction']:.2f}", _bytes(s["memory_peak_bytes"]), "-" if gpu is None else f"{gpu:.0f}%")

    for actor in stats["per_actor"]:
        restarted = f" (x{actor['incarnations']})" if actor["incarnations"] > 1 else ""
        lines.append(row(actor["actor_id"][:8] + restarted, actor["device"], actor))
    totals = stats["totals"]
    lines.append(row(f"TOTAL ({totals['actors']})", "", totals))
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *lines)]
    render = lambda cells: "  ".join(str(c).rjust(w) if i > 1 else str(c).ljust(w)  # noqa: E731
                                     for i, (c, w) in enumerate(zip(cells, widths)))
    rule = "-" * len(render(header))
    out = [describe_job(stats), render(header), rule, *map(render, lines[:-1]), rule, render(lines[-1])]
    out.append("tok/s = tokens / active time; busy/active = engine busy time / active time; "
               "busy/wall = engine busy time / (actors x job wall)")
    out.append("  (active time: an actor's first row in to its last row out, summed for TOTAL and a node)")
    if totals["gpu_utilization"] is not None:
        out.append(f"  (GPU util: {DEFINITIONS['gpu_utilization']})")
    for node in stats.get("per_node", []):
        out.append(f"  node {node['node_id'][:8]}: {node['actors']} actor(s), {node['rows']} rows "
                   f"({node['error_rows']} errors), {node['generated_tokens']} tokens "
                   f"({node['tokens_per_wall_s']:.1f} tok/s of job wall), busy {node['busy_s']:.1f} s: "
                   f"{percent(node['busy_share_of_active'])} of its actors' active time, "
                   f"{percent(node['busy_share_of_wall'])} of {node['actors']} actor(s) x job wall")
    out += describe_errors(totals)
    if totals["cached_prompt_tokens"]:
        out.append(f"prefix cache: {totals['cached_prompt_tokens']} of {totals['prompt_tokens']} prompt tokens "
                   f"read from it ({percent(totals['prefix_cache_hit_rate'])} of prompt tokens)")
    if totals.get("row_forwards"):
        counted = "".join(f", {name} {count}" for name, count in sorted(totals["counters"].items()))
        out.append(f"decoding: {totals['tokens_per_forward']:.2f} tokens per row forward{counted}")
    out += describe_deaths(stats.get("actor_deaths", []))
    out += describe_isolation(stats.get("batch_isolation", {}))
    out += describe_compilation(stats["per_actor"])
    for bin_ in stats["latency_by_output_length"]:
        out.append(f"  latency, {bin_['output_tokens']:>9} output tokens: p50 {bin_['p50_s']:.2f}s  "
                   f"p90 {bin_['p90_s']:.2f}s  max {bin_['max_s']:.2f}s  ({bin_['rows']} rows sampled)")
    return "\n".join(out)
