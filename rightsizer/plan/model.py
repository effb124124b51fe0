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
                 "lower_bound_gpus": 12, "seconds": 0.8},  # LP bound on GPUs in use after the plan
      "totals": {"nodes": 4, "nodes_changed": 2, "gpus": 32, "gpus_needed": 20, "gpus_freed": 3,
                 "slices_freed": 11, "pods_disrupted": 5},
      "mig_parted_config": {"version": "v1", "mig-configs": {...}},   # every proposed config
      "nodes": [NodePlan, ...],
      "time_slicing": [TimeSlicingRecommendation, ...],
      "notes": ["..."],
      "cluster_label": "cluster",                   # only when the series carry a cluster label
      "clusters": [{"name": "east", "totals": {...}}, ...]   # several clusters: each one's totals
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
      "evidence": [Evidence, ...]
    }
    GpuLayout = {"index": 0, "mig_enabled": true, "mig_devices": {"3g.40gb": 1, "1g.10gb": 4}}
    Evidence = {"gpu": 0, "profile": "1g.10gb", "gpu_instance_id": "7", "allocated": true,
                "pod": "ml/infer-0", "idle_hours": 150.0, "p95_activity": 0.02,
                "coverage_hours": 168.0, "window_hours": 168.0,   # p95_activity null = no data
                "peak_activity": 0.04, "peak_at": "2026-11-29T03:00:00Z",  # highest rolling mean (sizes)
                "busy_minutes": 15.0}                                       # length of that mean
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupilot_common import atomicfile, checked
from gpupilot_common.checked import FieldPath
from rightsizer.errors import InputError

SCHEMA = "gpupilot.plan/v1"

JsonDict = dict[str, Any]


class PlanError(InputError, ValueError):
    """A plan file that cannot be read; the message is one line naming the file and field."""


@dataclass(frozen=True)
class GpuLayout:
    """One GPU's MIG state as mig-parted describes it."""

    index: int
    mig_enabled: bool
    mig_devices: Mapping[str, int] = field(default_factory=dict)


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
    targets: tuple[TargetDevice, ...] = ()


@dataclass(frozen=True)
class Evidence:
    """Why a device's slices are judged idle or busy, measured over the window."""

    gpu: int
    profile: str
    gpu_instance_id: str
    allocated: bool
    pod: str
    idle_hours: float
    p95_activity: float | None
    """95th percentile of activity (0-1); ``None`` when there was no data ("unknown", not idle)."""
    coverage_hours: float
    window_hours: float
    peak_activity: float | None = None
    """Highest ``busy_minutes`` rolling mean activity in the window (what sizing uses); ``None``: unknown."""
    peak_at: str = ""
    """Start of the hour holding the peak, ``2026-11-29T03:00:00Z``."""
    busy_minutes: float = 15.0


@dataclass(frozen=True)
class NodePlan:
    name: str
    model: str
    pci_device_id: str
    mig_strategy: str
    changed: bool
    current_config_name: str
    current: tuple[GpuLayout, ...]
    proposed: tuple[GpuLayout, ...]
    config_name: str
    config_document: Mapping[str, Any]
    slices_freed: int
    gpus_freed: int
    expected_utilisation: float
    current_utilisation: float
    pods_disrupted: tuple[DisruptedPod, ...] = ()
    """Pods apply evicts (see :mod:`rightsizer.plan.disruption`)."""
    evidence: tuple[Evidence, ...] = ()
    pods_kept: tuple[DisruptedPod, ...] = ()
    """GPU pods the plan saw on the node that keep their device (their GPU keeps its layout)."""
    cluster: str = ""
    """The node's cluster (``""``: the series carry no cluster label, one unnamed cluster)."""


@dataclass(frozen=True)
class TimeSlicingRecommendation:
    node: str
    model: str
    gpus: tuple[int, ...]
    replicas: int
    reason: str
    config_document: Mapping[str, Any]
    cluster: str = ""


@dataclass(frozen=True)
class Totals:
    nodes: int
    nodes_changed: int
    gpus: int
    gpus_needed: int
    gpus_freed: int
    slices_freed: int
    pods_disrupted: int


@dataclass(frozen=True)
class SolverInfo:
    method: str
    status: str
    lower_bound_gpus: int
    seconds: float


@dataclass(frozen=True)
class Window:
    start: str
    end: str
    duration: str


@dataclass(frozen=True)
class ClusterTotals:
    name: str
    totals: Totals


