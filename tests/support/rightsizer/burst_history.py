"""Eight days of history with daily bursts of 1 h, 2 h and 3 h at different hours (OpenMetrics).

Every number here is a published or chosen fact, not an answer computed by the code under test:
H100 80GB profiles (3g.40gb = 3 compute slices, 2g.20gb = 2, 1g.10gb = 1) and the burst levels below.

burst-a   H100 80GB, mixed, 3 GPUs. GPU0 3g.40gb + 2g.20gb + 2g.20gb: ``job-1h`` (3g) 75 % from 03:00
          to 04:00 UTC, ``job-2h`` (2g) 80 % from 23:00 to 01:00 (straddling midnight), ``idle-2g``
          (2g) 1 % all day. GPU1 3g.40gb + 4 × 1g.10gb: ``job-3h`` (3g) 70 % from 13:00 to 16:00,
          ``tiny`` (1g) 1 %, three 1g unallocated. GPU2 MIG off, held whole by ``whole-0`` at 50 %.
          Outside its burst every job runs at 1-2 %. ``idle-2g`` needs only a 1g slice: a change.
tight     H100 80GB, mixed, 1 GPU 3g.40gb + 2g.20gb + 2g.20gb, each held by a job whose burst needs
          exactly its profile (75 % of 3g at 09:00 for 1 h, 80 % of 2g at 20:00 for 2 h, 70 % of 2g
          from 22:00 to 01:00): already optimal, so no plan may change it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

STEP = 120.0
DAYS = 8
H100 = "NVIDIA H100 80GB HBM3"


@dataclass(frozen=True)
class Job:
    node: str
    gpu: int
    profile: str
    """MIG profile, or ``""`` for a whole GPU."""
    gi: str
    pod: str
    start_h: float
    """Burst start (UTC hour of day); the burst may run past midnight."""
    hours: float
    level: float
    base: float = 0.01
    fb_mib: float = 3000.0

    def activity(self, t: float) -> float:
        hour = (t % 86400) / 3600
        into = (hour - self.start_h) % 24
        return self.level if into < self.hours else self.base


@dataclass(frozen=True)
class Instance:
    node: str
    gpu: int
    profile: str
    gi: str
    start: int
    size: int


JOBS = (
    Job("burst-a", 0, "3g.40gb", "1", "job-1h", 3, 1, 0.75),
    Job("burst-a", 0, "2g.20gb", "5", "job-2h", 23, 2, 0.80),
    Job("burst-a", 0, "2g.20gb", "6", "idle-2g", 0, 0, 0.0, base=0.01, fb_mib=2000),
    Job("burst-a", 1, "3g.40gb", "2", "job-3h", 13, 3, 0.70, base=0.02),
    Job("burst-a", 1, "1g.10gb", "9", "tiny", 0, 0, 0.0, base=0.01, fb_mib=1000),
    Job("burst-a", 2, "", "", "whole-0", 0, 24, 0.5),
    Job("tight", 0, "3g.40gb", "1", "tight-1h", 9, 1, 0.75),
    Job("tight", 0, "2g.20gb", "5", "tight-2h", 20, 2, 0.80),
    Job("tight", 0, "2g.20gb", "6", "tight-3h", 22, 3, 0.70),
)
"""Every GPU pod; ``burst-a``'s ``idle-2g`` and ``tiny`` never burst (hours = 0)."""

BURSTS = tuple(j for j in JOBS if j.hours and j.profile)
"""MIG pods with a daily burst: none may be sized below ``level × compute slices`` of its profile."""

INSTANCES = (
    Instance("burst-a", 0, "3g.40gb", "1", 4, 4),
    Instance("burst-a", 0, "2g.20gb", "5", 0, 2),
    Instance("burst-a", 0, "2g.20gb", "6", 2, 2),
    Instance("burst-a", 1, "3g.40gb", "2", 4, 4),
    *(Instance("burst-a", 1, "1g.10gb", str(9 + k), k, 1) for k in range(4)),
    Instance("tight", 0, "3g.40gb", "1", 4, 4),
    Instance("tight", 0, "2g.20gb", "5", 0, 2),
    Instance("tight", 0, "2g.20gb", "6", 2, 2),
)
GPUS = (("burst-a", 0, True), ("burst-a", 1, True), ("burst-a", 2, False), ("tight", 0, True))
NAMESPACE = "ml"


def _fmt(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _base(node: str, gpu: int) -> dict[str, str]:
    return {"gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}", "modelName": H100, "Hostname": node}


def write_history(path: Path, *, end: float) -> float:
    """Write ``DAYS`` days ending at ``end`` (one sample every ``STEP`` s); returns the start."""
    start = end - DAYS * 86400
    series: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))

    def add(name: str, labels: dict[str, str], t: float, v: float) -> None:
        series[name][_fmt(labels)].append(f"{v:g} {t:.0f}")

    jobs = {(j.node, j.gpu, j.gi): j for j in JOBS}
    n = int((end - start) / STEP)
    for i in range(n + 1):
        t = start + i * STEP
        for node, gpu, mig in GPUS:
            info = {**_base(node, gpu), "pci_device_id": "0x2330", "memory_total_mib": "81559"}
            add("gpupilot_gpu_info", info | {"mig_mode": "enabled" if mig else "disabled"}, t, 1)
            if not mig:
                job = jobs[(node, gpu, "")]
                dl = _base(node, gpu) | {"pod": job.pod, "namespace": NAMESPACE, "container": "main"}
                add("gpupilot_device_pod_info", dl, t, 1)
                add("DCGM_FI_DEV_GPU_UTIL", dl, t, round(100 * job.activity(t)))
                add("DCGM_FI_DEV_FB_USED", dl, t, job.fb_mib)
        for inst in INSTANCES:
            il = _base(inst.node, inst.gpu) | {"GPU_I_PROFILE": inst.profile, "GPU_I_ID": inst.gi}
            add(
                "gpupilot_mig_instance_info",
                il
                | {
                    "placement_start": str(inst.start),
                    "placement_size": str(inst.size),
                    "mig_uuid": f"MIG-{inst.node}-{inst.gpu}-{inst.gi}",
                },
                t,
                1,
            )
            job = jobs.get((inst.node, inst.gpu, inst.gi))
            dl = dict(il)
            if job is not None:
                dl |= {"pod": job.pod, "namespace": NAMESPACE, "container": "main"}
                add("gpupilot_device_pod_info", dl, t, 1)
            add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dl, t, job.activity(t) if job else 0.0)
            add("DCGM_FI_DEV_FB_USED", dl, t, job.fb_mib if job else 0.0)
        for node in ("burst-a", "tight"):
            add("kube_node_labels", {"node": node, "label_nvidia_com_mig_config": "custom"}, t, 1)
    with path.open("w") as f:
        for name, by_labels in series.items():
            f.write(f"# TYPE {name} gauge\n")
            for labels, points in by_labels.items():
                f.writelines(f"{name}{labels} {p}\n" for p in points)
        f.write("# EOF\n")
    return start
