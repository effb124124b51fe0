"""The rightsizing plan: a versioned, JSON-serialisable contract between ``plan`` and ``apply``/``report``.

Schema ``gpupilot.plan/v1`` (one JSON object; unknown keys are ignored on load, missing or mistyped
required keys are one-line :class:`PlanError`\\ s)::

    {
      "schema": "gpupilot.plan/v1",
      "plan_id": "3f9c…",                 # sha256 prefix of the plan's content (nodes + window)
      "created_at": "2026-11-29T23:40:00Z",
      "window": {"start": "...Z", "end": "...Z", "duration": "7d"},
      "prometheus_url": "http://prometheus:9090",
      "settings": {"max_nodes": 10, "allow_moves": false, "time_limit_s": 20.0, "keep_profiles": false,
                   "idle_threshold": 0.05, "headroom": 0.2},
      "solver": {"method": "greedy+milp+uniform",   # the per-node methods used, '+'-joined, or "none"
                 "status": "optimal" | "time-limit" | "heuristic",   # worst among changed nodes
                 "lower_bound_gpus": 12, "seconds": 0.8,   # LP bound on GPUs in use after any plan
                 "bound_scope": "nodes" | "fleet",         # of the problem solved: pods on their
                 "fleet_lower_bound_gpus": 11},           # nodes, or moving (--allow-moves); and the
                                                          # LP bound with pods moving, always
      "totals": {"nodes": 4, "nodes_changed": 2, "gpus": 32, "gpus_needed": 20, "gpus_freed": 3,
                 "slices_freed": 11, "pods_disrupted": 5, "pods_admitted": 2},  # admitted: Pending pods served
      "mig_parted_config": {"version": "v1", "mig-configs": {...}},   # every proposed config
      "nodes": [NodePlan, ...],
      "time_slicing": [TimeSlicingRecommendation, ...],
      "strategy_changes": [StrategyChange, ...],   # only with plan --allow-strategy-change; apply ignores it
      "notes": ["..."],
      "cluster_label": "cluster",                   # only when the series carry a cluster label
      "clusters": [{"name": "east", "totals": {...}}, ...]   # several clusters: each one's totals
      "dra": {"nodes": [...], "claim_templates": [...]}      # DRA nodes: modes, claim advice (plan/dra.py)
    }

    NodePlan = {
      "cluster": "east",                           # only when the series carry a cluster label
      "name": "gpu-node-1", "model": "H100 80GB", "pci_device_id": "0x2330",
      "mig_strategy": "mixed" | "single" | "none", "changed": true,
      "current_config_name": "all-balanced",       # node label nvidia.com/mig.config ("" if unknown)
      "current": [GpuLayout, ...], "proposed": [GpuLayout, ...],
      "config_name": "gpupilot-1a2b3c4d5e",         # "gpupilot-" + sha256 prefix of the entries
      "config_document": {"version": "v1", "mig-configs": {"gpupilot-1a2b3c4d5e": [...]}},
      "slices_freed": 4, "gpus_freed": 1,
      "expected_utilisation": 0.61, "current_utilisation": 0.32,   # demand / allocated slices, 0-1
      "pods_disrupted": [{"namespace": "ml", "name": "infer-0",       # apply evicts exactly these
                          "devices": [{"gpu": 0, "profile": "3g.40gb", "gpu_instance_id": "1",
                                       "uuid": "MIG-…"}],
                          "targets": [{"node": "gpu-node-1", "gpu": 0, "profile": "1g.10gb"}]}],
      "pods_kept": [...],        # same shape: GPU pods seen on GPUs that keep their layout (not evicted)
      "evidence": [Evidence, ...],
      "gpus_in_use": 3,          # GPUs holding pods after the plan (0 in plans written before it)
      "lower_bound_gpus": 2,     # no layout holds the node's pods on fewer GPUs; gap = in use - bound
      "reason": "...",           # only when set: why the node stays as it is (e.g. a repack only)
      "pods_admitted": [{"namespace": "ml", "name": "wait-0", "resource": "nvidia.com/mig-1g.10gb",
                         "count": 1, "gpus": [2]}]   # Pending pods the change makes room for
    }
    GpuLayout = {"index": 0, "mig_enabled": true, "mig_devices": {"3g.40gb": 1, "1g.10gb": 4}}
    Evidence = {"gpu": 0, "profile": "1g.10gb", "gpu_instance_id": "7", "allocated": true,
                "pod": "ml/infer-0", "idle_hours": 150.0, "p95_activity": 0.02,
                "coverage_hours": 168.0, "window_hours": 168.0,   # p95_activity null = no data
                "peak_activity": 0.04, "peak_at": "2026-11-29T03:00:00Z",  # highest rolling mean (sizes)
                "busy_minutes": 15.0}                                       # length of that mean
    StrategyChange = {"node": "a100-single-1", "model": "A100 40GB", "strategy": "mixed",
                "proposed": [GpuLayout, ...], "config_name": "gpupilot-…", "config_document": {...},
                "gpus_freed": 2, "slices_freed": 3, "single_gpus_freed": 0, "pods_disrupted": 6,
                "reason": "..."}
    TimeSlicingRecommendation = {"node": "l4-node-1", "model": "L4", "gpus": [0, 1], "replicas": 4,
                "reason": "...", "config_document": {"version": "v1", "flags": {...}, "sharing": {...}}}

Several clusters (``plan --cluster-label``, a Thanos/VictoriaMetrics global view): every node and
time-slicing recommendation carries its ``cluster``; ``totals`` are the fleet's, ``clusters`` holds each
cluster's, and a node is named by cluster and name together (the same name may be in two clusters).
A plan without ``cluster`` keys (any plan written before them) is one unnamed cluster ``""``.

``mig_devices`` is exactly mig-parted's map (profile name → count); ``mig_enabled: false`` carries
an empty map. ``config_document`` is a complete mig-parted file, ready to go under
``data["config.yaml"]`` of the MIG Manager's ConfigMap.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from gpupilot_common import atomicfile, checked
from rightsizer.errors import InputError
from rightsizer.plan import codec

SCHEMA = "gpupilot.plan/v1"

JsonDict = dict[str, Any]


class PlanError(InputError, ValueError):
    """A plan file that cannot be read; the message is one line naming the file and field."""


@dataclass(frozen=True)
class GpuLayout:
    """One GPU's MIG state as mig-parted describes it."""

    index: int
    mig_enabled: bool
    mig_devices: Mapping[str, int] = field(default_factory=dict, metadata=codec.COUNTS)


