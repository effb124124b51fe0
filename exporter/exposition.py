"""Snapshot → metric families: a pure function, shared by the live exporter and the backfill.

Both the HTTP exporter (which pre-renders these once per collection) and ``gpupilot-exporter
backfill`` (which writes them with timestamps as OpenMetrics) go through :func:`device_families`,
so live scrapes and backfilled history carry identical names and labels.

Placement rules of the metric contract (DESIGN.md):
* fields with ``level == "gpu"`` appear once per physical GPU; on a MIG GPU they carry no pod
  labels (a GPU's power belongs to no single pod);
* ``device`` fields appear on a whole GPU, or once per MIG instance with ``GPU_I_PROFILE``/``GPU_I_ID``;
* with pod attribution, a device held by several containers (time-slicing) gets one series per
  container, each with the device's value.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from exporter import fields
from exporter.snapshot import Allocations, GpuSnapshot, MigInstance, NodeSnapshot, PodRef

LabelPairs = tuple[tuple[str, str], ...]


@dataclass
class Family:
    """One metric family: ``kind`` is ``gauge``, ``counter`` or ``info``-like gauge (value 1)."""

    name: str
    kind: str
    help: str
    samples: list[tuple[LabelPairs, float]] = field(default_factory=list)


def _gpu_labels(gpu: GpuSnapshot, hostname: str) -> LabelPairs:
    info = gpu.info
    return (
        ("gpu", str(info.index)),
        ("UUID", info.uuid),
        ("pci_bus_id", info.pci_bus_id),
        ("device", info.device),
        ("modelName", info.model_name),
        ("Hostname", hostname),
        ("DCGM_FI_DRIVER_VERSION", info.driver_version),
    )


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


def device_families(
    snapshot: NodeSnapshot, *, hostname: str, allocations: Allocations | None = None
) -> list[Family]:
    """The device series of one snapshot (no exporter self-metrics), in a stable order."""
    fams: dict[str, Family] = {}

    def add(spec: fields.FieldSpec, label_sets: Iterable[LabelPairs], value: float) -> None:
        fam = fams.get(spec.name)
        if fam is None:
            fam = fams[spec.name] = Family(spec.name, spec.kind, spec.help)
        for labels in label_sets:
            fam.samples.append((labels, value))

    for spec in fields.FIELDS:
        fams[spec.name] = Family(spec.name, spec.kind, spec.help)
    fams[fields.XID_FIELD.name] = Family(fields.XID_FIELD.name, "gauge", fields.XID_FIELD.help)

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
        base = _gpu_labels(gpu, hostname)
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
        gpu_pods = _pods(allocations, info.uuid)
        # On a MIG GPU, GPU-level fields belong to no single pod; on a whole GPU they follow its pod.
        gpu_level_sets = [base] if info.mig_enabled else _pod_variants(base, gpu_pods)
        for spec in fields.FIELDS:
            if spec.name not in gpu.values:
                continue
            if info.mig_enabled and spec.level != "gpu":
                continue
            add(spec, gpu_level_sets, gpu.values[spec.name])
        if gpu.last_xid is not None:
            xid_labels = (
                *base,
                ("err_code", str(gpu.last_xid.code)),
                ("err_msg", xid_message(gpu.last_xid.code)),
            )
            fams[fields.XID_FIELD.name].samples.append((xid_labels, float(gpu.last_xid.code)))
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
            for spec in fields.FIELDS:
                if spec.level == "device" and spec.name in inst.values:
                    add(spec, variants, inst.values[spec.name])
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
    for gone in snapshot.lost:
        lost.samples.append(
            (
                (
                    ("gpu", str(gone.index)),
                    ("UUID", gone.uuid),
                    ("pci_bus_id", gone.pci_bus_id),
                    ("Hostname", hostname),
                    ("reason", gone.reason),
                ),
                1.0,
            )
        )
    visibility = Family(
        "gpupilot_exporter_process_visibility",
        "gauge",
        "1 when process counts cover every container on the node (host PID namespace); 0 when the "
        "exporter cannot see other containers' processes, and then no process counts are published.",
    )
    if snapshot.processes_visible is not None:
        visibility.samples.append(
            (
                (("Hostname", hostname), ("reason", snapshot.processes_visibility_reason)),
                1.0 if snapshot.processes_visible else 0.0,
            )
        )
    out = [f for f in fams.values() if f.samples]
    out.extend(f for f in (gpu_info, mig_info, pod_info, procs, xid_total, lost, visibility) if f.samples)
    return out


_XID_MESSAGES = {
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}


def xid_message(code: int) -> str:
    """Short description of an Xid code (NVIDIA's Xid catalogue); ``Unknown Xid`` otherwise."""
    return _XID_MESSAGES.get(code, "Unknown Xid")
