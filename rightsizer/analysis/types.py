"""Plain data the analysis hands to the optimiser and the report.

:mod:`rightsizer.analysis.history` turns Prometheus answers into these frozen dataclasses; everything
downstream works on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

from mig_geometry.catalogue import GpuModel, find_model


@dataclass(frozen=True)
class PodKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class InstanceInfo:
    """A MIG instance as the exporter's ``gpupilot_mig_instance_info`` describes it."""

    profile: str
    gpu_instance_id: str
    placement_start: int
    placement_size: int
    uuid: str = ""


@dataclass(frozen=True)
class GpuInventory:
    node: str
    index: int
    uuid: str
    model_key: str
    """Catalogue key (``H100 80GB``); ``""`` when the PCI device id is not in the catalogue."""
    pci_device_id: int
    mig_enabled: bool
    memory_total_mib: int = 0
    instances: tuple[InstanceInfo, ...] = ()

    @property
    def model(self) -> GpuModel | None:
        return find_model(self.model_key) if self.model_key else None


@dataclass(frozen=True)
class NodeInventory:
    name: str
    gpus: tuple[GpuInventory, ...]
    mig_strategy: str = "mixed"
    """The node's ``nvidia.com/mig.strategy`` label (the Kubernetes API or ``kube_node_labels``);
    ``mixed`` when neither shows it (:attr:`mig_strategy_known` then False)."""
    mig_config: str = ""
    """The node's ``nvidia.com/mig.config`` label value, ``""`` when unknown."""
    cluster: str = ""
    """The series' cluster label (``--cluster-label``); ``""``: one unnamed cluster."""
    mig_strategy_known: bool = True
    """Whether a source gave the strategy (kube-state-metrics exports node labels only when allow-listed)."""

    @property
    def model_key(self) -> str:
        keys = {g.model_key for g in self.gpus}
        return keys.pop() if len(keys) == 1 else ",".join(sorted(keys))


@dataclass(frozen=True)
class DeviceStats:
    """What one device (MIG instance, or whole GPU with ``profile == ""``) did over the window.

    Activity is a 0-1 ratio (graphics engine active, or GPU utilisation / 100 on whole GPUs).
    ``None`` means no data: the device is *unknown*, never counted as idle. ``peak`` (the highest
    ``busy_minutes`` rolling mean anywhere in the window) is what sizing uses; p50/p95/max inform.
    """

    node: str
    gpu: int
    gpu_uuid: str
    profile: str
    gpu_instance_id: str
    pods: tuple[PodKey, ...] = ()
    """Pods holding the device at the end of the window."""
    allocated_hours: float = 0.0
    p50: float | None = None
    p95: float | None = None
    max: float | None = None
    fb_peak_mib: float | None = None
    idle_hours: float = 0.0
    """Hours with data in which no ``busy_minutes`` rolling mean reached the idle threshold."""
    coverage_hours: float = 0.0
    window_hours: float = 0.0
    peak: float | None = None
    """Highest ``busy_minutes`` rolling mean activity in the window (0-1); ``None`` when unknown."""
    peak_at: float | None = None
    """Start (Unix seconds) of the hour holding ``peak``."""
    busy_minutes: float = 15.0
    """Length of the rolling mean behind ``peak``."""
    cluster: str = ""
    """The node's cluster (see :attr:`NodeInventory.cluster`)."""
    past_need: tuple[tuple[float, float], ...] = ()
    """Busy hours before the window (``plan --lookback``): (hour start, compute slices needed then, with
    headroom), from the recording rule; empty when not read or never busy."""

    @property
    def allocated(self) -> bool:
        return bool(self.pods)

    @property
    def unknown(self) -> bool:
        return self.coverage_hours <= 0 or self.peak is None

    def idle(self, threshold: float) -> bool:
        """Idle over the whole window: it has data and no ``busy_minutes`` mean reached ``threshold``."""
        return not self.unknown and self.peak is not None and self.peak < threshold

    @property
    def whole_gpu(self) -> bool:
        return self.profile == ""


