"""The optimiser's data: settings, per-device demand items, per-GPU and per-node proposals.

Plain frozen dataclasses shared by :mod:`rightsizer.optimise.node` (one node),
:mod:`rightsizer.optimise.pooling` (nodes pooled under ``--allow-moves``) and :mod:`rightsizer.optimise.fleet`
(the fleet); :mod:`rightsizer.plan.build` turns them into a plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from mig_geometry.catalogue import GpuModel
from rightsizer.analysis.types import NodeInventory, PendingPod, PodKey


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
    allow_strategy_change: bool = False
    """Also answer single-strategy nodes as if they moved to the mixed strategy (a recommendation)."""
    ignore_history: bool = False
    """Shrink slices whose busy hours before the window recur weekly, as if the window were all."""
    min_coverage: float = 0.5
    """A device's data must cover this share of the window before its demand is trusted."""
    time_slicing_below: float = 0.3
    """Whole GPUs whose pod's peak rolling-mean activity stays below this get a time-slicing recommendation."""
    grow_for_headroom: tuple[str, ...] = ()
    """Namespaces whose pods get a larger slice for the headroom alone (``*``: every namespace). A
    pod's slice otherwise grows only when its peak itself does not fit it: a restart for headroom
    is the operator's call."""

    def grows_for_headroom(self, namespace: str) -> bool:
        return "*" in self.grow_for_headroom or namespace in self.grow_for_headroom


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
    last_busy: float | None = None
    """Last hour before the window in which the device needed more than its class (``--lookback``)."""
    weekly: bool = False
    """That past demand recurs at the same hour every week: the device keeps its profile (unless
    ``ignore_history``)."""
    growth: str = ""
    """Why the class is larger than the profile now (``peak``: the peak itself does not fit it;
    ``headroom``: the headroom alone, for a namespace that asked), or ``kept``: the headroom alone
    would grow it and it keeps its profile; ``""`` otherwise."""
    peak_need: str = ""
    """The peak the class is sized for, in words (for the plan's notes on growth)."""


@dataclass
class GpuPlan:
    index: int
    mig_enabled: bool
    counts: dict[str, int]
    items: list[Item] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Admission:
    """A Pending pod the node's change makes room for: the GPUs whose new slots (or freed whole
    GPUs) fit its request."""

    pod: PendingPod
    gpus: tuple[int, ...]


class NodeInconsistency(Exception):
    """An internal consistency check failed for one node (a proposed layout without a placement, a
    device left without a slot): that node is left as it is, with the reason as its note."""


@dataclass(frozen=True, kw_only=True)
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
    admits: tuple[Admission, ...] = ()
    """Pending pods this change makes room for (:mod:`rightsizer.optimise.pending`)."""
    strategy_change: NodeProposal | None = None
    """``allow_strategy_change``: a single-strategy node's better answer under the mixed strategy
    (a recommendation: the device plugin's strategy is not the rightsizer's to change)."""
    whole_busy: float = 0.0
    """p95 activity × compute units of whole GPUs held by pods (1 unit per GPU without MIG)."""
    whole_units: int = 0

    @property
    def gap(self) -> int:
        """GPUs in use after the plan above the lower bound (0: proven optimal)."""
        return max(0, self.used_after - self.lower_bound)

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
    moves: bool = False
    """Pods may move among the nodes of their GPU model (``--allow-moves``)."""
    moves_bound: int | None = None
    """LP bound on the GPUs holding pods when pods may move (computed with or without ``moves``)."""

    @property
    def node_bound(self) -> int:
        """The nodes' own bounds summed: no plan keeping pods on their nodes needs fewer GPUs."""
        return sum(n.lower_bound for n in self.nodes)

    @property
    def lower_bound(self) -> int:
        """The bound of the problem this plan solves: fleet-wide with moves, else per node."""
        if self.moves and self.moves_bound is not None:
            return self.moves_bound
        return self.node_bound

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


def with_changes(p: NodeProposal, **changes: object) -> NodeProposal:
    return replace(p, **changes)  # type: ignore[arg-type]