@dataclass(frozen=True)
class Plan:
    plan_id: str
    created_at: str
    window: Window
    prometheus_url: str
    settings: Mapping[str, Any]
    solver: SolverInfo
    totals: Totals
    mig_parted_config: Mapping[str, Any]
    nodes: tuple[NodePlan, ...]
    time_slicing: tuple[TimeSlicingRecommendation, ...] = ()
    notes: tuple[str, ...] = ()
    schema: str = SCHEMA
    cluster_label: str = ""
    """The label that named the clusters; ``""`` in a plan of one cluster."""
    clusters: tuple[ClusterTotals, ...] = ()
    """Per-cluster totals of a plan over several clusters (``totals`` is then the fleet's)."""

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
    def layout(g: GpuLayout) -> JsonDict:
        return {
            "index": g.index,
            "mig_enabled": g.mig_enabled,
            "mig_devices": dict(sorted(g.mig_devices.items())),
        }

    def pod(p: DisruptedPod) -> JsonDict:
        out: JsonDict = {
            "namespace": p.namespace,
            "name": p.name,
            "devices": [
                {"gpu": d.gpu, "profile": d.profile, "gpu_instance_id": d.gpu_instance_id, "uuid": d.uuid}
                for d in p.devices
            ],
        }
        if p.targets:
            out["targets"] = [{"node": t.node, "gpu": t.gpu, "profile": t.profile} for t in p.targets]
        return out

    def evidence(e: Evidence) -> JsonDict:
        return {
            "gpu": e.gpu,
            "profile": e.profile,
            "gpu_instance_id": e.gpu_instance_id,
            "allocated": e.allocated,
            "pod": e.pod,
            "idle_hours": round(e.idle_hours, 3),
            "p95_activity": None if e.p95_activity is None else round(e.p95_activity, 4),
            "coverage_hours": round(e.coverage_hours, 3),
            "window_hours": round(e.window_hours, 3),
            "peak_activity": None if e.peak_activity is None else round(e.peak_activity, 4),
            "peak_at": e.peak_at,
            "busy_minutes": round(e.busy_minutes, 3),
        }

    def node(n: NodePlan) -> JsonDict:
        return {
            **({"cluster": n.cluster} if n.cluster else {}),
            "name": n.name,
            "model": n.model,
            "pci_device_id": n.pci_device_id,
            "mig_strategy": n.mig_strategy,
            "changed": n.changed,
            "current_config_name": n.current_config_name,
            "current": [layout(g) for g in n.current],
            "proposed": [layout(g) for g in n.proposed],
            "config_name": n.config_name,
            "config_document": n.config_document,
            "slices_freed": n.slices_freed,
            "gpus_freed": n.gpus_freed,
            "expected_utilisation": round(n.expected_utilisation, 4),
            "current_utilisation": round(n.current_utilisation, 4),
            "pods_disrupted": [pod(p) for p in n.pods_disrupted],
            "pods_kept": [pod(p) for p in n.pods_kept],
            "evidence": [evidence(e) for e in n.evidence],
        }

    def totals(t: Totals) -> JsonDict:
        return {
            "nodes": t.nodes,
            "nodes_changed": t.nodes_changed,
            "gpus": t.gpus,
            "gpus_needed": t.gpus_needed,
            "gpus_freed": t.gpus_freed,
            "slices_freed": t.slices_freed,
            "pods_disrupted": t.pods_disrupted,
        }

    clusters: JsonDict = {"cluster_label": plan.cluster_label} if plan.cluster_label else {}
    if plan.clusters:
        clusters["clusters"] = [{"name": c.name, "totals": totals(c.totals)} for c in plan.clusters]
    return {
        "schema": plan.schema,
        "plan_id": plan.plan_id,
        "created_at": plan.created_at,
        "window": {"start": plan.window.start, "end": plan.window.end, "duration": plan.window.duration},
        "prometheus_url": plan.prometheus_url,
        "settings": dict(plan.settings),
        "solver": {
            "method": plan.solver.method,
            "status": plan.solver.status,
            "lower_bound_gpus": plan.solver.lower_bound_gpus,
            "seconds": round(plan.solver.seconds, 3),
        },
        "totals": totals(plan.totals),
        "mig_parted_config": plan.mig_parted_config,
        "nodes": [node(n) for n in plan.nodes],
        "time_slicing": [
            {
                **({"cluster": t.cluster} if t.cluster else {}),
                "node": t.node,
                "model": t.model,
                "gpus": list(t.gpus),
                "replicas": t.replicas,
                "reason": t.reason,
                "config_document": t.config_document,
            }
            for t in plan.time_slicing
        ],
        "notes": list(plan.notes),
        **clusters,
    }


