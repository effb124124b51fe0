"""What a plan depends on besides the history (:class:`PlanSettings`, recorded in ``plan.json``):
its own module so that reading a config that holds one (``serve``) does not load the optimiser."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rightsizer.analysis import history as analysis
from rightsizer.clients.chunks import QueryLimits
from rightsizer.optimise.proposal import OptimiserSettings

WEEK_S = 7 * 86400.0


@dataclass(frozen=True)
class PlanSettings:
    """Everything a plan depends on besides the history; recorded in ``plan.json`` under ``settings``."""

    window_s: float = 7 * 86400.0
    headroom: float = 0.2
    """Demand = peak ``min_busy`` rolling-mean activity and peak memory × (1 + headroom)."""
    idle_threshold: float = 0.05
    """A device whose ``min_busy`` rolling mean never reached this is idle; so is an hour without one."""
    min_busy_s: float = 900.0
    """Length of the rolling mean: a burst at least this long always sizes its slice (15 min)."""
    optimiser: OptimiserSettings = field(default_factory=OptimiserSettings)
    cluster_label: str = analysis.CLUSTER
    """Label naming each series' cluster in a multi-cluster store (Thanos, VictoriaMetrics global view)."""
    cluster: str | None = None
    """Plan this cluster only (``None``: every cluster, each optimised on its own)."""
    lookback_s: float = 28 * 86400.0
    """With a window shorter than a week, busy hours are also read this far back (coarsely, from the
    recording rule): a slice busy again every week is kept, and every shrunk slice says when it was
    last busy. ``optimiser.ignore_history`` shrinks them anyway."""
    query_limits: QueryLimits = field(default_factory=QueryLimits)
    """What one query may cost (a large fleet's queries are cut into node groups); not recorded:
    the plan is the same however the queries are cut."""

    @property
    def looks_back(self) -> bool:
        """History past the window is read: the window is shorter than a week and the lookback longer."""
        return self.window_s < WEEK_S and self.lookback_s > self.window_s

    @property
    def window_text(self) -> str:
        return window_text(self.window_s)

    def analysis_settings(self) -> analysis.AnalysisSettings:
        return analysis.AnalysisSettings(
            window_s=self.window_s,
            idle_threshold=self.idle_threshold,
            headroom=self.headroom,
            min_busy_s=self.min_busy_s,
            cluster_label=self.cluster_label,
            limits=self.query_limits,
        )

    def record(self) -> dict[str, Any]:
        o = self.optimiser
        return {
            "max_nodes": o.max_nodes,
            "allow_moves": o.allow_moves,
            "time_limit_s": o.time_limit_s,
            "keep_profiles": o.keep_profiles,
            **({"allow_strategy_change": True} if o.allow_strategy_change else {}),
            **({"grow_for_headroom": list(o.grow_for_headroom)} if o.grow_for_headroom else {}),
            "headroom": self.headroom,
            "idle_threshold": self.idle_threshold,
            "min_busy_s": self.min_busy_s,
            **(
                {"lookback_s": self.lookback_s, "ignore_history": o.ignore_history} if self.looks_back else {}
            ),
            **({"cluster": self.cluster} if self.cluster is not None else {}),
        }


def window_text(seconds: float) -> str:
    """``7d``, ``36h``: a window as the plan records it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
