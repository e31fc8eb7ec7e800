"""Raw suite results -> a Markdown report laid out like the paper's tables and figures."""
from __future__ import annotations

from benchmarks.summary import percentiles

LENGTH_BIN = 32  # output-length bins of one block
PROJECTED_TOK_S = "H200 tok/s*"
PROJECTED_NOTE = ("\\* projected, not measured: the run's per-forward trace priced for LLaDA-8B shapes on one H200 "
                  "with the host model (`benchmarks/perfmodel/`; every constant and its source in "
                  "`benchmarks/perfmodel/README.md`); old\\*: the old "
                  "projection (GPU time + 1.92 ms per forward).")


def length_bins(requests: list[dict]) -> dict[str, list[float]]:
    """Latencies grouped by output length, one block per bin (``1-32``, ``33-64``, ...)."""
    bins: dict[int, list[float]] = {}
    for request in requests:
        index = max(request["output_tokens"] - 1, 0) // LENGTH_BIN
        bins.setdefault(index, []).append(request["latency_s"])
    return {f"{i * LENGTH_BIN + 1}-{(i + 1) * LENGTH_BIN}": bins[i] for i in sorted(bins)}


def _table(header: list[str], rows: list[list]) -> list[str]:
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
        return "n/a" if value is None else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]


def throughput_section(tables: dict) -> list[str]:
    lines = ["## Throughput (paper's Table II)", ""]
    for name, table in tables.items():
        notes = ", ".join(f"{key} {value}" for key, value in table["workload_notes"].items())
        lines += [f"### {name}", "", f"Workload: {notes}. Outputs identical across systems: "
                  f"**{table['identical_outputs']}**.", ""]
        block_sync_digest = next(row for row in table["rows"] if row["system"] == "block_sync")["outputs_digest"]
        lines += _table(
            ["system", "CPU tok/s (median)", "tok/s per round", "block_sync speedup", "exact match",
             "same tokens as block_sync", "eff. compute ratio", "useful row frac.", "padding frac.", "sched. overhead",
             "forwards (window)", PROJECTED_TOK_S, "MFU*", "old tok/s*"],
            [[row["label"], row["tokens_per_s"], " / ".join(f"{v:.1f}" for v in row["tokens_per_s_all"]),
              None if row["speedup_of_block_sync"] is None else f"{row['speedup_of_block_sync']:.2f}x",
              row["accuracy"], row["outputs_digest"] == block_sync_digest,
              row["effective_compute_ratio"],
              row["useful_row_fraction"], row["padding_fraction"],
              f"{row['scheduler_overhead_fraction']:.1%}",
              f"{int(row['denoise_steps'])} ({int(row['window_forwards'])})",
              row["projected"]["tokens_per_s"], f"{row['projected']['mfu']:.1%}",
              row["projected"]["old_tokens_per_s"]] for row in table["rows"]])
        lines.append("")
    return lines + [PROJECTED_NOTE, "", "![measured vs projected](fig5_measured_vs_projected.png)", ""]


def latency_section(tables: dict) -> list[str]:
    lines = ["## Latency vs output length (paper's Fig. 2)", "",
             "![latency vs output length](fig2_latency_vs_length.png)", ""]
    for name, table in tables.items():
        per_system = {row["label"]: length_bins(row["requests"]) for row in table["rows"]}
        bins = sorted({b for bins in per_system.values() for b in bins}, key=lambda b: int(b.split("-")[0]))
        lines += [f"### {name}: median / p99 latency (s) by output length (tokens)", ""]
        lines += _table(["system"] + bins, [
            [label] + [(lambda p: f"{p['p50']:.1f} / {p['p99']:.1f}")(percentiles(system_bins.get(b, [])))
                       if b in system_bins else "" for b in bins]
            for label, system_bins in per_system.items()])
        lines.append("")
    return lines


