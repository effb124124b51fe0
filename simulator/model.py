"""The scenario's data model: frozen dataclasses built by :mod:`simulator.scenario`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

import numpy as np

from exporter.errors import ScenarioError
from hpa_controller.decide import HpaModel
from mig_geometry.catalogue import GpuModel, Profile
from simulator.patterns import Pattern

DEFAULT_EPOCH = 1767225600.0
"""2026-01-01T00:00:00Z: fault times are offsets from here unless the scenario sets ``epoch``."""
DEFAULT_DRIVER = "550.127.05"

FaultKind = Literal["gpu_lost", "xid", "nvml_error", "hung", "init_error", "mig_reconfigure"]
DraMode = Literal["", "static", "dynamic"]
DEFAULT_CLAIM_EVERY_S = 6 * 3600.0
"""How long a claim lasts on a dynamic-MIG node before the next one (and a new MIG UUID)."""


@dataclass(frozen=True)
class Instance:
    profile: Profile
    start: int
    gi_id: int
    uuid: str


@dataclass(frozen=True)
class Gpu:
    index: int
    model: GpuModel
    mig_config: str | None
    """Built-in config name it was given (``all-1g.10gb``), or ``None`` for explicit counts / no MIG."""
    mig_counts: Mapping[str, int] | None
    """``None`` when MIG is disabled."""
    instances: tuple[Instance, ...]
    uuid: str
    pci_bus_id: str
    driver_version: str
    time_slicing: int = 0
    """Replicas of a time-sliced whole GPU (NVIDIA device plugin's ``timeSlicing``); 0: not shared."""

    @property
    def mig_enabled(self) -> bool:
        return self.mig_counts is not None


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str]
    """Kubernetes node labels, defaults for the MIG/GFD labels filled in."""
    gpus: tuple[Gpu, ...]
    dra: DraMode = ""
    """"": device plugin; "static": DRA with a MIG layout made ahead of time; "dynamic": DRA with
    NVIDIA's DynamicMIG (an instance exists only while a claim holds it, new UUID per claim)."""
    claim_every: float = DEFAULT_CLAIM_EVERY_S
    dra_names: str = "v25.12"
    """How the DRA driver names MIG devices: ``v25.12`` (v25.12.0 and later, v0.4.0:
    ``gpu-<minor>-mig-<profile without dots>-<giProfileId>-<start>``) or ``v25.8`` (v25.3.0-v25.8.1:
    ``gpu-<minor>-mig-<giProfileId>-<start>-<size>``)."""

    @property
    def mig_strategy(self) -> str:
        return self.labels["nvidia.com/mig.strategy"]


@dataclass(frozen=True)
class DeviceRef:
    node: str
    gpu: int
    gi_id: int | None
    """``None`` for a whole GPU."""
    uuid: str
    profile: str = ""


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    container: str
    labels: Mapping[str, str]
    node: str
    devices: tuple[DeviceRef, ...]
    utilization: Pattern
    """Percent 0–100 of the devices it holds."""
    memory_mib: Pattern
    app_metrics: Mapping[str, Pattern]
    owner_kind: str = ""
    """``ReplicaSet`` for a Deployment's pods, empty for a bare pod."""
    owner_name: str = ""
    deployment: str = ""
    start: float = -math.inf
    """Unix time the pod starts holding its devices (its workload's ``start``); always, by default."""
    end: float = math.inf
    """Unix time it ends (its workload's ``end``): from then on it holds nothing and is gone."""

    def alive(self, t: float) -> bool:
        return self.start <= t < self.end

    def alive_mask(self, ts: np.ndarray) -> np.ndarray:
        """1.0 where the pod exists, 0.0 elsewhere."""
        return ((ts >= self.start) & (ts < self.end)).astype(np.float64)

    @property
    def lives(self) -> bool:
        """It has a lifetime (a start or an end) rather than existing for ever."""
        return math.isfinite(self.start) or math.isfinite(self.end)


@dataclass(frozen=True)
class Workload:
    namespace: str
    name: str
    kind: Literal["Pod", "Deployment"]
    replicas: int
    pods: tuple[Pod, ...]


@dataclass(frozen=True)
class HpaMetric:
    name: str
    target_type: str
    """``AverageValue``, ``Value`` or ``Utilization``."""
    value: float