def dump_plan(plan: Plan, path: Path) -> None:
    """Write ``plan`` as indented JSON (stable key order) to ``path``, atomically: a failed write
    (full disk, crash) leaves the previous plan intact (:class:`atomicfile.WriteFailed`)."""
    atomicfile.write_text(path, json.dumps(plan_to_dict(plan), indent=2, sort_keys=False) + "\n")


# ---------------------------------------------------------------------------------------------- load


class _Reader:
    """Typed access to one JSON object of a :class:`checked.Document`, raising one-line errors in
    the project's shape, ``file:line: field.path: problem``."""

    def __init__(self, doc: checked.Document, data: object, path: FieldPath) -> None:
        if not isinstance(data, dict):
            raise doc.fail(path, f"must be an object, got {type(data).__name__}")
        self.doc, self.data, self.path = doc, data, path

    def _get(self, key: str, kinds: type | tuple[type, ...], kind_name: str, default: object = ...) -> Any:
        if key not in self.data:
            if default is not ...:
                return default
            raise self.doc.fail((*self.path, key), f"required, {kind_name}")
        value = self.data[key]
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in _as_tuple(kinds))
        if not ok:
            raise self.doc.fail((*self.path, key), f"must be {kind_name}, got {value!r:.40}")
        return value

    def r_str(self, key: str, default: object = ...) -> str:
        return str(self._get(key, str, "a string", default))

    def r_int(self, key: str, default: object = ...) -> int:
        return int(self._get(key, int, "an integer", default))

    def r_float(self, key: str, default: object = ...) -> float:
        return float(self._get(key, (int, float), "a number", default))

    def r_opt_float(self, key: str) -> float | None:
        value = self.data.get(key)
        if value is None:
            return None
        return self.r_float(key)

    def r_bool(self, key: str, default: object = ...) -> bool:
        return bool(self._get(key, bool, "true or false", default))

    def r_obj(self, key: str, default: object = ...) -> _Reader:
        return _Reader(self.doc, self._get(key, dict, "an object", default), (*self.path, key))

    def r_raw_obj(self, key: str, default: object = ...) -> JsonDict:
        value: JsonDict = self._get(key, dict, "an object", default)
        return value

    def r_mig_doc(self, key: str) -> JsonDict:
        """A mig-parted document: an object whose ``mig-configs`` (when present) maps each config
        name to a list of entries; the entries themselves are checked by ``apply``'s plan check."""
        value = self.r_raw_obj(key)
        if "mig-configs" in value:
            configs = _Reader(self.doc, value["mig-configs"], (*self.path, key, "mig-configs"))
            for name in configs.data:
                if not isinstance(name, str):
                    raise self.doc.fail((*configs.path,), f"config names must be strings, got {name!r:.40}")
                for i, entry in enumerate(configs.r_list(name)):
                    _Reader(self.doc, entry, (*configs.path, name, i))
        return value

    def r_list(self, key: str, default: object = ...) -> list[Any]:
        value: list[Any] = self._get(key, list, "a list", default)
        return value

    def r_objs(self, key: str, default: object = ...) -> list[_Reader]:
        return [
            _Reader(self.doc, item, (*self.path, key, i)) for i, item in enumerate(self.r_list(key, default))
        ]


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _layout(r: _Reader) -> GpuLayout:
    devices = r.r_raw_obj("mig_devices", {})
    for name, count in devices.items():
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise r.doc.fail((*r.path, "mig_devices", name), f"must be a count >= 0, got {count!r:.40}")
    return GpuLayout(r.r_int("index"), r.r_bool("mig_enabled"), dict(devices))


def _pod(p: _Reader) -> DisruptedPod:
    return DisruptedPod(
        namespace=p.r_str("namespace"),
        name=p.r_str("name"),
        devices=tuple(
            HeldDevice(
                gpu=d.r_int("gpu"),
                profile=d.r_str("profile", ""),
                gpu_instance_id=d.r_str("gpu_instance_id", ""),
                uuid=d.r_str("uuid", ""),
            )
            for d in p.r_objs("devices", [])
        ),
        targets=tuple(
            TargetDevice(node=t.r_str("node"), gpu=t.r_int("gpu"), profile=t.r_str("profile"))
            for t in p.r_objs("targets", [])
        ),
    )


