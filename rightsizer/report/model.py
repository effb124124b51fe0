"""What the weekly report holds, as data: the numbers :mod:`rightsizer.report.build` works out
and :mod:`rightsizer.report.sections` lays out (each imports this module; neither imports the other
for it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rightsizer.report.data import ReportData
from rightsizer.report.hpas import HpaLine
from rightsizer.report.namespaces import NamespaceUse


@dataclass(frozen=True)
class Change:
    node: str
    model: str
    current: str
    proposed: str
    gpus_freed: int
    slices_freed: int
    gpu_hours_per_week: float
    cost_per_week: float | None
    pods_disrupted: int
    utilisation: str
    cluster: str = ""


@dataclass(frozen=True)
class IdleSlice:
    label: str
    node: str
    device: str
    pod: str
    idle_hours: float
    idle_share: float
    peak_activity: float | None
    """Busiest rolling mean in the window (below the idle threshold, or the device would not be idle)."""
    cluster: str = ""
    allocated: bool = True
    gpu_share: float = 1.0
    """The device's share of a GPU: compute slices over the GPU's (``3g`` on a 7-slice GPU: 3/7)."""

    @property
    def idle_gpu_hours(self) -> float:
        return self.idle_hours * self.gpu_share


@dataclass(frozen=True)
class Unallocated:
    """One node's idle devices that no pod holds (capacity to hand out, not a pod to talk to)."""

    node: str
    model: str
    devices: int
    gpus: float
    """The devices' GPU equivalent (sum of their shares of a GPU)."""
    cluster: str = ""


@dataclass(frozen=True)
class ClusterSummary:
    """One cluster's line of a report over several clusters (the last line, ``fleet``, sums them)."""

    name: str
    nodes: int
    nodes_changed: int
    gpus: int
    gpus_freed: int
    gpu_hours_per_week: float
    cost_per_week: float | None
    pods_disrupted: int


@dataclass(frozen=True)
class Summary:
    window: str
    window_hours: float
    slices_total: float | None
    idle_now: float | None
    idle_mean: float | None
    gpus_freed: int
    gpu_hours_per_week: float
    cost_per_week: float | None
    cost_per_year: float | None
    nodes_changed: int
    alerts: int
    clusters: tuple[ClusterSummary, ...] = ()
    """Per cluster, then the fleet, when the plan covers several clusters; empty otherwise."""


@dataclass(frozen=True)
class Report:
    data: ReportData
    summary: Summary
    changes: tuple[Change, ...]
    idle: tuple[IdleSlice, ...]
    """Allocated devices idle all window (pods to talk to), most idle GPU-hours first, at most :data:`~rightsizer.report.build.TOP_IDLE`."""
    charts: Mapping[str, bytes]
    """File name (``trend.png``) → PNG bytes."""
    unallocated: tuple[Unallocated, ...] = ()
    idle_pods_total: int = 0
    """Allocated devices idle all window, before the cut to :data:`~rightsizer.report.build.TOP_IDLE` (the one idle count)."""
    namespaces: tuple[NamespaceUse, ...] = ()
    namespaces_csv: str = ""
    previous: tuple[str, Any] | None = None
    """The newest earlier report's folder name and figures (:class:`rightsizer.report.weekly.Figures`),
    for the week-over-week section; None: nothing to compare."""
    hpas: tuple[HpaLine, ...] = ()
    """recommend-hpa's answers the report was given (``--hpa-recommendation``), one per HPA."""