@dataclass(frozen=True)
class HeldDevice:
    """A device a pod holds: a whole GPU (``profile == ""``) or a MIG instance."""

    gpu: int
    profile: str = ""
    gpu_instance_id: str = ""
    uuid: str = ""


@dataclass(frozen=True)
class TargetDevice:
    """A device the plan gives a pod after the change (a MIG profile on a GPU of a node)."""

    node: str
    gpu: int
    profile: str


@dataclass(frozen=True)
class DisruptedPod:
    """A GPU pod of a node: the devices it holds now and, when the plan moves it, those it gets."""

    namespace: str
    name: str
    devices: tuple[HeldDevice, ...] = ()
    targets: tuple[TargetDevice, ...] = field(default=(), metadata=codec.OMIT_EMPTY)


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """Why a device's slices are judged idle or busy, measured over the window."""

    gpu: int
    profile: str = ""
    gpu_instance_id: str = ""
    allocated: bool
    pod: str = ""
    idle_hours: float = field(metadata=codec.digits(3))
    p95_activity: float | None = field(metadata=codec.digits(4))
    """95th percentile of activity (0-1); ``None`` when there was no data ("unknown", not idle)."""
    coverage_hours: float = field(metadata=codec.digits(3))
    window_hours: float = field(metadata=codec.digits(3))
    peak_activity: float | None = field(default=None, metadata=codec.digits(4))
    """Highest ``busy_minutes`` rolling mean activity in the window (what sizing uses); ``None``: unknown."""
    peak_at: str = ""
    """Start of the hour holding the peak, ``2026-11-29T03:00:00Z``."""
    busy_minutes: float = field(default=15.0, metadata=codec.digits(3))


