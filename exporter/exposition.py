"""Snapshot → metric families: a pure function, shared by the live exporter and the backfill.

Both the HTTP exporter (which pre-renders these once per collection) and ``gpupilot-exporter
backfill`` (which writes them with timestamps as OpenMetrics) go through :func:`device_families`,
so live scrapes and backfilled history carry identical names and labels.

Which fields, their types and the host label come from a :class:`~exporter.layout.SeriesLayout`
(the counters file). Placement on MIG GPUs depends on ``layout.mig_series``:

* ``per-gpu`` (default): fields with ``level == "gpu"`` appear once per physical GPU, without pod
  labels (a GPU's power belongs to no single pod); ``device`` fields once per MIG instance with
  ``GPU_I_PROFILE``/``GPU_I_ID`` and the instance's pods. Sums over GPUs are right.
* ``per-instance`` (dcgm-exporter's layout): every field once per MIG instance, GPU-level values
  repeated on each instance, each with the instance's labels and pods.

On a whole GPU every field follows its pods; a device held by several containers (time-slicing)
gets one series per container, each with the device's value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from exporter import fields, health, xid_catalogue
from exporter.layout import SeriesLayout
from exporter.snapshot import Allocations, GpuSnapshot, MigInstance, NodeSnapshot, PodRef
from exporter.windows import GpuWindow, WindowCounts

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


def _pod_variants(labels: LabelPairs, pods: Sequence[PodRef]) -> list[LabelPairs]:
    if not pods:
        return [labels]
    return [(*labels, ("pod", p.pod), ("namespace", p.namespace), ("container", p.container)) for p in pods]


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
    name = spec.name
    if name == fields.XID_FIELD.name:
        last = gpu.last_xid
        if last is None:
            return []
        return [((("err_code", str(last.code)), ("err_msg", xid_message(last.code))), float(last.code))]
    if name == fields.EXP_XID_COUNT.name:
        if window is None:
            return []
        win = (("window_size_in_ms", str(round(layout.xid_window_s * 1000))),)
        if not window.xid:
            return [(win, 0.0)]
        return [((*win, ("xid", str(c))), float(n)) for c, n in sorted(window.xid.items())]
    if name == fields.EXP_CLOCK_EVENTS_COUNT.name:
        if window is None:
            return []
        win = (("window_size_in_ms", str(round(layout.clock_events_window_s * 1000))),)
        if not window.clock_events:
            return [(win, 0.0)]
        return [((*win, ("clock_event", r)), float(n)) for r, n in sorted(window.clock_events.items())]
    if name == fields.EXP_GPU_HEALTH.name:
        return [
            ((("health_watch", watch), ("health_error_code", code)), float(result))
            for watch, result, code in health.status(gpu.values)
        ]
    if values is None or name not in values:
        return []
    return [((), values[name])]


def device_families(
    snapshot: NodeSnapshot,
    *,
    hostname: str,
    allocations: Allocations | None = None,
    layout: SeriesLayout | None = None,
    windows: WindowCounts | None = None,
) -> list[Family]:
    """The device series of one snapshot (no exporter self-metrics), in a stable order.

    ``windows`` (from :class:`exporter.windows.EventWindows`) feeds ``DCGM_EXP_XID_ERRORS_COUNT``
    and ``DCGM_EXP_CLOCK_EVENTS_COUNT``; without it those two families are left out."""
    layout = layout or SeriesLayout()  # the default counters file is parsed once (layout.py)
    selected = layout.selection.metrics
    fams: dict[str, Family] = {spec.name: Family(spec.name, spec.kind, spec.help) for spec in selected}
    per_instance = layout.mig_series == "per-instance"

    def add(
        spec: fields.FieldSpec,
        gpu: GpuSnapshot,
        values: Mapping[str, float] | None,
        label_sets: Iterable[LabelPairs],
    ) -> None:
        name = spec.name
        if name not in _COMPUTED:  # a plain field: the common, fast case
            if values is None or name not in values:
                return
            value = values[name]
            fam = fams[name]
            for labels in label_sets:
                fam.samples.append((labels, value))
            return
        window = windows.get(gpu.info.uuid) if windows is not None else None
        samples = _field_samples(spec, gpu, values, layout=layout, window=window)
        if not samples:
            return
        fam = fams[spec.name]
        for labels in label_sets:
            for extra, value in samples:
                fam.samples.append(((*labels, *extra), value))

    gpu_info = Family(
        "gpupilot_gpu_info",
        "gauge",
        "GPU identity: model, PCI device id, MIG mode, GPM support (value 1).",
    )
    mig_info = Family(
        "gpupilot_mig_instance_info",
        "gauge",
        "MIG instance identity: profile, placement, GPU/compute instance ids, MIG UUID (value 1).",
    )
    pod_info = Family(
        "gpupilot_device_pod_info",
        "gauge",
        "Device (GPU or MIG instance) allocated to a container, from kubelet pod-resources (value 1).",
    )
    procs = Family(
        "gpupilot_device_compute_processes",
        "gauge",
        "Compute processes running on the device (GPU or MIG instance): an idle signal without GPM.",
    )
    xid_total = Family(
        "gpupilot_xid_errors_total",
        "counter",
        "Xid events seen by this exporter since it started, by Xid code.",
    )

    for gpu in snapshot.gpus:
        base = _gpu_labels(gpu, hostname, layout)
        info = gpu.info
        gpu_info.samples.append(
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
        gpu_pods = _pods(allocations, info.uuid)
        if not info.mig_enabled:
            sets = _pod_variants(base, gpu_pods)
            for spec in selected:
                add(spec, gpu, gpu_values, sets)
        elif not per_instance or not gpu.instances:
            # GPU-level fields once per physical GPU, without pods; device fields per instance below.
            # (per-instance with no instance yet: still once per GPU, so power does not vanish.)
            for spec in selected:
                if spec.level == "gpu":
                    add(spec, gpu, gpu_values, [base])
        for code, count in sorted(gpu.xid_counts.items()):
            xid_total.samples.append(((*base, ("xid", str(code))), float(count)))
        if not info.mig_enabled:
            for labels in _pod_variants(base, gpu_pods):
                if gpu_pods:
                    pod_info.samples.append((labels, 1.0))
                if gpu.compute_processes is not None:
                    procs.samples.append((labels, float(gpu.compute_processes)))
        for inst in gpu.instances:
            ibase = _instance_labels(base, inst)
            mig_info.samples.append(
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
            inst_pods = _pods(allocations, inst.uuid)
            variants = _pod_variants(ibase, inst_pods)
            inst_values = inst.values
            for spec in selected:
                if spec.level == "device":
                    add(spec, gpu, inst_values, variants)
                elif per_instance and spec.level == "gpu":
                    add(spec, gpu, gpu_values, variants)
            if inst_pods:
                for labels in variants:
                    pod_info.samples.append((labels, 1.0))
            if inst.compute_processes is not None:
                for labels in variants:
                    procs.samples.append((labels, float(inst.compute_processes)))

    lost = Family(
        "gpupilot_gpu_lost",
        "gauge",
        "1 for a GPU that was enumerated before but can no longer be read (fell off the bus).",
    )
    host = layout.host_label
    for gone in snapshot.lost:
        lost_labels: LabelPairs = (
            ("gpu", str(gone.index)),
            ("UUID", gone.uuid),
            ("pci_bus_id", gone.pci_bus_id),
        )
        if host is not None:
            lost_labels = (*lost_labels, (host, hostname))
        lost.samples.append(((*lost_labels, ("reason", gone.reason)), 1.0))
    visibility = Family(
        "gpupilot_exporter_process_visibility",
        "gauge",
        "1 when process counts cover every container on the node (host PID namespace); 0 when the "
        "exporter cannot see other containers' processes, and then no process counts are published.",
    )
    if snapshot.processes_visible is not None:
        vis_labels: LabelPairs = ((host, hostname),) if host is not None else ()
        visibility.samples.append(
            (
                (*vis_labels, ("reason", snapshot.processes_visibility_reason)),
                1.0 if snapshot.processes_visible else 0.0,
            )
        )
    out = [f for f in fams.values() if f.samples]
    out.extend(f for f in (gpu_info, mig_info, pod_info, procs, xid_total, lost, visibility) if f.samples)
    return out


def xid_message(code: int) -> str:
    """Short description of an Xid code (NVIDIA's Xid catalogue); ``Unknown Xid`` otherwise."""
    return xid_catalogue.message(code)
