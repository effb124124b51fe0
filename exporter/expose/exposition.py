"""Snapshot → metric families: a pure function, shared by the live exporter and the backfill.

Both the HTTP exporter (which pre-renders these once per collection) and ``gpupilot-exporter
backfill`` (which writes them with timestamps as OpenMetrics) go through :func:`device_families`,
so live scrapes and backfilled history carry identical names and labels.

Which fields, their types and the host label come from a :class:`~exporter.contract.layout.SeriesLayout`
(the counters file). Placement on MIG GPUs depends on ``layout.mig_series``:

* ``per-gpu`` (default): fields with ``level == "gpu"`` appear once per physical GPU, without pod
  labels (a GPU's power belongs to no single pod); ``device`` fields once per MIG instance with
  ``GPU_I_PROFILE``/``GPU_I_ID`` and the instance's pods. Sums over GPUs are right.
* ``per-instance`` (dcgm-exporter's layout): every field once per MIG instance, GPU-level values
  repeated on each instance, each with the instance's labels and pods.

On a whole GPU every field follows its pods. A device the device plugin hands to several containers
(time-slicing, MPS) gets one series, labelled with the last of them in the kubelet's answer, as
dcgm-exporter does (``gpupilot_device_pod_info`` names every holder); with
``layout.virtual_gpus`` (dcgm-exporter 4.5.3's ``KUBERNETES_VIRTUAL_GPUS``) a shared whole GPU keeps
its series without pod labels and each holder gets its own, with ``pod``, ``namespace``,
``container``, ``pod_uid`` and ``vgpu`` (the replica index): its own ``DCGM_FI_DEV_GPU_UTIL`` and
``DCGM_FI_DEV_FB_USED`` (0 when idle), the device's value of every other field. A container holding
several replicas of one GPU gets its share split evenly over its replica series, so the per-pod
series of a GPU add up to what its processes use, never more than the device's own figure. A device a container got through a
ResourceClaim (DRA) also carries dcgm-exporter's ``dra_claim_name``, ``dra_claim_namespace``,
``dra_driver_name``, ``dra_pool_name``, ``dra_device_name`` and, on MIG devices only,
``dra_mig_profile`` and ``dra_mig_device_uuid`` (absent on whole GPUs, as there).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from exporter.contract import fields, xid_catalogue
from exporter.contract.layout import SeriesLayout
from exporter.expose import health
from exporter.expose.windows import GpuWindow, WindowCounts
from exporter.snapshot import Allocations, DeviceShares, GpuSnapshot, MigInstance, NodeSnapshot, PodRef

LabelPairs = tuple[tuple[str, str], ...]


@dataclass
class Family:
    """One metric family: ``kind`` is ``gauge``, ``counter`` or ``info``-like gauge (value 1)."""

    name: str
    kind: str
    help: str
    samples: list[tuple[LabelPairs, float]] = field(default_factory=list)


def _gpu_labels(gpu: GpuSnapshot, hostname: str, layout: SeriesLayout) -> LabelPairs:
    info = gpu.info
    labels: list[tuple[str, str]] = [
        ("gpu", str(info.index)),
        ("UUID", info.uuid),
        ("pci_bus_id", info.pci_bus_id),
        ("device", info.device),
        ("modelName", info.model_name),
    ]
    if layout.host_label is not None:
        labels.append((layout.host_label, hostname))
    if "DCGM_FI_DRIVER_VERSION" in layout.selection.labels:
        labels.append(("DCGM_FI_DRIVER_VERSION", info.driver_version))
    return tuple(labels)


def _instance_labels(base: LabelPairs, inst: MigInstance) -> LabelPairs:
    return (*base, ("GPU_I_PROFILE", inst.profile), ("GPU_I_ID", str(inst.gpu_instance_id)))


def _pod_labels(p: PodRef) -> LabelPairs:
    own = (("pod", p.pod), ("namespace", p.namespace), ("container", p.container))
    d = p.dra
    if d is None:
        return own
    claim = (
        *own,
        ("dra_claim_name", d.claim_name),
        ("dra_claim_namespace", d.claim_namespace),
        ("dra_driver_name", d.driver_name),
        ("dra_pool_name", d.pool_name),
        ("dra_device_name", d.device_name),
    )
    if not d.mig_device_uuid and not d.mig_profile:
        return claim
    return (*claim, ("dra_mig_profile", d.mig_profile), ("dra_mig_device_uuid", d.mig_device_uuid))


def _pod_variants(labels: LabelPairs, pods: Sequence[PodRef]) -> list[LabelPairs]:
    if not pods:
        return [labels]
    return [(*labels, *_pod_labels(p)) for p in pods]


def dcgm_holders(pods: Sequence[PodRef]) -> tuple[PodRef, ...]:
    """The holders whose labels a device's DCGM series carry: every claim's pod (a claim shared by two
    pods gives two series), and of the device plugin's containers only the last in the kubelet's
    answer (dcgm-exporter keeps one pod per device id; later ones overwrite earlier ones)."""
    plugin = [p for p in pods if p.dra is None]
    last = plugin[-1] if plugin else None
    return tuple(p for p in pods if p.dra is not None or p is last)


UTIL_FIELD, FB_USED_FIELD = "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"
MIB = 1024 * 1024


def virtual_gpu_values(
    device: Mapping[str, float], holder: PodRef, shares: DeviceShares | None, *, replicas: int = 1
) -> dict[str, float]:
    """One replica holder's values under ``KUBERNETES_VIRTUAL_GPUS``: its own utilisation (percent) and
    framebuffer (MiB), 0 when it runs nothing; the device's value of every other field. Utilisation is
    left out where NVML cannot tell it per process. ``replicas``: how many replicas of this GPU the
    same container holds; each of its series gets that share of the container's figures (NVML tells
    them per process, not per replica), so the container's series add up to its figure once."""
    key = (holder.namespace, holder.pod, holder.container)
    split = max(1, replicas)
    own = dict(device)
    if UTIL_FIELD in own:
        if shares is None or shares.utilisation is None:
            del own[UTIL_FIELD]
        else:
            own[UTIL_FIELD] = 100.0 * shares.utilisation.get(key, 0.0) / split
    if FB_USED_FIELD in own:
        own[FB_USED_FIELD] = (shares.memory_bytes.get(key, 0.0) if shares is not None else 0.0) / MIB / split
    return own


