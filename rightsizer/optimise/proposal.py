"""The optimiser's data: settings, per-device demand items, per-GPU and per-node proposals.

Plain frozen dataclasses shared by :mod:`rightsizer.optimise.node` (one node),
:mod:`rightsizer.optimise.pooling` (nodes pooled under ``--allow-moves``) and :mod:`rightsizer.optimise.fleet`
(the fleet); :mod:`rightsizer.plan.build` turns them into a plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mig_geometry.catalogue import GpuModel
from rightsizer.analysis.types import NodeInventory, PodKey


@dataclass(frozen=True)
class OptimiserSettings:
    max_nodes: int | None = None
    """At most this many nodes change per plan (None: no limit)."""
    allow_moves: bool = False
    """Let pods move across nodes (pool the changing nodes of one model)."""
    time_limit_s: float = 30.0
    """Wall-clock budget for all MILPs together; nodes beyond it get the greedy packing."""
    keep_profiles: bool = False
    """Consolidate only: every pod keeps its current profile (no resource-name change for pods)."""
    min_coverage: float = 0.5
    """A device's data must cover this share of the window before its demand is trusted."""
    time_slicing_below: float = 0.3
    """Whole GPUs whose pod's peak rolling-mean activity stays below this get a time-slicing recommendation."""


@dataclass(frozen=True)
class Item:
    """One device demand: who holds it, what it is now, what class it needs."""

    node: str
    gpu: int
    profile_now: str
    gpu_instance_id: str
    pods: tuple[PodKey, ...]
    klass: str
    busy_slices: float | None
    """p95 activity × compute slices of the current device (no headroom); None when unknown."""


@dataclass
class GpuPlan:
    index: int
    mig_enabled: bool
    counts: dict[str, int]
    items: list[Item] = field(default_factory=list)


@dataclass(frozen=True)
class NodeProposal:
    node: NodeInventory
    model: GpuModel | None
    current: tuple[GpuPlan, ...]
    proposed: tuple[GpuPlan, ...]
    changed: bool
    method: str
    status: str
    lower_bound: int
    used_now: int
    used_after: int
    slices_now: int
    slices_after: int
    busy_slices: float
    moved_in: tuple[Item, ...] = ()
    reason: str = ""
    whole_busy: float = 0.0
    """p95 activity × compute units of whole GPUs held by pods (1 unit per GPU without MIG)."""
    whole_units: int = 0

    @property
    def gpus_freed(self) -> int:
        return max(0, self.used_now - self.used_after) if self.changed else 0

    @property
    def slices_freed(self) -> int:
        return max(0, self.slices_now - self.slices_after) if self.changed else 0

    def utilisation(self, *, after: bool) -> float:
        """Busy share of the GPUs pods use, 0-1: p95 activity × size over the compute of the GPUs in
        use (before: ``used_now``, after: ``used_after``), so a node that frees a GPU shows its
        utilisation rise. Without one known model, over the allocated compute instead."""
        busy = self.busy_slices + self.whole_busy
        later = after and self.changed
        if self.model is not None:
            per_gpu = self.model.compute_slices if self.model.mig_capable else 1
            capacity = (self.used_after if later else self.used_now) * per_gpu
        else:
            capacity = (self.slices_after if later else self.slices_now) + self.whole_units
        return min(1.0, busy / capacity) if capacity else 0.0


@dataclass(frozen=True)
class TimeSlicing:
    node: str
    model: str
    gpus: tuple[int, ...]
    replicas: int
    reason: str


@dataclass(frozen=True)
class FleetProposal:
    nodes: tuple[NodeProposal, ...]
    time_slicing: tuple[TimeSlicing, ...]
    seconds: float
    notes: tuple[str, ...] = ()

    @property
    def lower_bound(self) -> int:
        return sum(n.lower_bound for n in self.nodes)

    @property
    def method(self) -> str:
        methods = {n.method for n in self.nodes if n.method not in ("none", "")}
        return "+".join(sorted(methods)) or "none"

    @property
    def status(self) -> str:
        """Worst solver status among the nodes that change (nodes left alone do not count)."""
        statuses = {n.status for n in self.nodes if n.changed}
        for s in ("time-limit", "heuristic"):
            if s in statuses:
                return s
        return "optimal"
