"""Week over week: each report keeps its key figures in ``figures.json`` beside ``report.html``, and
the next report compares its own with the newest earlier report's, in a section of its own.

``figures.json`` (schema 1)::

    {"schema": 1, "end": "2026-11-30T05:00:00Z", "window": "7d",
     "idle_allocated": 6, "unallocated": 11, "idle_now": 9, "idle_mean": 8.4, "slices_total": 112,
     "gpus_freed": 3, "gpu_hours_per_week": 504, "cost_per_week": 1260.0, "nodes_changed": 2,
     "alerts": 4}

A missing, unreadable or foreign file is no previous report (never an error): the section then says
this is the first report it can compare."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpupilot_common import yamlsafe
from gpupilot_common.paths import file_problem
from rightsizer.report.model import Report

FILE = "figures.json"
DATED = re.compile(r"\d{4}-\d{2}-\d{2}")
"""serve's report folders (``YYYY-MM-DD``)."""
SCHEMA = 1
MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Figures:
    end: str
    window: str
    idle_allocated: int
    """Allocated devices idle all window (the report's first card)."""
    unallocated: int
    """Idle devices no pod holds."""
    idle_now: float | None
    idle_mean: float | None
    slices_total: float | None
    gpus_freed: int
    gpu_hours_per_week: float
    cost_per_week: float | None
    nodes_changed: int
    alerts: int


ROWS: tuple[tuple[str, str, str], ...] = (
    ("idle_allocated", "allocated devices idle all window", "{:.0f}"),
    ("unallocated", "idle devices no pod holds", "{:.0f}"),
    ("idle_mean", "allocated slices idle (mean over the window)", "{:.1f}"),
    ("slices_total", "slices and GPUs in the fleet", "{:.0f}"),
    ("gpus_freed", "GPUs the plan frees", "{:.0f}"),
    ("gpu_hours_per_week", "GPU-hours freed per week", "{:,.0f}"),
    ("cost_per_week", "saved per week", "{:,.0f}"),
    ("nodes_changed", "nodes the plan changes", "{:.0f}"),
    ("alerts", "alerts fired", "{:.0f}"),
)
"""Figure key, what it is, how it is shown: the section's rows, in order."""


def of(report: Report) -> Figures:
    s = report.summary
    return Figures(
        end=report.data.plan.window.end,
        window=s.window,
        idle_allocated=report.idle_pods_total,
        unallocated=sum(u.devices for u in report.unallocated),
        idle_now=s.idle_now,
        idle_mean=s.idle_mean,
        slices_total=s.slices_total,
        gpus_freed=s.gpus_freed,
        gpu_hours_per_week=s.gpu_hours_per_week,
        cost_per_week=s.cost_per_week,
        nodes_changed=s.nodes_changed,
        alerts=s.alerts,
    )


def to_json(figures: Figures) -> str:
    return json.dumps({"schema": SCHEMA, **asdict(figures)}, indent=2, sort_keys=True) + "\n"


def _number(v: Any, *, optional: bool) -> float | None:
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ValueError(v)
    return float(v)


def load(folder: Path) -> Figures | None:
    """The figures a report folder holds, or None (absent, unreadable, too large, not ours)."""
    path = folder / FILE
    try:
        if file_problem(path):
            return None
        doc = json.loads(yamlsafe.read_text(path, max_bytes=MAX_BYTES))
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            return None

        def whole(key: str) -> int:
            return int(_number(doc.get(key), optional=False) or 0)

        def real(key: str) -> float | None:
            return _number(doc.get(key), optional=True)

        return Figures(
            end=str(doc.get("end", ""))[:40],
            window=str(doc.get("window", ""))[:20],
            idle_allocated=whole("idle_allocated"),
            unallocated=whole("unallocated"),
            idle_now=real("idle_now"),
            idle_mean=real("idle_mean"),
            slices_total=real("slices_total"),
            gpus_freed=whole("gpus_freed"),
            gpu_hours_per_week=float(_number(doc.get("gpu_hours_per_week"), optional=False) or 0.0),
            cost_per_week=real("cost_per_week"),
            nodes_changed=whole("nodes_changed"),
            alerts=whole("alerts"),
        )
    except (OSError, ValueError, TypeError):
        return None


def previous(reports_dir: Path, this: Path) -> tuple[str, Figures] | None:
    """The newest dated report folder before ``this`` with figures: (its name, its figures)."""
    try:
        names = sorted((p.name for p in reports_dir.iterdir() if DATED.fullmatch(p.name)), reverse=True)
    except OSError:
        return None
    for name in names:
        if name >= this.name:
            continue
        found = load(reports_dir / name)
        if found is not None:
            return name, found
    return None


def rows(now: Figures, before: Figures) -> list[tuple[str, str, str, str]]:
    """(what, before, now, change) for each figure either report has."""
    out = []
    for key, label, fmt in ROWS:
        a, b = getattr(before, key), getattr(now, key)
        if a is None and b is None:
            continue
        shown_a = "n/a" if a is None else fmt.format(a)
        shown_b = "n/a" if b is None else fmt.format(b)
        change = (
            ""
            if a is None or b is None
            else ("±0" if a == b else ("+" if b > a else "−") + fmt.format(abs(b - a)))
        )
        out.append((label, shown_a, shown_b, change))
    return out
