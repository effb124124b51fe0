"""A node whose bursts lie beyond a one-day window (OpenMetrics, for ``plan --lookback`` tests).

``weekly``  H100 80GB, mixed, 1 GPU: 3g.40gb + 2g.20gb + 2g.20gb.
            ``monday`` (3g) runs at 80 % for 3 h once a week, last 3 days before the end, otherwise 1 %:
            a 1-day window sees it idle; the weeks before show it needs its 3g slice every week.
            ``once`` (2g) ran at 80 % for 2 h once, 10 days before the end, otherwise 1 %: not weekly.
            The second 2g is unallocated.
Raw exporter series cover the last 26 hours (one sample every 2 minutes); the recording rule
``gpupilot:slice_activity:avg5m`` (written as Prometheus records it: a 5-minute mean, labels of the
rule) covers 22 days, so a 28-day lookback finds the longest history there is.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

NODE = "weekly"
NAMESPACE = "ml"
H100 = "NVIDIA H100 80GB HBM3"
RAW_STEP = 120.0
RULE_STEP = 300.0
RAW_HOURS = 26
RULE_DAYS = 22
WEEK = 7 * 86400.0


@dataclass(frozen=True)
class Slot:
    profile: str
    gi: str
    start: int
    size: int
    pod: str
    bursts: tuple[tuple[float, float], ...]
    """(seconds before the end the burst starts, its length in seconds)."""


def slots(end: float) -> tuple[Slot, ...]:
    del end
    return (
        Slot("3g.40gb", "1", 4, 4, "monday", tuple((3 * 86400 + k * WEEK, 3 * 3600) for k in range(4))),
        Slot("2g.20gb", "5", 0, 2, "once", ((10 * 86400, 2 * 3600),)),
        Slot("2g.20gb", "6", 2, 2, "", ()),
    )


def activity(slot: Slot, t: float, end: float) -> float:
    before = end - t
    return 0.8 if any(b - length < before <= b for b, length in slot.bursts) else (0.01 if slot.pod else 0.0)


def write(path: Path, *, end: float) -> float:
    """Write the history ending at ``end``; returns the first raw sample's time."""
    series: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))

    def fmt(labels: dict[str, str]) -> str:
        return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"

    def add(name: str, labels: dict[str, str], t: float, v: float) -> None:
        series[name][fmt(labels)].append(f"{v:g} {t:.0f}")

    base = {"gpu": "0", "UUID": f"GPU-{NODE}-0", "modelName": H100, "Hostname": NODE}
    raw_start = end - RAW_HOURS * 3600
    for i in range(int(RAW_HOURS * 3600 / RAW_STEP) + 1):
        t = raw_start + i * RAW_STEP
        add(
            "gpupilot_gpu_info",
            base | {"pci_device_id": "0x2330", "memory_total_mib": "81559", "mig_mode": "enabled"},
            t,
            1,
        )
        add("kube_node_labels", {"node": NODE, "label_nvidia_com_mig_config": "custom"}, t, 1)
        for s in slots(end):
            il = base | {"GPU_I_PROFILE": s.profile, "GPU_I_ID": s.gi}
            info = il | {
                "placement_start": str(s.start),
                "placement_size": str(s.size),
                "mig_uuid": f"MIG-{NODE}-{s.gi}",
            }
            add("gpupilot_mig_instance_info", info, t, 1)
            dl = dict(il)
            if s.pod:
                dl |= {"pod": s.pod, "namespace": NAMESPACE, "container": "main"}
                add("gpupilot_device_pod_info", dl, t, 1)
            add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dl, t, activity(s, t, end))
            add("DCGM_FI_DEV_FB_USED", dl, t, 2000.0 if s.pod else 0.0)
    rule_start = end - RULE_DAYS * 86400
    for i in range(int(RULE_DAYS * 86400 / RULE_STEP) + 1):
        t = rule_start + i * RULE_STEP
        for s in slots(end):
            labels = {
                "Hostname": NODE,
                "gpu": "0",
                "UUID": f"GPU-{NODE}-0",
                "GPU_I_PROFILE": s.profile,
                "GPU_I_ID": s.gi,
            }
            if s.pod:
                labels |= {"namespace": NAMESPACE, "pod": s.pod}
            add("gpupilot:slice_activity:avg5m", labels, t, activity(s, t, end))
    with path.open("w") as f:
        for name, by_labels in series.items():
            f.write(f"# TYPE {name} gauge\n")
            for labels, points in by_labels.items():
                f.writelines(f"{name}{labels} {p}\n" for p in points)
        f.write("# EOF\n")
    return raw_start