@dataclass(frozen=True, kw_only=True)
class AdmittedPod:
    """A Pending pod the node's change makes room for (the scheduler places it once applied)."""

    namespace: str
    name: str
    resource: str
    """``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>``."""
    count: int = 1
    gpus: tuple[int, ...] = ()
    """GPUs whose new slots (or freed whole GPU) fit the request."""


@dataclass(frozen=True, kw_only=True)
class NodePlan:
    cluster: str = field(default="", metadata=codec.OMIT_EMPTY)
    """The node's cluster (``""``: the series carry no cluster label, one unnamed cluster)."""
    name: str
    model: str
    pci_device_id: str
    mig_strategy: str = "mixed"
    changed: bool
    current_config_name: str = ""
    current: tuple[GpuLayout, ...]
    proposed: tuple[GpuLayout, ...]
    config_name: str
    config_document: Mapping[str, Any] = field(metadata=codec.MIG_DOC)
    slices_freed: int
    gpus_freed: int
    expected_utilisation: float = field(metadata=codec.digits(4))
    current_utilisation: float = field(default=0.0, metadata=codec.digits(4))
    pods_disrupted: tuple[DisruptedPod, ...] = ()
    """Pods apply evicts (see :mod:`rightsizer.plan.disruption`)."""
    pods_kept: tuple[DisruptedPod, ...] = ()
    """GPU pods the plan saw on the node that keep their device (their GPU keeps its layout)."""
    evidence: tuple[Evidence, ...] = ()
    gpus_in_use: int = 0
    """GPUs holding pods after the plan (before it, when the node does not change)."""
    lower_bound_gpus: int = 0
    """No layout holds the node's pods on fewer GPUs (pods staying on their node)."""
    reason: str = field(default="", metadata=codec.OMIT_EMPTY)
    """Why a node that could do better does not change (empty when it changes or is optimal)."""
    pods_admitted: tuple[AdmittedPod, ...] = ()
    """Pending pods the change makes room for."""

    @property
    def gap(self) -> int:
        """GPUs in use above the bound: 0 when the plan is proven optimal for the node."""
        return max(0, self.gpus_in_use - self.lower_bound_gpus)


@dataclass(frozen=True, kw_only=True)
class TimeSlicingRecommendation:
    cluster: str = field(default="", metadata=codec.OMIT_EMPTY)
    node: str
    model: str
    gpus: tuple[int, ...]
    replicas: int
    reason: str = ""
    config_document: Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class StrategyChange:
    """``plan --allow-strategy-change``: a single-strategy node that frees more under the mixed
    strategy. A recommendation only: ``apply`` does not act on it (the device plugin's strategy is
    not the rightsizer's to change)."""

    cluster: str = field(default="", metadata=codec.OMIT_EMPTY)
    node: str
    model: str
    strategy: str = "mixed"
    """The strategy the node would move to."""
    proposed: tuple[GpuLayout, ...]
    config_name: str
    config_document: Mapping[str, Any]
    gpus_freed: int
    slices_freed: int
    single_gpus_freed: int = 0
    """What the node's best uniform (single-strategy) layout frees, for comparison."""
    pods_disrupted: int
    """Every GPU pod of the node: each one's request changes from nvidia.com/gpu to a MIG profile."""
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class Totals:
    nodes: int
    nodes_changed: int
    gpus: int
    gpus_needed: int
    gpus_freed: int
    slices_freed: int
    pods_disrupted: int
    pods_admitted: int = 0
    """Pending pods the plan makes room for (0 in plans written before pending demand was read)."""


