"""PNG charts of a benchmark's medians against the session count (matplotlib, ``bench`` extra).

Each chart is one figure or a few, one line per configuration; ``report.md`` puts the
numbers behind it in a table under it. Without matplotlib no chart is drawn and the
report says so; the tables are still there.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.report import label

STEADY_CHARTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Turns completed in the window", "turns.png", ("turns_completed", "limit")),
    ("Turn p50", "turn_p50.png", ("turn_p50_s",)),
    ("RSS peak", "rss.png", ("daemon_rss_peak_mib", "spawner_rss_peak_mib", "total_rss_peak_mib")),
)
BURST_CHARTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "Burst: every reply and every turn done",
        "burst_done.png",
        ("replies_done_s", "turns_done_s"),
    ),
    ("RSS peak", "rss.png", ("daemon_rss_peak_mib", "total_rss_peak_mib")),
)


def draw(
    results: Sequence[dict[str, Any]], configs: Sequence[str], out: Path, burst: bool
) -> tuple[list[tuple[str, str, Sequence[str]]], str | None]:
    """Draw the charts into ``out``; return (title, file, figures) per chart, and why none
    could be drawn (None when they were)."""
    charts = BURST_CHARTS if burst else STEADY_CHARTS
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return list(
            charts
        ), "matplotlib is not installed (pip install -e '.[bench]'), so no chart was drawn"
    sessions = [e["sessions"] for e in results]
    for title, png, names in charts:
        fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
        for name in names:
            for config in configs:
                values = [e["configs"][config]["median"][name] for e in results]
                if all(v is None for v in values):
                    continue
                style = "--" if name == "limit" else "-"
                tag = f" [{config}]" if len(configs) > 1 else ""
                ax.plot(
                    sessions,
                    [float("nan") if v is None else v for v in values],
                    style,
                    marker="o",
                    label=label(name) + tag,
                )
        ax.set_title(title)
        ax.set_xlabel("sessions")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / png)
        plt.close(fig)
    return list(charts), None


def draw_memory(out: Path, runs: Sequence[dict[str, Any]], dirs: Sequence[Path]) -> str | None:
    """memory.png: the daemon's RSS and PSS per second of each run whose CSV is in one of
    ``dirs``; returns the file name, or None when there is nothing to draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    series = []
    for run in runs:
        path = next(
            (d / f"{run['label']}.csv" for d in dirs if (d / f"{run['label']}.csv").exists()), None
        )
        if path is not None:
            with path.open() as handle:
                rows = list(csv.DictReader(handle))
            series.append((run["label"], rows))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    for name, rows in series:
        t = [float(r["t_s"]) for r in rows]
        for column, style in (("daemon_rss_mib", "-"), ("daemon_pss_mib", ":")):
            ax.plot(
                t,
                [float(r[column]) if r[column] else float("nan") for r in rows],
                style,
                label=f"{name} {column[7:10].upper()}",
            )
    ax.set_title("Daemon memory per sample (0 = window start)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "memory.png")
    plt.close(fig)
    return "memory.png"
