"""The one idle rule ``report`` ("top idle slices") and ``serve`` (``gpupilot_rightsizer_idle_slices``)
share with ``plan``: a device is idle when it has data and its busiest ``min_busy`` rolling mean in
the whole window stayed below the plan's idle threshold. A slice that bursts for ``min_busy`` minutes
once a day is therefore never idle, however many of its hours are; one without data is unknown.
Without activity counters, idleness comes from compute processes: idle when no hour had one."""

from __future__ import annotations

import math

from rightsizer.plan.model import Evidence, NodePlan, Plan

DEFAULT_THRESHOLD = 0.05


def threshold(plan: Plan) -> float:
    """The plan's ``settings.idle_threshold`` (0-1), or the default when absent or not a ratio."""
    value = plan.settings.get("idle_threshold", DEFAULT_THRESHOLD)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return DEFAULT_THRESHOLD
    return float(value) if 0 <= value <= 1 else DEFAULT_THRESHOLD


def is_idle(e: Evidence, limit: float) -> bool:
    """Idle by the rule above. A device without activity counters but with process counts (Ampere
    MIG: no GPM) is idle only when no hour with data saw a compute process; with neither, unknown."""
    if e.coverage_hours <= 0:
        return False
    if e.peak_activity is not None:
        return e.peak_activity < limit
    return e.p95_activity is None and e.idle_hours >= e.coverage_hours


def idle_devices(plan: Plan) -> list[tuple[NodePlan, Evidence]]:
    """Every device of the plan that is idle by the rule above, in plan order."""
    limit = threshold(plan)
    return [(n, e) for n in plan.nodes for e in n.evidence if is_idle(e, limit)]


def activity_known(node: NodePlan) -> bool:
    """Whether any device pods hold on the node has activity data (else its utilisation is unknown)."""
    return any(e.allocated and e.peak_activity is not None for e in node.evidence)
