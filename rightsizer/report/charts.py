"""PNG charts for the weekly report (matplotlib's Agg canvas, no pyplot: no global state, thread-safe)."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC

import matplotlib.dates as mdates
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LinearSegmentedColormap
from matplotlib.figure import Figure

from rightsizer.report.data import AlertSeen, Heatmap, Trend

INK = "#1f2933"
MUTED = "#7b8794"
IDLE = "#d64545"
ALLOCATED = "#3e7cb1"
TOTAL = "#9aa5b1"
FREED = "#2f9e6e"
ACTIVITY = LinearSegmentedColormap.from_list(
    "activity", ["#fdf3e1", "#f7c873", "#e8833a", "#b23a48", "#5c1a33"]
).with_extremes(bad="#cbd2d9")  # no data: unknown, drawn grey (never as 0 % activity)
DPI = 110


def _figure(width: float, height: float) -> Figure:
    # Fixed size + constrained layout (not a tight bbox): every chart is the same pixel width, so
    # they scale alike in the page and their fonts match.
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _style(ax: object) -> None:
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)  # type: ignore[attr-defined]
    ax.spines["left"].set_color(MUTED)  # type: ignore[attr-defined]
    ax.spines["bottom"].set_color(MUTED)  # type: ignore[attr-defined]
    ax.tick_params(colors=INK, labelsize=9)  # type: ignore[attr-defined]
    ax.grid(axis="y", color="#e4e7eb", linewidth=0.8)  # type: ignore[attr-defined]
    ax.set_axisbelow(True)  # type: ignore[attr-defined]


def _title(fig: Figure, title: str) -> None:
    """The chart's title on the figure itself (a PNG opened on its own still says what it shows)."""
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontsize=11, fontweight="bold", color=INK)


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    title = fig.get_suptitle()
    fig.savefig(buf, format="png", facecolor="white", metadata={"Title": title} if title else None)
    return buf.getvalue()


def _days(times: Sequence[float]) -> list[float]:
    """Matplotlib date numbers (days since its 1970 epoch) for Unix seconds."""
    return [t / 86400.0 for t in times]


def _date_axis(ax: object, fmt: str) -> None:
    ax.xaxis_date(tz=UTC)  # type: ignore[attr-defined]
    ax.xaxis.set_major_formatter(mdates.DateFormatter(fmt, tz=UTC))  # type: ignore[attr-defined,no-untyped-call]


def _nan(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else v for v in values]


def trend_chart(trend: Trend, *, title: str = "") -> bytes:
    fig = _figure(10, 3.7)
    _title(fig, title)
    ax = fig.add_subplot()
    x = _days(trend.times)
    ax.plot(x, _nan(trend.total), color=TOTAL, linewidth=1.4, label="slices (total)")
    ax.plot(x, _nan(trend.allocated), color=ALLOCATED, linewidth=1.6, label="allocated to pods")
    idle = _nan(trend.idle)
    ax.fill_between(x, idle, color=IDLE, alpha=0.25, linewidth=0)
    ax.plot(x, idle, color=IDLE, linewidth=1.8, label="allocated but idle")
    ax.set_ylabel("MIG slices + whole GPUs", color=INK, fontsize=9)
    known = [v for v in (*trend.total, *trend.allocated) if v is not None]
    ax.set_ylim(0, max(known, default=1.0) * 1.12 or 1.0)
    _date_axis(ax, "%a %d %b")
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), frameon=False, fontsize=9, ncols=3)
    _style(ax)
    return _png(fig)


def heatmap_chart(heatmap: Heatmap, *, title: str = "") -> bytes:
    rows = max(1, len(heatmap.nodes))
    fig = _figure(10, 1.2 + 0.42 * rows)
    _title(fig, title)
    ax = fig.add_subplot()
    grid = [_nan(r) for r in heatmap.values] or [[math.nan]]
    days = _days(heatmap.hours) or [0.0, 1.0]
    start, end = days[0] - 1 / 48, days[-1] + 1 / 48
    image = ax.imshow(
        grid,
        aspect="auto",
        interpolation="nearest",
        cmap=ACTIVITY,
        vmin=0.0,
        vmax=1.0,
        extent=(start, end, rows - 0.5, -0.5),
    )
    ax.set_yticks(range(len(heatmap.nodes)), labels=list(heatmap.nodes), fontsize=9)
    _date_axis(ax, "%a %d")
    ax.tick_params(colors=INK, labelsize=9)
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    bar = fig.colorbar(image, ax=ax, fraction=0.03, pad=0.01)
    bar.set_label("mean slice activity (grey: unknown)", fontsize=9, color=INK)
    bar.ax.tick_params(labelsize=8)
    return _png(fig)


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
    note: str = ""


def barh_chart(
    bars: Sequence[Bar], *, xlabel: str, color: str, limit: float | None = None, title: str = ""
) -> bytes:
    fig = _figure(10, 1.3 + 0.3 * max(2, len(bars)))
    _title(fig, title)
    ax = fig.add_subplot()
    labels = [b.label for b in bars][::-1]
    values = [b.value for b in bars][::-1]
    ax.barh(labels, values, color=color, height=0.62)
    top = limit if limit is not None else (max(values, default=1.0) * 1.18 or 1.0)
    ax.set_xlim(0, top)
    for y, b in enumerate(list(bars)[::-1]):
        if b.note:
            ax.text(b.value + top * 0.01, y, b.note, va="center", fontsize=8, color=INK)
    ax.set_xlabel(xlabel, color=INK, fontsize=9)
    ax.tick_params(axis="y", labelsize=8.5)
    _style(ax)
    ax.grid(axis="y", visible=False)
    ax.grid(axis="x", color="#e4e7eb", linewidth=0.8)
    return _png(fig)


def alerts_chart(alerts: Sequence[AlertSeen], *, title: str = "") -> bytes:
    minutes: dict[str, float] = {}
    for a in alerts:
        minutes[a.name] = minutes.get(a.name, 0.0) + a.minutes
    bars = [
        Bar(name, m / 60.0, f"{m / 60.0:.1f} h") for name, m in sorted(minutes.items(), key=lambda kv: -kv[1])
    ]
    return barh_chart(
        bars,
        xlabel="hours firing (summed over everything each alert fired for)",
        color="#c17d11",
        title=title,
    )