@dataclass(frozen=True)
class Hpa:
    namespace: str
    name: str
    target_kind: str
    target_name: str
    min_replicas: int
    max_replicas: int
    metrics: tuple[HpaMetric, ...]


@dataclass(frozen=True)
class Fault:
    kind: FaultKind
    node: str
    gpu: int | None
    at: float
    """First occurrence, seconds after the epoch."""
    every: float | None
    duration: float
    code: int = 0
    field: str = ""
    block: float = 0.0
    """``hung``: how long a read blocks (default: the rest of the window)."""
    mig: Mapping[str, int] | None = None
    """``mig_reconfigure``: the GPU's new layout (profile → count; empty: MIG off)."""
    mig_name: str | None = None


@dataclass(frozen=True)
class PendingPod:
    """A pod the scheduler cannot place (phase Pending): what it requests, for kube-state-metrics."""

    namespace: str
    name: str
    resource: str
    """``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>``."""
    count: int = 1
    start: float = -math.inf
    """Unix time it arrives (Pending from then on); always, by default."""
    end: float = math.inf
    """Unix time it stops being Pending (it starts running, or gives up)."""


@dataclass(frozen=True)
class Load:
    """A service's offered requests per second: a cosine day on weekdays, scaled on weekends, with
    bursts at seed-chosen times and relative noise."""

    base: float
    """Weekday trough, requests/s."""
    peak: float
    """Weekday daily peak, requests/s, at ``peak_hour`` UTC."""
    peak_hour: float = 15.0
    weekend: float = 0.6
    """Saturday's and Sunday's load as a share of a weekday's at the same hour."""
    bursts_per_day: int = 0
    burst_duration: float = 900.0
    """Seconds at the burst's height, between two ramps of :data:`simulator.service.BURST_RAMP_S`."""
    burst_height: float = 0.0
    """Extra load during a burst, as a share of the load at that moment (0.8: ×1.8)."""
    noise: float = 0.0
    """Relative noise, ± uniform, per 15-second step."""


@dataclass(frozen=True)
class Service:
    """An inference Deployment autoscaled by its HPA every 15 s (the controller's own decision,
    :func:`hpa_controller.decide.decide`), serving :class:`Load` with a per-replica capacity."""

    namespace: str
    deployment: str
    container: str
    labels: tuple[tuple[str, str], ...]
    """Pod labels, sorted (the service is hashable: its runs are cached by it)."""
    node: str
    """The ``node`` label of its pods (kube_pod_info); its pods hold no simulated device."""
    startup: float
    """Seconds from a pod's creation to Ready (image pull, model load): no metrics, no service before."""
    load: Load
    capacity: float
    """Requests/s one ready replica serves at saturation."""
    max_queue: float
    """Waiting requests per ready replica beyond which new ones are rejected."""
    slots: int
    """Requests one replica runs at once (its batch); it queues as an M/M/c server with c = slots."""
    hpa_name: str
    hpa: HpaModel


@dataclass(frozen=True)
class Scenario:
    path: str
    seed: int
    epoch: float
    nodes: tuple[Node, ...]
    workloads: tuple[Workload, ...]
    hpas: tuple[Hpa, ...]
    faults: tuple[Fault, ...]
    pending: tuple[PendingPod, ...] = ()
    """Pods waiting for GPUs no node offers (published as Pending with their requests)."""
    services: tuple[Service, ...] = ()
    """Autoscaled inference services (:mod:`simulator.service`)."""

    @cached_property
    def pods(self) -> tuple[Pod, ...]:
        return tuple(p for w in self.workloads for p in w.pods)

    @cached_property
    def _pods_by_node(self) -> dict[str, tuple[Pod, ...]]:
        grouped: dict[str, list[Pod]] = {}
        for p in self.pods:
            grouped.setdefault(p.node, []).append(p)
        return {k: tuple(v) for k, v in grouped.items()}

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        known = ", ".join(n.name for n in self.nodes)
        raise ScenarioError(f"{self.path}: no node {name!r} in the scenario (nodes: {known})")

    def pods_on(self, node: str) -> tuple[Pod, ...]:
        """The pods of ``node`` over the whole timeline (indexed once: backfills ask it per node)."""
        return self._pods_by_node.get(node, ())

    def faults_on(self, node: str) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if f.node == node)
