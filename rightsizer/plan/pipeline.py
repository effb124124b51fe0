"""Prometheus → plan in one call (analysis, optimiser, plan building): the one pipeline ``plan``,
``report`` and ``serve`` share, with the user's settings typed in :class:`PlanSettings`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpupilot_common.timefmt import format_time
from rightsizer.analysis import history as analysis
from rightsizer.analysis import lookback, pending
from rightsizer.clients.chunks import QueryLimits
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.errors import RightsizerError
from rightsizer.migparted.config import MigPartedConfig
from rightsizer.optimise import fleet as optimiser
from rightsizer.plan import build as planning
from rightsizer.plan import clusters
from rightsizer.plan.model import Plan

WEEK_S = 7 * 86400.0


class NoInventoryError(RightsizerError, RuntimeError):
    """Prometheus has no ``gpupilot_gpu_info`` at the end of the window: nothing to plan."""


class UnknownClusterError(RightsizerError, LookupError):
    """``--cluster NAME`` names no cluster of the inventory."""


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
    optimiser: optimiser.OptimiserSettings = field(default_factory=optimiser.OptimiserSettings)
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
            "headroom": self.headroom,
            "idle_threshold": self.idle_threshold,
            "min_busy_s": self.min_busy_s,
            **(
                {"lookback_s": self.lookback_s, "ignore_history": o.ignore_history} if self.looks_back else {}
            ),
            **({"cluster": self.cluster} if self.cluster is not None else {}),
        }


def make_plan(
    client: PrometheusClient,
    *,
    end: float,
    settings: PlanSettings,
    progress: Callable[[str], None] = lambda _m: None,
    cluster_configs: Sequence[MigPartedConfig] = (),
) -> Plan:
    """Analyse the window ending at ``end``, optimise, build the plan; :class:`NoInventoryError` when
    the exporter's inventory is missing at ``end``. ``cluster_configs``: the cluster's mig-parted
    configs, whose names a proposed layout equal to one of them reuses (``plan --mig-config``).

    Several clusters (series labelled ``settings.cluster_label``): each is optimised and planned on its
    own, exactly as if its history were alone, and the plans merged (:mod:`rightsizer.plan.clusters`);
    ``settings.cluster`` keeps one (:class:`UnknownClusterError` when the inventory has no such cluster)."""
    result = analysis.analyse(client, end=end, settings=settings.analysis_settings(), progress=progress)
    if not result.nodes:
        raise NoInventoryError(
            f"no gpupilot_gpu_info series at {format_time(end)} in {client.url}; is the exporter scraped? "
            "(use --at for history that ended earlier)"
        )
    result = replace(
        result, pending=pending.read_pending(client, at=end, cluster_label=settings.cluster_label)
    )
    if settings.looks_back:
        progress(f"reading busy hours up to {window_text(settings.lookback_s)} back (--lookback)")
        result, note = lookback.attach(
            client,
            result,
            settings=lookback.LookbackSettings(
                lookback_s=settings.lookback_s,
                idle_threshold=settings.idle_threshold,
                headroom=settings.headroom,
                cluster_label=settings.cluster_label,
            ),
        )
        if note:
            result = replace(result, notes=(*result.notes, note))
    names = result.clusters
    if settings.cluster is not None:
        if settings.cluster not in names:
            known = ", ".join(clusters.shown(c) for c in names)
            raise UnknownClusterError(
                f"--cluster {settings.cluster!r}: no such {settings.cluster_label} label value in the "
                f"inventory at {format_time(end)} (clusters: {known})"
            )
        names = (settings.cluster,)
    parts = []
    for name in names:
        part = result.for_cluster(name)
        where = f" in cluster {clusters.shown(name)}" if name else ""
        progress(f"optimising {len(part.nodes)} node(s), {len(part.devices)} device(s){where}")
        fleet = optimiser.optimise(part, settings=settings.optimiser)
        parts.append(
            planning.build_plan(
                part,
                fleet,
                context=planning.PlanContext(
                    window=settings.window_text,
                    settings=settings.record(),
                    cluster_configs=cluster_configs,
                    cluster_label=settings.cluster_label,
                ),
            )
        )
    return clusters.merge(parts)


def window_text(seconds: float) -> str:
    """``7d``, ``36h``: a window as the plan records it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