def sweep_section(sweep: dict) -> list[str]:
    lines = ["## Effective compute ratio and useful row fraction by batch size (paper's Fig. 3)", "",
             f"Workload `{sweep['workload']}`, {sweep['requests']} requests per point.", "",
             "![compute ratio](fig3_compute_ratio.png)", ""]
    lines += _table(["batch", "system", "eff. compute ratio", "useful row frac.", "CPU tok/s", PROJECTED_TOK_S,
                     "rows computed per step"],
                    [[p["batch_size"], p["label"], p["effective_compute_ratio"], p["useful_row_fraction"],
                      p["tokens_per_s"], p["projected"]["tokens_per_s"], p["rows_per_forward"]]
                     for p in sweep["points"]])
    lines += ["", "## Batch-size scaling of latency (paper's Fig. 4)", "", "![batch latency](fig4_batch_latency.png)",
              ""]
    rows = []
    for p in sweep["points"]:
        q = percentiles([r["latency_s"] for r in p["requests"]])
        rows.append([p["batch_size"], p["label"], q["p50"], q["p90"], q["p99"]])
    return lines + _table(["batch", "system", "p50 (s)", "p90 (s)", "p99 (s)"], rows) + [""]


def capacity_section(capacities: dict) -> list[str]:
    lines = ["## Batch capacity under one token budget (paper's Table IV)", ""]
    for name, cap in capacities.items():
        lines += [f"### {name}: budget {cap['token_budget']} bounding-box tokens; rows {cap['narrowest_row']}"
                  f"-{cap['widest_row']} tokens wide", ""]
        lines += _table(["system", "batch size set", "peak rows", "mean rows per step", "peak box", "within budget",
                         "CPU tok/s", PROJECTED_TOK_S, "exact match"],
                        [[s["system"], s["max_batch_size"] if s["system"] in ("static", "shrink") else "budget only",
                          s["peak_rows"], s["mean_rows"], s["peak_bounding_box_tokens"], s["within_budget"],
                          s["tokens_per_s"], s["projected"]["tokens_per_s"], s["accuracy"]] for s in cap["systems"]])
        lines.append("")
    return lines


def ablation_section(ablation: dict) -> list[str]:
    lines = ["## Ablations (batch 16, `continuous` schedule)", "",
             f"Workload `{ablation['workload']}`, {ablation['requests']} requests.", "", "### Block length", ""]
    lines += _table(["block length", "CPU tok/s", PROJECTED_TOK_S, "exact match", "denoise steps",
                     "useful row frac."],
                    [[r["label"], r["tokens_per_s"], r["projected"]["tokens_per_s"], r["accuracy"],
                      int(r["denoise_steps"]), r["useful_row_fraction"]] for r in ablation["block_length"]])
    lines += ["", "### Pending-queue order", ""]
    return lines + _table(["queue", "CPU tok/s", PROJECTED_TOK_S, "padding frac.", "exact match"],
                          [[r["label"], r["tokens_per_s"], r["projected"]["tokens_per_s"], r["padding_fraction"],
                            r["accuracy"]] for r in ablation["queue_order"]]) + ["", PROJECTED_NOTE, ""]


def render(results: dict) -> str:
    meta = results["meta"]
    lines = ["# BlockServe benchmark report", "",
             f"- command: `{meta['command']}`", f"- date: {meta['date']}", f"- machine: {meta['machine']}",
             f"- model: {meta['model']} ({meta['dtype']}, {meta['device']}); scale `{meta['scale']}`; "
             f"wall time {meta['wall_s']:.0f} s", ""]
    if "throughput" in results:
        lines += throughput_section(results["throughput"]) + latency_section(results["throughput"])
    if "batch_sweep" in results:
        lines += sweep_section(results["batch_sweep"])
    if "capacity" in results:
        lines += capacity_section(results["capacity"])
    if "ablations" in results:
        lines += ablation_section(results["ablations"])
    return "\n".join(lines) + "\n"
