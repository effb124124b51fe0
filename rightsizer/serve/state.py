"""What ``serve`` knows of its own runs: kept by the scheduler (:mod:`rightsizer.serve.scheduler`,
under its lock) and shown as metrics by :mod:`rightsizer.serve.status`; both import it."""

from __future__ import annotations

import dataclasses
from collections import Counter

from rightsizer.plan.model import Plan


@dataclasses.dataclass
class State:
    last_plan_at: float | None = None
    last_plan_ok: bool | None = None
    last_report_at: float | None = None
    plan: Plan | None = None
    plan_made_at: float = 0.0
    applies: Counter[str] = dataclasses.field(default_factory=Counter)
    runs: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)
    last_skip: str = ""
    paused: str = ""
    """Why auto-apply is paused, as last checked ("" when it is not)."""
    started_at: float = 0.0
    """When the service started (Unix seconds): a job's "last success" until it first succeeds."""
    last_success: dict[str, float] = dataclasses.field(default_factory=dict)
    """job → Unix time of its last successful run."""
    pushes: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)
    """(target, result) → report pushes: webhook or copy, ok or failed."""
    intervals: dict[str, float] = dataclasses.field(default_factory=dict)
    """plan and report → seconds between their scheduled runs (plan.every; a week, or a day for a
    schedule on several days)."""