@dataclass(frozen=True)
class SolverInfo:
    method: str
    status: str
    lower_bound_gpus: int
    """LP bound on the GPUs holding pods after any plan of the problem solved (``bound_scope``)."""
    seconds: float = field(metadata=codec.digits(3))
    bound_scope: str = "nodes"
    """``nodes``: pods stay on their nodes; ``fleet``: pods may move among the mixed-strategy nodes of
    their GPU model (``--allow-moves``). Plans written before it: ``nodes``."""
    fleet_lower_bound_gpus: int = 0
    """LP bound with pods free to move, whatever the plan allowed (0 in plans written before it)."""

    @property
    def gap_text(self) -> str:
        """What the bound bounds, in words."""
        return "over the fleet, pods moving" if self.bound_scope == "fleet" else "with pods on their nodes"


@dataclass(frozen=True)
class Window:
    start: str
    end: str
    duration: str


@dataclass(frozen=True)
class ClusterTotals:
    name: str
    totals: Totals


@dataclass(frozen=True, kw_only=True)
class Plan:
    schema: str = SCHEMA
    """The plan format's version (``apply`` refuses another)."""
    plan_id: str
    """Stable id from what the plan proposes and its window (``apply`` and the report name it)."""
    created_at: str
    """When the plan was made, RFC 3339 UTC."""
    window: Window
    """The history the plan is based on (``duration`` in seconds)."""
    prometheus_url: str
    """Where the history was read."""
    settings: Mapping[str, Any] = field(default_factory=dict)
    """The settings the plan was made with (headroom, percentile, …)."""
    solver: SolverInfo
    """How the layouts were found: ``method``, ``status``, ``seconds``, the lower bound of GPUs."""
    totals: Totals
    """The fleet's sums (``pods_disrupted``: pods restarted by applying the plan)."""
    mig_parted_config: Mapping[str, Any] = field(metadata=codec.MIG_DOC)
    """The mig-parted config holding every proposed layout (what ``apply`` installs)."""
    nodes: tuple[NodePlan, ...]
    """One per node: its current and proposed layout per GPU, what changes and the evidence."""
    time_slicing: tuple[TimeSlicingRecommendation, ...] = ()
    """Time-slicing advice for GPUs that MIG does not fit."""
    strategy_changes: tuple[StrategyChange, ...] = field(default=(), metadata=codec.OMIT_EMPTY)
    """``--allow-strategy-change`` recommendations (not applied by ``apply``)."""
    notes: tuple[str, ...] = ()
    """What the plan could not see or chose to leave, one line each."""
    cluster_label: str = field(default="", metadata=codec.OMIT_EMPTY)
    """The label that named the clusters; ``""`` in a plan of one cluster."""
    clusters: tuple[ClusterTotals, ...] = field(default=(), metadata=codec.OMIT_EMPTY)
    """Per-cluster totals of a plan over several clusters (``totals`` is then the fleet's)."""
    dra: Mapping[str, Any] = field(default_factory=dict, metadata=codec.OMIT_EMPTY)
    """DRA nodes' modes and ResourceClaimTemplate advice; empty without DRA."""

    def node(self, name: str, cluster: str | None = None) -> NodePlan | None:
        """The node ``name`` (of ``cluster``, when given: names are unique within one cluster only)."""
        return next(
            (n for n in self.nodes if n.name == name and (cluster is None or n.cluster == cluster)), None
        )

    @property
    def cluster_names(self) -> tuple[str, ...]:
        """The clusters of the plan's nodes, sorted; ``("",)`` for a single-cluster plan."""
        return tuple(sorted({n.cluster for n in self.nodes})) or ("",)

    @property
    def multi_cluster(self) -> bool:
        return len(self.cluster_names) > 1

    @property
    def changed_nodes(self) -> tuple[NodePlan, ...]:
        return tuple(n for n in self.nodes if n.changed)