@dataclass(frozen=True)
class Workload:
    """Pods with one owner (Deployment, StatefulSet, Job, …, else the pod itself) and their demand."""

    key: str
    """``namespace/Kind/name`` of the owner, or ``namespace/pod`` without one."""
    namespace: str
    pods: tuple[PodKey, ...]
    peak: float | None
    """Highest peak rolling-mean activity over the workload's devices (0-1); ``None`` when unknown."""
    fb_peak_mib: float | None
    demand_slices: float
    """Compute slices per replica its peak activity needs, headroom included (fractional)."""
    demand_memory_mib: float
    """Framebuffer per replica at the peak, headroom included."""
    cluster: str = ""
    """The cluster its pods run in: owners are grouped within one cluster, never across."""
    peak_slices: float | None = None
    """Compute slices per replica at the peak itself, without headroom (``None``: not known apart
    from the demand)."""
    peak_memory_mib: float | None = None
    """Framebuffer per replica at the peak itself, without headroom."""


@dataclass(frozen=True, kw_only=True)
class PendingPod:
    """A Pending pod's GPU request (kube-state-metrics): ``count`` devices of ``profile`` (``""``: whole GPUs)."""

    cluster: str
    namespace: str
    name: str
    profile: str
    count: int

    @property
    def resource(self) -> str:
        return f"nvidia.com/mig-{self.profile}" if self.profile else "nvidia.com/gpu"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Analysis:
    """Everything a plan needs, from Prometheus alone."""

    start: float
    end: float
    prometheus_url: str
    nodes: tuple[NodeInventory, ...]
    devices: tuple[DeviceStats, ...]
    workloads: tuple[Workload, ...] = ()
    used_recording_rule: bool = False
    notes: tuple[str, ...] = field(default=())
    cluster_notes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Each cluster's own notes (device counts of that cluster), when there are several."""
    pending: tuple[PendingPod, ...] = ()
    """Pods Pending at the end of the window for want of GPUs or MIG devices."""

    @property
    def window_hours(self) -> float:
        return (self.end - self.start) / 3600.0

    @cached_property
    def _device_index(self) -> dict[tuple[str, int, str], DeviceStats]:
        return {(d.node, d.gpu, d.gpu_instance_id): d for d in self.devices}

    @cached_property
    def _by_node(self) -> dict[str, tuple[DeviceStats, ...]]:
        grouped: dict[str, list[DeviceStats]] = {}
        for d in self.devices:
            grouped.setdefault(d.node, []).append(d)
        return {k: tuple(v) for k, v in grouped.items()}

    def devices_on(self, node: str) -> tuple[DeviceStats, ...]:
        """The devices of ``node``, in the analysis' order (indexed once: a plan over 10,000 nodes
        asks this of every node)."""
        return self._by_node.get(node, ())

    def device(self, node: str, gpu: int, gpu_instance_id: str) -> DeviceStats | None:
        """The device on ``node``'s GPU ``gpu`` (``gpu_instance_id == ""`` for the whole GPU); node
        names are unique within one cluster only, so ask this of :meth:`for_cluster`'s analyses."""
        return self._device_index.get((node, gpu, gpu_instance_id))

    @property
    def clusters(self) -> tuple[str, ...]:
        """The clusters of the inventory, sorted (``("",)`` when the series carry no cluster label)."""
        return tuple(sorted({n.cluster for n in self.nodes})) or ("",)

    def for_cluster(self, cluster: str) -> Analysis:
        """The part of this analysis in ``cluster``: what the same history of that cluster alone gives."""
        if self.clusters == (cluster,):
            return self
        return replace(
            self,
            nodes=tuple(n for n in self.nodes if n.cluster == cluster),
            devices=tuple(d for d in self.devices if d.cluster == cluster),
            workloads=tuple(w for w in self.workloads if w.cluster == cluster),
            pending=tuple(p for p in self.pending if p.cluster == cluster),
            notes=self.cluster_notes.get(cluster, self.notes),
            cluster_notes={},
        )
