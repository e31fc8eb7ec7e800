"""stats.png: the job's stats drawn for a person who would rather look than read (``pipeline.stats`` holds the
numbers). Every percentage panel runs 0-100 with its legend above the bars; latency starts at 0."""
from __future__ import annotations

import io
import textwrap

import numpy as np

from pipeline.stats import describe_errors, describe_job, percent

PERCENT_TOP = 130  # the y limit of a % panel: bars end at 100 (labels a little above), the legend sits above


def plot_png(stats: dict, latency_bins: dict[str, np.ndarray]) -> bytes:
    """:func:`stats_figure` as PNG bytes."""
    import matplotlib.pyplot as plt

    fig = stats_figure(stats, latency_bins)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def stats_figure(stats: dict, latency_bins: dict[str, np.ndarray]):
    """Per actor: throughput, rows and error rows, busy shares; rows, tokens and busy time per node;
    latency by output-length bin; and the job in words (tensor-parallel size, errors)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 3, figsize=(18, 9), layout="constrained")
    fig.suptitle(describe_job(stats))
    _plot_throughput(grid[0, 0], stats["per_actor"])
    _plot_rows(grid[0, 1], stats["per_actor"])
    _plot_busy(grid[0, 2], stats["per_actor"])
    _plot_nodes(grid[1, 0], stats.get("per_node", []))
    _plot_latency(grid[1, 1], latency_bins)
    _plot_job(grid[1, 2], stats)
    return fig


def _actor_names(actors: list[dict]) -> list[str]:
    return [a["actor_id"][:8] for a in actors]


def _plot_throughput(ax, actors: list[dict]) -> None:
    ax.bar(_actor_names(actors), [a["tokens_per_active_s"] for a in actors], color="tab:blue")
    ax.set_title("throughput per actor")
    ax.set_ylabel("generated tokens / s of the actor's active time")
    ax.tick_params(axis="x", rotation=30)


def _plot_rows(ax, actors: list[dict]) -> None:
    """Answered rows with the error rows stacked on them (in red), labelled with both counts."""
    names = _actor_names(actors)
    answered = [a["rows"] - a["error_rows"] for a in actors]
    ax.bar(names, answered, color="tab:blue", label="answered rows")
    bars = ax.bar(names, [a["error_rows"] for a in actors], bottom=answered, color="tab:red", label="error rows")
    ax.bar_label(bars, labels=[f"{a['rows']} ({a['error_rows']} errors)" for a in actors], fontsize=8, padding=2)
    ax.set_ylim(0, 1.3 * max((a["rows"] for a in actors), default=1) or 1)
    ax.set_ylabel("rows")
    ax.set_title("rows per actor")
    ax.legend(loc="upper center", ncol=2, fontsize=8)
    ax.tick_params(axis="x", rotation=30)


def _plot_busy(ax, actors: list[dict]) -> None:
    """Each actor's engine busy time over its active time and over the job's wall, and GPU utilization."""
    x = np.arange(len(actors))
    width = 0.27
    measured = any(a["gpu_utilization"] is not None for a in actors)
    series = (("busy_share_of_active", 100, "busy, % of its active time"),
              ("busy_share_of_wall", 100, "busy, % of the job's wall"),
              ("gpu_utilization", 1, "GPU util, NVML %" if measured else "GPU util: n/a (no GPU / NVML)"))
    for offset, (key, scale, label) in zip((-width, 0, width), series):
        values = [a[key] for a in actors]
        bars = ax.bar(x + offset, [scale * (v or 0) for v in values], width, label=label)
        ax.bar_label(bars, labels=["n/a" if v is None else f"{scale * v:.0f}%" for v in values],
                     fontsize=8, padding=2)
    ax.set_xticks(x, _actor_names(actors), rotation=30)
    _percent_axis(ax, "%", ncol=2)
    ax.set_title("engine busy per actor")


def _plot_nodes(ax, nodes: list[dict]) -> None:
    """Each node's share of the job's rows, generated tokens and engine busy time (in %, so the three fit
    one axis), labelled with its numbers and its actor count."""
    x = np.arange(len(nodes))
    shares = (("rows", "rows"), ("generated_tokens", "tokens"), ("busy_s", "busy time"))
    for offset, (key, label) in zip((-0.27, 0, 0.27), shares):
        total = sum(n[key] for n in nodes)
        values = [100 * n[key] / total if total else 0 for n in nodes]
        bars = ax.bar(x + offset, values, 0.27, label=label)
        ax.bar_label(bars, labels=[f"{n[key]:.0f}" if key != "busy_s" else f"{n[key]:.1f}s" for n in nodes],
                     fontsize=8, padding=2)
    ax.set_xticks(x, [f"{n['node_id'][:8]}\n{n['actors']} actor(s)" for n in nodes])
    _percent_axis(ax, "% of the job's total of each", ncol=3)
    ax.set_title(f"work per node ({len(nodes)} node(s))")


def _percent_axis(ax, label: str, ncol: int) -> None:
    """0-100 % ticks, with the legend in the headroom above 100 where no bar reaches."""
    ax.set_ylim(0, PERCENT_TOP)
    ax.set_yticks(range(0, 101, 20))
    ax.set_ylabel(label)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper center", ncol=ncol, fontsize=8)


def _plot_latency(ax, latency_bins: dict[str, np.ndarray]) -> None:
    """Box plots from 0, in ms when every sampled latency is under a second, else in s."""
    longest = max((float(v.max()) for v in latency_bins.values() if len(v)), default=0.0)
    unit, scale = ("ms", 1000.0) if longest < 1.0 else ("s", 1.0)
    if latency_bins:
        ax.boxplot([scale * v for v in latency_bins.values()], showfliers=False)
        ax.set_xticks(range(1, len(latency_bins) + 1), list(latency_bins), rotation=30)
    ax.set_ylim(0, 1.1 * scale * longest or 1)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.set_xlabel("generated tokens")
    ax.set_ylabel(f"latency ({unit})")
    ax.set_title("latency by output length")


def _plot_job(ax, stats: dict) -> None:
    """The job's errors (in red when there are any) and the figures the panels leave out, as text."""
    totals = stats["totals"]
    lines = [f"actors: {totals['actors']} ({totals['restarts']} restarts), "
             f"tensor_parallel_size {totals['tensor_parallel_size'] or '?'}",
             f"job wall {totals['wall_s']:.1f} s, {totals['tokens_per_wall_s']:.1f} tok/s of job wall",
             f"busy: {percent(totals['busy_share_of_active'])} of the actors' active time, "
             f"{percent(totals['busy_share_of_wall'])} of actors x job wall", ""]
    errors = [wrapped for line in describe_errors(totals)
              for wrapped in textwrap.wrap(line, 72, subsequent_indent="    ", max_lines=3)]
    text = {"va": "top", "ha": "left", "fontsize": 9, "family": "monospace", "transform": ax.transAxes}
    ax.text(0.0, 1.0, "\n".join(lines), **text)
    ax.text(0.0, 1.0, "\n" * len(lines) + "\n".join(errors), color="tab:red" if totals["error_rows"] else "black",
            **text)
    ax.set_axis_off()
    ax.set_title("the job")