def _pods(allocations: Allocations | None, device_id: str) -> tuple[PodRef, ...]:
    if not allocations:
        return ()
    return allocations.get(device_id, ())


_COMPUTED = frozenset({fields.XID_FIELD.name, *(f.name for f in fields.EXP_FIELDS)})
"""Fields whose series are built from more than one value (labels from the event, windows, checks)."""


def _field_samples(
    spec: fields.FieldSpec,
    gpu: GpuSnapshot,
    values: Mapping[str, float] | None,
    *,
    layout: SeriesLayout,
    window: GpuWindow | None,
) -> list[tuple[LabelPairs, float]]:
    """(extra labels, value) of one field on one device; ``values`` is the device's own values
    (None: the field does not apply there). Empty when the device has no value."""
    name = spec.source
    if name == fields.XID_FIELD.name:
        last = gpu.last_xid
        if last is None:  # no Xid since the exporter started: 0, as dcgm-exporter publishes it
            return [((("err_code", "0"),), 0.0)]
        return [((("err_code", str(last.code)), ("err_msg", xid_message(last.code))), float(last.code))]
    if name == fields.EXP_XID_COUNT.name:
        return [] if window is None else _window_samples(window.xid, "xid", layout.xid_window_s)
    if name == fields.EXP_CLOCK_EVENTS_COUNT.name:
        if window is None:
            return []
        return _window_samples(window.clock_events, "clock_event", layout.clock_events_window_s)
    if name == fields.EXP_GPU_HEALTH.name:
        return [
            ((("health_watch", watch), ("health_error_code", code)), float(result))
            for watch, result, code in health.status(gpu.values)
        ]
    if values is None or name not in values:
        return []
    return [((), values[name])]


def _window_samples(counts: Mapping[Any, int], label: str, window_s: float) -> list[tuple[LabelPairs, float]]:
    """One sample per counted key over the window, or a single 0 when nothing happened in it."""
    win = (("window_size_in_ms", str(round(window_s * 1000))),)
    if not counts:
        return [(win, 0.0)]
    return [((*win, (label, str(k))), float(n)) for k, n in sorted(counts.items())]