# ---------------------------------------------------------------------------------------------- naming


def content_hash(obj: object, *, length: int = 10) -> str:
    """sha256 prefix of the canonical JSON of ``obj`` (sorted keys): stable across runs."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def config_name_for(entries: Sequence[Mapping[str, Any]]) -> str:
    """``gpupilot-<hash>``: the same layout always gets the same config name."""
    return f"gpupilot-{content_hash(list(entries))}"


# ---------------------------------------------------------------------------------------------- dump


def plan_to_dict(plan: Plan) -> JsonDict:
    """``plan`` as the JSON object ``plan.json`` holds (the dataclasses' fields, :mod:`codec`)."""
    return codec.to_json(plan)


def dump_plan(plan: Plan, path: Path) -> None:
    """Write ``plan`` as indented JSON (stable key order) to ``path``, atomically: a failed write
    (full disk, crash) leaves the previous plan intact (:class:`atomicfile.WriteFailed`). orjson
    writes it, node by node (:func:`plan_json_chunks`): Python's own encoder goes character by
    character once it indents (a 286 MB plan of 80,000 GPUs took about a minute), and the whole
    document as one object tree took as much memory as the plan itself."""
    atomicfile.write_chunks(path, plan_json_chunks(plan))


_NODES = "@@gpupilot-plan-nodes@@"


def plan_json_chunks(plan: Plan) -> Iterator[bytes]:
    """``plan`` as the bytes of ``orjson.dumps(plan_to_dict(plan), option=OPT_INDENT_2) + b"\\n"``,
    in pieces: everything but the nodes, then one node at a time, indented as in the whole."""
    head = plan_to_dict(replace(plan, nodes=()))
    head["nodes"] = _NODES
    before, _, after = orjson.dumps(head, option=orjson.OPT_INDENT_2).partition(orjson.dumps(_NODES))
    if not plan.nodes:
        yield before + b"[]" + after + b"\n"
        return
    yield before + b"["
    for i, node in enumerate(plan.nodes):
        text = orjson.dumps(codec.to_json(node), option=orjson.OPT_INDENT_2)
        yield (b",\n" if i else b"\n") + b"\n".join(b"    " + line for line in text.split(b"\n"))
    yield b"\n  ]" + after + b"\n"


# ---------------------------------------------------------------------------------------------- load


def plan_from_dict(data: object, *, source: str = "plan") -> Plan:
    """A plan from already-decoded data (no lines known): errors read ``source: field.path: problem``."""
    return _plan(checked.Document(data, source=source, error=PlanError))


def _plan(doc: checked.Document) -> Plan:
    r = codec.top(doc)
    schema = r.typed("schema", str, "a string")
    if schema != SCHEMA:
        raise doc.fail(("schema",), f"is {schema!r}; this gpupilot reads {SCHEMA!r} (re-run 'plan')")
    plan: Plan = codec.from_json(Plan, r)
    return plan


MAX_PLAN_BYTES = 1024 * 2**20
"""Largest plan file read (1 GiB): a plan grows by about 30 KB per node (28 MB for 1,000 nodes of
8 GPUs), so 10,000 nodes write about 300 MB."""


def load_plan(path: Path) -> Plan:
    """Read a plan file; every problem is one :class:`PlanError` line, ``file:line: field.path:
    problem`` (the line of the field, found from the JSON text when a problem is reported)."""
    return _plan(checked.load_json(path, error=PlanError, what="plan", max_bytes=MAX_PLAN_BYTES))


def plan_id_for(*, nodes: Sequence[NodePlan], window: Window) -> str:
    """Stable id from what the plan proposes and the window it is based on."""
    return content_hash(
        {
            "window": [window.start, window.end],
            "nodes": [
                [
                    *([n.cluster] if n.cluster else []),
                    n.name,
                    n.config_name,
                    [dict(g.mig_devices) for g in n.proposed],
                ]
                for n in nodes
            ],
        },
        length=16,
    )
