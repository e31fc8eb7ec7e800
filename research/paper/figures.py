"""The paper's figures from a suite's raw results (matplotlib, Agg backend: no screen needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from benchmarks.plots import COLORS, measured_vs_projected  # noqa: E402
from benchmarks.summary import percentiles  # noqa: E402
from research.paper.report import length_bins  # noqa: E402


def latency_vs_length(tables: dict, path: Path) -> None:
    """Fig. 2: box plots of per-request latency per output-length bin, one panel per workload."""
    fig, axes = plt.subplots(1, len(tables), figsize=(7 * len(tables), 4.2), squeeze=False)
    for ax, (name, table) in zip(axes[0], tables.items()):
        per_system = {row["system"]: length_bins(row["requests"]) for row in table["rows"]}
        bins = sorted({b for bins in per_system.values() for b in bins}, key=lambda b: int(b.split("-")[0]))
        width = 0.8 / len(per_system)
        for offset, (system, system_bins) in enumerate(per_system.items()):
            positions = [i + (offset - (len(per_system) - 1) / 2) * width for i in range(len(bins))]
            data = [system_bins.get(b, []) for b in bins]
            kept = [(p, d) for p, d in zip(positions, data) if d]
            parts = ax.boxplot([d for _, d in kept], positions=[p for p, _ in kept], widths=width * 0.9,
                               patch_artist=True, showfliers=True, flierprops={"markersize": 2})
            for box in parts["boxes"]:
                box.set_facecolor(COLORS.get(system, "grey"))
                box.set_alpha(0.6)
            ax.plot([], [], color=COLORS.get(system, "grey"), lw=6, alpha=0.6, label=system)
        ax.set_xticks(range(len(bins)), bins, rotation=30)
        ax.set_xlabel("output length (tokens)")
        ax.set_ylabel("request latency (s)")
        ax.set_title(f"{name}: latency by output length, batch 16")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compute_ratio(sweep: dict, path: Path) -> None:
    """Fig. 3: effective compute ratio and useful row fraction vs batch size per system."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key, ax, title in (("effective_compute_ratio", axes[0], "effective compute ratio"),
                           ("useful_row_fraction", axes[1], "useful row fraction")):
        for system in COLORS:
            points = [p for p in sweep["points"] if p["system"] == system]
            if points:
                ax.plot([p["batch_size"] for p in points], [p[key] for p in points], "o-",
                        color=COLORS[system], label=system)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylim(0, 1.05)
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def batch_latency(sweep: dict, path: Path) -> None:
    """Fig. 4: p50 (solid), p90 (dashed), p99 (dotted) request latency vs batch size per system."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for system, color in COLORS.items():
        points = [p for p in sweep["points"] if p["system"] == system]
        if not points:
            continue
        sizes = [p["batch_size"] for p in points]
        stats = [percentiles([r["latency_s"] for r in p["requests"]]) for p in points]
        for key, style in (("p50", "-"), ("p90", "--"), ("p99", ":")):
            ax.plot(sizes, [s[key] for s in stats], style, marker="o", color=color,
                    label=f"{system} {key}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size")
    ax.set_ylabel("request latency (s)")
    ax.set_title(f"latency percentiles vs batch size ({sweep['workload']})")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def table_measured_vs_projected(tables: dict, path: Path) -> None:
    """Table II as bars: per workload and schedule, CPU tok/s measured beside H200 tok/s projected,
    each relative to static."""
    workloads = {name: {"systems": {row["system"]: {"tokens_per_s": row["tokens_per_s"],
                                                    "projected": row["projected"]} for row in table["rows"]}}
                 for name, table in tables.items()}
    measured_vs_projected({"workloads": workloads}, path)


def write_all(results: dict, out: Path) -> list[Path]:
    written = []
    if "throughput" in results:
        written.append(out / "fig2_latency_vs_length.png")
        latency_vs_length(results["throughput"], written[-1])
        written.append(out / "fig5_measured_vs_projected.png")
        table_measured_vs_projected(results["throughput"], written[-1])
    if "batch_sweep" in results:
        written += [out / "fig3_compute_ratio.png", out / "fig4_batch_latency.png"]
        compute_ratio(results["batch_sweep"], written[-2])
        batch_latency(results["batch_sweep"], written[-1])
    return written