class _Families:
    """The device families of one snapshot, filled GPU by GPU (:func:`device_families`)."""

    def __init__(
        self,
        *,
        hostname: str,
        allocations: Allocations | None,
        layout: SeriesLayout,
        windows: WindowCounts | None,
        shares: Mapping[str, DeviceShares] | None = None,
    ) -> None:
        self.hostname = hostname
        self.allocations = allocations
        self.shares = shares or {}
        self.layout = layout
        self.windows = windows
        self.selected = layout.selection.metrics
        self.per_instance = layout.mig_series == "per-instance"
        self.fields: dict[str, Family] = {
            spec.name: Family(spec.name, spec.kind, spec.help) for spec in self.selected
        }
        self.gpu_info = Family(
            "gpupilot_gpu_info",
            "gauge",
            "GPU identity: model, PCI device id, MIG mode, GPM support (value 1).",
        )
        self.mig_info = Family(
            "gpupilot_mig_instance_info",
            "gauge",
            "MIG instance identity: profile, placement, GPU/compute instance ids, MIG UUID (value 1).",
        )
        self.pod_info = Family(
            "gpupilot_device_pod_info",
            "gauge",
            "Device (GPU or MIG instance) allocated to a container, from kubelet pod-resources (value 1).",
        )
        self.procs = Family(
            "gpupilot_device_compute_processes",
            "gauge",
            "Compute processes running on the device (GPU or MIG instance): an idle signal without GPM.",
        )
        self.xid_total = Family(
            "gpupilot_xid_errors_total",
            "counter",
            "Xid events seen by this exporter since it started, by Xid code.",
        )

    def add(
        self,
        spec: fields.FieldSpec,
        gpu: GpuSnapshot,
        values: Mapping[str, float] | None,
        label_sets: Iterable[LabelPairs],
    ) -> None:
        name = spec.source
        if name not in _COMPUTED:  # a plain field: the common, fast case
            if values is None or name not in values:
                return
            value = values[name]
            fam = self.fields[spec.name]
            for labels in label_sets:
                fam.samples.append((labels, value))
            return
        window = self.windows.get(gpu.info.uuid) if self.windows is not None else None
        samples = _field_samples(spec, gpu, values, layout=self.layout, window=window)
        if not samples:
            return
        fam = self.fields[spec.name]
        for labels in label_sets:
            for extra, value in samples:
                fam.samples.append(((*labels, *extra), value))

    def add_gpu(self, gpu: GpuSnapshot) -> None:
        base = _gpu_labels(gpu, self.hostname, self.layout)
        info = gpu.info
        self.gpu_info.samples.append(
            (
                (
                    *base,
                    ("pci_device_id", f"0x{info.pci_device_id:04x}"),
                    ("mig_mode", "enabled" if info.mig_enabled else "disabled"),
                    ("gpm", "supported" if info.gpm_supported else "unsupported"),
                    ("memory_total_mib", str(info.memory_total_mib)),
                ),
                1.0,
            )
        )
        gpu_values = gpu.values
        gpu_pods = _pods(self.allocations, info.uuid)
        replicas = [p for p in gpu_pods if p.dra is None and p.replica]
        if not info.mig_enabled and self.layout.virtual_gpus and replicas:
            self._add_virtual(gpu, base, replicas)
        elif not info.mig_enabled:
            sets = _pod_variants(base, dcgm_holders(gpu_pods))
            for spec in self.selected:
                self.add(spec, gpu, gpu_values, sets)
        elif not self.per_instance or not gpu.instances:
            # GPU-level fields once per physical GPU, without pods; device fields per instance below.
            # (per-instance with no instance yet: still once per GPU, so power does not vanish.)
            for spec in self.selected:
                if spec.level == "gpu":
                    self.add(spec, gpu, gpu_values, [base])
        for code, count in sorted(gpu.xid_counts.items()):
            self.xid_total.samples.append(((*base, ("xid", str(code))), float(count)))
        if not info.mig_enabled:
            self._add_device_info(base, gpu_pods, gpu.compute_processes)
        for inst in gpu.instances:
            self.add_instance(gpu, inst, base)

    def _add_virtual(self, gpu: GpuSnapshot, base: LabelPairs, replicas: Sequence[PodRef]) -> None:
        """A shared whole GPU under ``KUBERNETES_VIRTUAL_GPUS``: its series without pod labels, then
        one per replica holder with its own utilisation and framebuffer."""
        for spec in self.selected:
            self.add(spec, gpu, gpu.values, [base])
        shares = self.shares.get(gpu.info.uuid)
        held: dict[tuple[str, str, str], int] = {}
        for p in replicas:
            key = (p.namespace, p.pod, p.container)
            held[key] = held.get(key, 0) + 1
        for p in replicas:
            uid = p.pod_uid or (shares.pod_uids.get((p.namespace, p.pod, p.container), "") if shares else "")
            labels: LabelPairs = (
                *base,
                ("pod", p.pod),
                ("namespace", p.namespace),
                ("container", p.container),
                ("pod_uid", uid),
                ("vgpu", p.replica),
            )
            own = virtual_gpu_values(gpu.values, p, shares, replicas=held[(p.namespace, p.pod, p.container)])
            for spec in self.selected:
                self.add(spec, gpu, own, [labels])

    def add_instance(self, gpu: GpuSnapshot, inst: MigInstance, base: LabelPairs) -> None:
        ibase = _instance_labels(base, inst)
        self.mig_info.samples.append(
            (
                (
                    *ibase,
                    ("compute_instance_id", str(inst.compute_instance_id)),
                    ("placement_start", str(inst.placement_start)),
                    ("placement_size", str(inst.placement_size)),
                    ("mig_uuid", inst.uuid),
                ),
                1.0,
            )
        )
        inst_pods = _pods(self.allocations, inst.uuid)
        variants = _pod_variants(ibase, dcgm_holders(inst_pods))
        inst_values, gpu_values = inst.values, gpu.values
        for spec in self.selected:
            if spec.level == "device":
                self.add(spec, gpu, inst_values, variants)
            elif self.per_instance and spec.level == "gpu":
                self.add(spec, gpu, gpu_values, variants)
        self._add_device_info(ibase, inst_pods, inst.compute_processes)

    def _add_device_info(
        self, base: LabelPairs, pods: Sequence[PodRef], compute_processes: int | None
    ) -> None:
        """The pod-info and compute-process series of one device (GPU or MIG instance)."""
        for labels in _pod_variants(base, pods):
            if pods:
                self.pod_info.samples.append((labels, 1.0))
            if compute_processes is not None:
                self.procs.samples.append((labels, float(compute_processes)))

    def lost(self, snapshot: NodeSnapshot) -> Family:
        lost = Family(
            "gpupilot_gpu_lost",
            "gauge",
            "1 for a GPU that was enumerated before but can no longer be read (fell off the bus).",
        )
        host = self.layout.host_label
        for gone in snapshot.lost:
            lost_labels: LabelPairs = (
                ("gpu", str(gone.index)),
                ("UUID", gone.uuid),
                ("pci_bus_id", gone.pci_bus_id),
            )
            if host is not None:
                lost_labels = (*lost_labels, (host, self.hostname))
            lost.samples.append(((*lost_labels, ("reason", gone.reason)), 1.0))
        return lost

    def visibility(self, snapshot: NodeSnapshot) -> Family:
        visibility = Family(
            "gpupilot_exporter_process_visibility",
            "gauge",
            "1 when process counts cover every container on the node (host PID namespace); 0 when the "
            "exporter cannot see other containers' processes, and then no process counts are published.",
        )
        if snapshot.processes_visible is not None:
            host = self.layout.host_label
            vis_labels: LabelPairs = ((host, self.hostname),) if host is not None else ()
            visibility.samples.append(
                (
                    (*vis_labels, ("reason", snapshot.processes_visibility_reason)),
                    1.0 if snapshot.processes_visible else 0.0,
                )
            )
        return visibility

    def families(self, *node_level: Family) -> list[Family]:
        """The field families, then the info, Xid and ``node_level`` ones, each only if it has samples."""
        out = [f for f in self.fields.values() if f.samples]
        extra = (self.gpu_info, self.mig_info, self.pod_info, self.procs, self.xid_total, *node_level)
        out.extend(f for f in extra if f.samples)
        return out


