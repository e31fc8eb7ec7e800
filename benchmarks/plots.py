"""The throughput figure: measured beside projected per schedule (matplotlib, Agg backend: no screen needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

COLORS = {"continuous": "tab:blue", "block_sync": "tab:green", "static": "tab:red", "shrink": "tab:orange"}


def _ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline else float("nan")  # a workload whose answers were all empty


def measured_vs_projected(result: dict, path: Path) -> Path:
    """Per schedule: CPU tokens/s measured beside H200 tokens/s projected, each relative to static."""
    workloads = result["workloads"]
    fig, axes = plt.subplots(1, len(workloads), figsize=(6.5 * len(workloads), 4.2), squeeze=False)
    for ax, (name, summary) in zip(axes[0], workloads.items()):
        systems = summary["systems"]
        names = list(systems)
        measured = [_ratio(systems[s]["tokens_per_s"], systems["static"]["tokens_per_s"]) for s in names]
        projected = [_ratio(systems[s]["projected"]["tokens_per_s"], systems["static"]["projected"]["tokens_per_s"])
                     for s in names]
        positions = range(len(names))
        ax.bar([p - 0.2 for p in positions], measured, width=0.4, label="CPU, measured", color="tab:grey")
        bars = ax.bar([p + 0.2 for p in positions], projected, width=0.4, label="H200, projected",
                      color=[COLORS.get(s, "grey") for s in names])
        for bar, system in zip(bars, names):
            ax.annotate(f"{systems[system]['projected']['tokens_per_s']:.0f} tok/s*", (bar.get_x() + 0.2,
                        bar.get_height()), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(positions), names)
        ax.axhline(1.0, color="black", lw=0.6)
        ax.set_ylabel("tokens/s relative to static")
        ax.set_title(f"{name}: measured (CPU) vs projected* (LLaDA-8B, H200)", fontsize=9)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
