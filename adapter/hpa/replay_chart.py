"""The PNG chart of ``replay-hpa``: recorded replicas and each replay's over time (matplotlib's Agg
canvas without pyplot: no global state)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import matplotlib.dates as mdates
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from adapter.hpa.replay import ReplayResult
from gpupilot_common import atomicfile


def write_chart(path: Path, results: Sequence[ReplayResult], *, title: str, max_replicas: int) -> None:
    fig = Figure(figsize=(11, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if results and results[0].steps:
        times = mdates.date2num([datetime.fromtimestamp(s.at, UTC) for s in results[0].steps])  # type: ignore[no-untyped-call]
        recorded = [s.recorded if s.recorded is not None else float("nan") for s in results[0].steps]
        ax.step(times, recorded, where="post", color="0.55", linewidth=1.2, label="recorded")
        for r in results:
            ax.step(
                times,
                [s.replicas for s in r.steps],
                where="post",
                linewidth=1.6,
                label=f"replayed: {r.label}",
            )
        ax.axhline(
            max_replicas, color="tab:red", linestyle=":", linewidth=1, label=f"maxReplicas {max_replicas}"
        )
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M", tz=UTC))  # type: ignore[no-untyped-call]
    ax.set_ylabel("replicas")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    atomicfile.write_bytes(path, buf.getvalue())  # a failed write leaves a previous chart intact