def _node(r: _Reader) -> NodePlan:
    return NodePlan(
        name=r.r_str("name"),
        model=r.r_str("model"),
        pci_device_id=r.r_str("pci_device_id"),
        mig_strategy=r.r_str("mig_strategy", "mixed"),
        changed=r.r_bool("changed"),
        current_config_name=r.r_str("current_config_name", ""),
        current=tuple(_layout(g) for g in r.r_objs("current")),
        proposed=tuple(_layout(g) for g in r.r_objs("proposed")),
        config_name=r.r_str("config_name"),
        config_document=r.r_mig_doc("config_document"),
        slices_freed=r.r_int("slices_freed"),
        gpus_freed=r.r_int("gpus_freed"),
        expected_utilisation=r.r_float("expected_utilisation"),
        current_utilisation=r.r_float("current_utilisation", 0.0),
        pods_disrupted=tuple(_pod(p) for p in r.r_objs("pods_disrupted", [])),
        pods_kept=tuple(_pod(p) for p in r.r_objs("pods_kept", [])),
        cluster=r.r_str("cluster", ""),
        evidence=tuple(
            Evidence(
                gpu=e.r_int("gpu"),
                profile=e.r_str("profile", ""),
                gpu_instance_id=e.r_str("gpu_instance_id", ""),
                allocated=e.r_bool("allocated"),
                pod=e.r_str("pod", ""),
                idle_hours=e.r_float("idle_hours"),
                p95_activity=e.r_opt_float("p95_activity"),
                coverage_hours=e.r_float("coverage_hours"),
                window_hours=e.r_float("window_hours"),
                peak_activity=e.r_opt_float("peak_activity"),
                peak_at=e.r_str("peak_at", ""),
                busy_minutes=e.r_float("busy_minutes", 15.0),
            )
            for e in r.r_objs("evidence", [])
        ),
    )


def plan_from_dict(data: object, *, source: str = "plan") -> Plan:
    """A plan from already-decoded data (no lines known): errors read ``source: field.path: problem``."""
    return _plan(checked.Document(data, source=source, error=PlanError))


def _plan(doc: checked.Document) -> Plan:
    r = _Reader(doc, doc.data, ())
    schema = r.r_str("schema")
    if schema != SCHEMA:
        raise doc.fail(("schema",), f"is {schema!r}; this gpupilot reads {SCHEMA!r} (re-run 'plan')")
    w = r.r_obj("window")
    s = r.r_obj("solver")
    return Plan(
        schema=schema,
        plan_id=r.r_str("plan_id"),
        created_at=r.r_str("created_at"),
        window=Window(w.r_str("start"), w.r_str("end"), w.r_str("duration")),
        prometheus_url=r.r_str("prometheus_url"),
        settings=r.r_raw_obj("settings", {}),
        solver=SolverInfo(
            method=s.r_str("method"),
            status=s.r_str("status"),
            lower_bound_gpus=s.r_int("lower_bound_gpus"),
            seconds=s.r_float("seconds"),
        ),
        totals=_totals(r.r_obj("totals")),
        mig_parted_config=r.r_mig_doc("mig_parted_config"),
        nodes=tuple(_node(n) for n in r.r_objs("nodes")),
        time_slicing=tuple(
            TimeSlicingRecommendation(
                node=x.r_str("node"),
                model=x.r_str("model"),
                gpus=tuple(int(g) for g in x.r_list("gpus")),
                replicas=x.r_int("replicas"),
                reason=x.r_str("reason", ""),
                config_document=x.r_raw_obj("config_document"),
                cluster=x.r_str("cluster", ""),
            )
            for x in r.r_objs("time_slicing", [])
        ),
        notes=tuple(str(n) for n in r.r_list("notes", [])),
        cluster_label=r.r_str("cluster_label", ""),
        clusters=tuple(
            ClusterTotals(name=c.r_str("name"), totals=_totals(c.r_obj("totals")))
            for c in r.r_objs("clusters", [])
        ),
    )


def _totals(t: _Reader) -> Totals:
    return Totals(
        nodes=t.r_int("nodes"),
        nodes_changed=t.r_int("nodes_changed"),
        gpus=t.r_int("gpus"),
        gpus_needed=t.r_int("gpus_needed"),
        gpus_freed=t.r_int("gpus_freed"),
        slices_freed=t.r_int("slices_freed"),
        pods_disrupted=t.r_int("pods_disrupted"),
    )


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