def device_families(
    snapshot: NodeSnapshot,
    *,
    hostname: str,
    allocations: Allocations | None = None,
    layout: SeriesLayout | None = None,
    windows: WindowCounts | None = None,
    shares: Mapping[str, DeviceShares] | None = None,
) -> list[Family]:
    """The device series of one snapshot (no exporter self-metrics), in a stable order.
    ``shares``: each container's part of a shared GPU (:func:`exporter.attribute.sharing.device_shares`),
    for the per-pod series of ``layout.virtual_gpus``.

    ``windows`` (from :class:`exporter.expose.windows.EventWindows`) feeds ``DCGM_EXP_XID_ERRORS_COUNT``
    and ``DCGM_EXP_CLOCK_EVENTS_COUNT``; without it those two families are left out."""
    layout = layout or SeriesLayout()  # the default counters file is parsed once (layout.py)
    built = _Families(
        hostname=hostname, allocations=allocations, layout=layout, windows=windows, shares=shares
    )
    for gpu in snapshot.gpus:
        built.add_gpu(gpu)
    return built.families(built.lost(snapshot), built.visibility(snapshot))


def xid_message(code: int) -> str:
    """Short description of an Xid code (NVIDIA's Xid catalogue); ``Unknown Xid`` otherwise."""
    return xid_catalogue.message(code)
