"""A small simulated cluster as OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics``.

ai-serving/llm-inference (app=llm-inference): three pods on whole GPUs, utilisation 90/80/70 (mean
80) and queue depth 14/12/10 (mean 12); the seed's HPA (75 and 10) therefore proposes 3 and 4.
Their container ``vllm`` requests 32 GiB and works in 16/24/20 GiB (``container_memory_working_set_bytes``,
``kube_pod_container_resource_requests``): memory utilisation 62 %.
ai-serving/embedder-0 (app=embedder): 30 %. research/trainer-0 on a MIG slice (app=trainer).
ai-serving/batch-stale (app=batch): its series stop ten minutes before "now".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric


@dataclass(frozen=True)
class SimPod:
    namespace: str
    name: str
    app: str
    node: str
    util: float
    queue: float | None
    fb_used: float = 20_000.0
    fb_free: float = 60_000.0
    phase: str = "Running"
    stale: bool = False
    memory_gib: float | None = None


PODS = (
    SimPod("ai-serving", "llm-inference-7d9f-a", "llm-inference", "gpu-node-01", 90, 14, memory_gib=16),
    SimPod("ai-serving", "llm-inference-7d9f-b", "llm-inference", "gpu-node-02", 80, 12, memory_gib=24),
    SimPod("ai-serving", "llm-inference-7d9f-c", "llm-inference", "gpu-node-03", 70, 10, memory_gib=20),
    SimPod("ai-serving", "embedder-0", "embedder", "gpu-node-01", 30, None, fb_used=1500.0),
    SimPod("ai-serving", "batch-stale", "batch", "gpu-node-02", 55, None, stale=True),
    SimPod("research", "trainer-0", "trainer", "gpu-node-04", 0, None),
)
FLEET_WASTE = 1.5
STEP = 15


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs.items()) + "}"


def pod_series(p: SimPod) -> list[tuple[str, dict[str, str], float]]:
    """(family, labels, value) of one pod: DCGM fields, recording-rule output, kube-state-metrics."""
    idx = PODS.index(p)
    base = {"namespace": p.namespace, "pod": p.name}
    dev = {"gpu": str(idx % 8), "UUID": f"GPU-{idx:04d}", "Hostname": p.node, **base}
    out: list[tuple[str, dict[str, str], float]] = []
    if p.name == "trainer-0":
        out.append(
            ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", {**dev, "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "1"}, 0.42)
        )
        out.append(("gpupilot:pod_gpu_utilization:percent", base, 42.0))
    else:
        out.append(("DCGM_FI_DEV_GPU_UTIL", dev, p.util))
        out.append(("gpupilot:pod_gpu_utilization:percent", base, p.util))
    out.append(("DCGM_FI_DEV_FB_USED", dev, p.fb_used))
    out.append(("DCGM_FI_DEV_FB_FREE", dev, p.fb_free))
    if p.queue is not None:
        out.append(("inference_queue_depth", base, p.queue))
    if p.memory_gib is not None:
        container = {**base, "container": "vllm"}
        out.append(("container_memory_working_set_bytes", container, p.memory_gib * 2**30))
        requests = {**container, "resource": "memory", "unit": "byte"}
        out.append(("kube_pod_container_resource_requests", requests, 32.0 * 2**30))
    out.append(("kube_pod_labels", {**base, "label_app": p.app}, 1.0))
    for phase in ("Pending", "Running", "Succeeded", "Failed"):
        out.append(("kube_pod_status_phase", {**base, "phase": phase}, 1.0 if phase == p.phase else 0.0))
    return out


class LiveCluster:
    """A prometheus_client collector exposing the current values of every pod that is not stale."""

    def collect(self) -> Iterator[Metric]:
        families: dict[str, GaugeMetricFamily] = {}
        for p in PODS:
            if p.stale:
                continue
            for name, labels, value in pod_series(p):
                fam = families.get(name)
                if fam is None:
                    fam = families[name] = GaugeMetricFamily(name, "simulated", labels=list(labels))
                fam.add_metric(list(labels.values()), value)
        waste = GaugeMetricFamily("gpupilot:fleet_waste:gpu_equivalents", "simulated")
        waste.add_metric([], FLEET_WASTE)
        yield from families.values()
        yield waste


def write_openmetrics(
    path: Path, *, now: float, history: int = 1200, until: int = 60, target: dict[str, str] | None = None
) -> Path:
    """History: samples every 15 s from ``now - history`` to ``now - until`` (stale pod: to now - 600).

    Backfilled blocks must end before "now": Prometheus refuses live samples older than its newest
    block. Current values come from :class:`LiveCluster`, scraped every second; ``target`` (the
    scrape's job/instance labels) makes history and live samples one series."""
    start = int(now) - history
    end = int(now) - until
    families: dict[str, list[str]] = {}

    def add(name: str, labels: dict[str, str], value: float, *, until: int = end) -> None:
        labels = {**labels, **(target or {})}
        lines = families.setdefault(name, [])
        for t in range(start, until + 1, STEP):
            lines.append(f"{name}{_labels(labels)} {value} {t}")

    for p in PODS:
        for name, labels, value in pod_series(p):
            add(name, labels, value, until=int(now) - 600 if p.stale else end)
    add("gpupilot:fleet_waste:gpu_equivalents", {}, FLEET_WASTE)
    out = []
    for name, lines in families.items():
        out.append(f"# TYPE {name} gauge")
        out.extend(lines)
    # OpenMetrics wants each family's samples together and ordered by time within a series
    out.append("# EOF")
    path.write_text("\n".join(out) + "\n")
    return path
