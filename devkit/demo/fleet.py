"""Section 1: the fleet as Prometheus sees it — nodes, GPUs, MIG layouts, busy and idle slices.

Everything comes from the exporters' series and the recording rules, the same data the
dashboards, the adapter and the rightsizer use; nothing is read from the scenario file.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from devkit.demo import promql
from devkit.demo.console import StepFailed, table

IDLE_BELOW = 0.05
"""A device whose 5-minute mean activity is under 5 % counts as idle (as the rules' idle alert)."""

ACTIVITY = "gpupilot:slice_activity:avg5m"
IDLE_RULE = "gpupilot:device_idle:bool"
ACTIVITY_RAW = (
    'max by (Hostname, UUID, GPU_I_ID) (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!=""}[5m]))'
    " or max by (Hostname, UUID, GPU_I_ID) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[5m])) / 100"
)


@dataclass
class Device:
    profile: str
    """MIG profile, or "whole" for a GPU without MIG."""
    gi: str
    start: int = 0
    pods: list[str] = field(default_factory=list)
    activity: float | None = None
    processes: float | None = None
    """Compute processes on the device: the idle signal where there is no activity series."""
    idle_rule: bool | None = None
    """Whether ``gpupilot:device_idle:bool`` (the one definition of "allocated but idle" the report's
    trend and the alerts count) names this device; None before the rule has a value."""

    @property
    def state(self) -> str:
        if not self.pods:
            return "free"
        if self.idle_rule is not None and (self.activity is not None or self.processes is not None):
            return "idle" if self.idle_rule else "busy"
        if self.activity is not None:
            return "busy" if self.activity >= IDLE_BELOW else "idle"
        if self.processes is not None:
            return "busy" if self.processes > 0 else "idle"
        return "unknown"


@dataclass
class Gpu:
    node: str
    index: str
    model: str
    uuid: str
    mig: bool
    devices: list[Device] = field(default_factory=list)


def _key(labels: Mapping[str, str]) -> tuple[str, str, str]:
    return labels.get("Hostname", ""), labels.get("UUID", ""), labels.get("GPU_I_ID", "")


def _mark_idle(url: str, devices: dict[tuple[str, str, str], Device]) -> None:
    """The rule's own answer, so this view and the report count the same devices (none flagged:
    the rule has no value yet, or nothing is idle; the device states then follow the same test)."""
    flagged = {_key(s.labels) for s in promql.query(url, IDLE_RULE)}
    if flagged:
        for key, dev in devices.items():
            dev.idle_rule = key in flagged


def collect(url: str) -> tuple[list[Gpu], dict[str, str], str]:
    """GPUs with their devices, node → mig.config label, and which activity source was used."""
    infos = promql.query(url, "gpupilot_gpu_info")
    if not infos:
        raise StepFailed(
            "no gpupilot_gpu_info series in Prometheus yet: are the exporters up? (see .demo/logs)"
        )
    gpus: dict[tuple[str, str], Gpu] = {}
    for s in infos:
        lb = s.labels
        gpus[(lb["Hostname"], lb["UUID"])] = Gpu(
            node=lb["Hostname"],
            index=lb.get("gpu", "?"),
            model=lb.get("modelName", "?").removeprefix("NVIDIA "),
            uuid=lb["UUID"],
            mig=lb.get("mig_mode") == "enabled",
        )
    devices: dict[tuple[str, str, str], Device] = {}
    for s in promql.query(url, "gpupilot_mig_instance_info"):
        lb = s.labels
        gpu = gpus.get((lb.get("Hostname", ""), lb.get("UUID", "")))
        if gpu is None:
            continue
        inst = Device(
            lb.get("GPU_I_PROFILE", "?"), lb.get("GPU_I_ID", ""), int(lb.get("placement_start", "0") or 0)
        )
        if _key(lb) in devices:  # the same instance from two scrapes/jobs
            continue
        gpu.devices.append(inst)
        devices[_key(lb)] = inst
    for gpu in gpus.values():
        if not gpu.mig:
            whole = Device("whole", "")
            gpu.devices.append(whole)
            devices[(gpu.node, gpu.uuid, "")] = whole
        gpu.devices.sort(key=lambda d: d.start)
    for s in promql.query(
        url, "max by (Hostname, UUID, GPU_I_ID, namespace, pod) (gpupilot_device_pod_info)"
    ):
        dev = devices.get(_key(s.labels))
        if dev is not None:
            pod = f"{s.labels.get('namespace', '?')}/{s.labels.get('pod', '?')}"
            if pod not in dev.pods:
                dev.pods.append(pod)
    source = ACTIVITY
    activity = promql.query(url, ACTIVITY)
    if not activity:
        source, activity = (
            "raw DCGM series (recording rule not evaluated yet)",
            promql.query(url, ACTIVITY_RAW),
        )
    for s in activity:
        dev = devices.get(_key(s.labels))
        if dev is not None:
            dev.activity = max(s.value, dev.activity or 0.0)
    for s in promql.query(url, "max by (Hostname, UUID, GPU_I_ID) (gpupilot_device_compute_processes)"):
        dev = devices.get(_key(s.labels))
        if dev is not None:
            dev.processes = s.value
    _mark_idle(url, devices)
    configs = {
        s.labels.get("node", ""): s.labels.get("label_nvidia_com_mig_config", "")
        for s in promql.query(url, "kube_node_labels")
    }
    ordered = sorted(gpus.values(), key=lambda g: (g.node, int(g.index) if g.index.isdigit() else 0))
    return ordered, configs, source


def _layout(gpu: Gpu) -> str:
    if not gpu.mig:
        return "MIG off (whole GPU)"
    counts: dict[str, int] = defaultdict(int)
    for dev in gpu.devices:
        counts[dev.profile] += 1
    return " + ".join(
        f"{p}×{n}"
        for p, n in sorted(
            counts.items(), key=lambda kv: (-int(kv[0].split("g")[0]) if kv[0][0].isdigit() else 0, kv[0])
        )
    )


def _evidence(dev: Device) -> str:
    if dev.activity is not None:
        return f"{dev.activity * 100:.1f}% activity"
    return f"{dev.processes or 0:.0f} processes"


GLYPH = {"busy": "█", "idle": "▒", "free": "·", "unknown": "?"}


def _slices(gpu: Gpu) -> str:
    return " ".join(
        f"{dev.profile.split('.')[0] if gpu.mig else 'gpu'}{GLYPH[dev.state]}" for dev in gpu.devices
    )


def render(url: str) -> list[str]:
    gpus, configs, source = collect(url)
    rows = []
    for gpu in gpus:
        states = [d.state for d in gpu.devices]
        rows.append(
            [
                gpu.node,
                gpu.index,
                gpu.model,
                configs.get(gpu.node, "") or "-",
                _layout(gpu),
                _slices(gpu),
                str(states.count("busy")),
                str(states.count("idle")),
                str(states.count("free")),
            ]
        )
    lines = table(["NODE", "GPU", "MODEL", "mig.config", "LAYOUT", "SLICES", "BUSY", "IDLE", "FREE"], rows)
    devices = [d for g in gpus for d in g.devices]
    states = [d.state for d in devices]
    nodes = {g.node for g in gpus}
    lines.append("")
    lines.append(
        f"{len(nodes)} nodes, {len(gpus)} GPUs ({sum(g.mig for g in gpus)} with MIG), {len(devices)} devices: "
        f"{states.count('busy')} busy, {states.count('idle')} allocated but idle now, {states.count('free')} unallocated"
    )
    lines.append(
        f"(allocated but idle now: the devices {IDLE_RULE} names, the count the report's trend ends on; "
        "its first table lists the pods idle all week)"
    )
    lines.append(
        f"SLICES: █ busy  ▒ allocated, idle (< {IDLE_BELOW:.0%} activity over 5 min)  · unallocated  "
        "? no signal"
    )
    lines.append(
        f"activity from {source}; Ampere MIG slices have no activity counters (no GPM), "
        "so there busy/idle = compute processes > 0 / = 0"
    )
    waste = promql.query(url, "gpupilot:fleet_waste:gpu_equivalents")
    if waste:
        lines.append(
            f"fleet waste now: {waste[0].value:.2f} GPU-equivalents of allocated compute doing nothing "
            "(gpupilot:fleet_waste:gpu_equivalents)"
        )
    idle = [(g, d) for g in gpus for d in g.devices if d.state == "idle"]
    if idle:
        lines.append("")
        lines.append("Allocated but idle:")
        lines.extend(
            "  " + row
            for row in table(
                ["NODE", "GPU", "DEVICE", "POD", "EVIDENCE (5 min)"],
                [[g.node, g.index, d.profile, ", ".join(d.pods), _evidence(d)] for g, d in idle[:12]],
            )
        )
    return lines
