"""What a cluster around the simulated GPUs would publish: kube-state-metrics and application series.

Never mixed into the exporter's own series: ``gpupilot-exporter cluster`` serves these on a port of
their own, and the backfill writes them beside the device series. Names and labels follow
kube-state-metrics v2 (``kube_pod_labels{label_app=…}``, ``kube_node_labels{label_nvidia_com_mig_config=…}``,
``kube_horizontalpodautoscaler_*{horizontalpodautoscaler=…}``). Each series is a label set plus a
vectorised value function of time, so the live endpoint and the backfill share one definition.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from exporter.expose.exposition import Family, LabelPairs
from simulator import identity, patterns
from simulator.model import Hpa, PendingPod, Pod, Scenario
from simulator.patterns import Array

ValueFn = Callable[[Array], Array]
_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")

CPU_REQUEST_CORES = 4.0
MEMORY_REQUEST_BYTES = 32.0 * 2**30
"""Every simulated pod's container requests what examples/hpa-llm-inference.yaml's Deployment does (cpu 4, 32Gi)."""
CPU_IDLE_CORES, CPU_BUSY_CORES = 0.5, 3.5
"""CPU model: 0.5 cores idle plus 3.5 × GPU utilisation (a server feeding its GPU)."""
HOST_MEMORY_BASE_BYTES = 6.0 * 2**30
HOST_MEMORY_PER_FB_MIB = 0.1 * 2**20
"""Host memory model: 6 GiB plus a tenth of the framebuffer the pod uses (staging buffers)."""
COUNTER_ORIGIN = 1_700_000_000.0
"""Counters count from this instant (2023-11-14), the same for the live endpoint and the backfill."""


@dataclass(frozen=True)
class Series:
    family: str
    kind: str
    help: str
    labels: LabelPairs
    value: ValueFn | float
    """A constant, or values at an array of Unix times."""
    alive: tuple[float, float] = (-math.inf, math.inf)
    """[start, end): when the series exists (a pod's lifetime); always, by default."""

    def exists(self, t: float) -> bool:
        return self.alive[0] <= t < self.alive[1]


def ksm_label(name: str) -> str:
    """``nvidia.com/mig.config`` → ``label_nvidia_com_mig_config`` (kube-state-metrics' sanitising)."""
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _resource(name: str) -> str:
    """``mig-1g.10gb`` → ``nvidia_com_mig_1g_10gb`` (kube-state-metrics' resource label)."""
    return "nvidia_com_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


def device_entity(pod: Pod, index: int = 0) -> str:
    """The entity key :mod:`simulator.values` uses for the pod's ``index``-th device."""
    dev = pod.devices[index]
    return f"{dev.node}/{dev.gpu}" if dev.gi_id is None else f"{dev.node}/{dev.gpu}/{dev.gi_id}"


def pod_utilization(scenario: Scenario, pod: Pod, ts: Array) -> Array:
    """Percent, exactly as the pod's first device reports it (DCGM_FI_DEV_GPU_UTIL on a whole GPU)."""
    util = patterns.evaluate(
        pod.utilization, seed=scenario.seed, entity=f"{device_entity(pod)}:util", t=ts, decimals=2
    )
    return patterns.rounded(util) if pod.devices[0].gi_id is None else util


def app_metric(scenario: Scenario, pod: Pod, name: str, ts: Array) -> Array:
    entity = f"{pod.namespace}/{pod.name}:{name}"
    return patterns.evaluate(pod.app_metrics[name], seed=scenario.seed, entity=entity, t=ts, decimals=0)


def _app_metric_fn(scenario: Scenario, pod: Pod, name: str) -> ValueFn:
    def value(ts: Array) -> Array:
        return app_metric(scenario, pod, name, ts)

    return value


def series(scenario: Scenario) -> list[Series]:
    """Every cluster series of the scenario, in a stable order."""
    out: list[Series] = []
    _nodes(scenario, out)
    for pod in scenario.pods:
        _pod(scenario, pod, out)
    for pending in scenario.pending:
        _pending(scenario, pending, out)
    _deployments(scenario, out)
    for hpa in scenario.hpas:
        _hpa(scenario, hpa, out)
    return out


def _nodes(scenario: Scenario, out: list[Series]) -> None:
    for node in scenario.nodes:
        labels = (("node", node.name), *sorted((ksm_label(k), v) for k, v in node.labels.items()))
        out.append(
            Series(
                "kube_node_labels", "gauge", "Kubernetes labels converted to Prometheus labels.", labels, 1.0
            )
        )
        capacity: dict[str, int] = {}
        for gpu in node.gpus:
            if not gpu.mig_enabled:
                capacity["nvidia_com_gpu"] = capacity.get("nvidia_com_gpu", 0) + 1
            for inst in gpu.instances:
                res = (
                    "nvidia_com_gpu"
                    if node.mig_strategy == "single"
                    else _resource(f"mig-{inst.profile.name}")
                )
                capacity[res] = capacity.get(res, 0) + 1
        for res, count in sorted(capacity.items()):
            out.append(
                Series(
                    "kube_node_status_capacity",
                    "gauge",
                    "The capacity for different resources of a node.",
                    (("node", node.name), ("resource", res), ("unit", "integer")),
                    float(count),
                )
            )


def _phase_series(base: LabelPairs, current: str) -> list[Series]:
    """kube-state-metrics' ``kube_pod_status_phase``: one series per phase, 1 for ``current``."""
    return [
        Series(
            "kube_pod_status_phase",
            "gauge",
            "The pods current phase.",
            (*base, ("phase", phase)),
            1.0 if phase == current else 0.0,
        )
        for phase in _PHASES
    ]


def _pod(scenario: Scenario, pod: Pod, out: list[Series]) -> None:
    """The pod's series, for as long as it lives."""
    mine: list[Series] = []
    _pod_series(scenario, pod, mine)
    out.extend(replace(s, alive=(pod.start, pod.end)) if pod.lives else s for s in mine)


def _pod_series(scenario: Scenario, pod: Pod, out: list[Series]) -> None:
    uid = identity.pod_uid(scenario.seed, pod.namespace, pod.name)
    base: LabelPairs = (("namespace", pod.namespace), ("pod", pod.name), ("uid", uid))
    owner_kind, owner_name = (pod.owner_kind, pod.owner_name) if pod.owner_kind else ("<none>", "<none>")
    info = (
        *base,
        ("node", pod.node),
        ("created_by_kind", owner_kind),
        ("created_by_name", owner_name),
        ("priority_class", ""),
        ("host_network", "false"),
    )
    out.append(Series("kube_pod_info", "gauge", "Information about pod.", info, 1.0))
    labels = (*base, *sorted((ksm_label(k), v) for k, v in pod.labels.items()))
    out.append(
        Series("kube_pod_labels", "gauge", "Kubernetes labels converted to Prometheus labels.", labels, 1.0)
    )
    owner = (*base, ("owner_kind", owner_kind), ("owner_name", owner_name), ("owner_is_controller", "true"))
    out.append(Series("kube_pod_owner", "gauge", "Information about the Pod's owner.", owner, 1.0))
    out.extend(_phase_series(base, "Running"))
    out.append(
        Series(
            "kube_pod_container_info",
            "gauge",
            "Information about a container in a pod.",
            (*base, ("container", pod.container)),
            1.0,
        )
    )
    _resources(scenario, pod, out)
    for name in sorted(pod.app_metrics):
        out.append(
            Series(
                name,
                "gauge",
                f"Application metric {name} of the workload (simulated).",
                (("namespace", pod.namespace), ("pod", pod.name)),
                _app_metric_fn(scenario, pod, name),
            )
        )


def _pending(scenario: Scenario, pod: PendingPod, out: list[Series]) -> None:
    """A pod no node can take: phase Pending, no node, and its GPU request as kube-state-metrics
    publishes it (``resource="nvidia_com_mig_1g_10gb"``, ``unit="integer"``), from its arrival to
    its end."""
    mine: list[Series] = []
    _pending_series(scenario, pod, mine)
    out.extend(replace(s, alive=(pod.start, pod.end)) for s in mine)


def _pending_series(scenario: Scenario, pod: PendingPod, out: list[Series]) -> None:
    uid = identity.pod_uid(scenario.seed, pod.namespace, pod.name)
    base: LabelPairs = (("namespace", pod.namespace), ("pod", pod.name), ("uid", uid))
    info = (*base, ("node", ""), ("created_by_kind", "<none>"), ("created_by_name", "<none>"))
    out.append(
        Series(
            "kube_pod_info",
            "gauge",
            "Information about pod.",
            (*info, ("priority_class", ""), ("host_network", "false")),
            1.0,
        )
    )
    out.extend(_phase_series(base, "Pending"))
    out.append(
        Series(
            "kube_pod_container_resource_requests",
            "gauge",
            "The number of requested request resource by a container.",
            (
                ("namespace", pod.namespace),
                ("pod", pod.name),
                ("container", "main"),
                ("node", ""),
                ("resource", _resource(pod.resource.removeprefix("nvidia.com/"))),
                ("unit", "integer"),
            ),
            float(pod.count),
        )
    )


def _resources(scenario: Scenario, pod: Pod, out: list[Series]) -> None:
    """cAdvisor's CPU and memory series and kube-state-metrics' requests, for Resource metrics."""
    cadvisor: LabelPairs = (("namespace", pod.namespace), ("pod", pod.name), ("container", pod.container))
    entity = device_entity(pod)

    def cpu_seconds(ts: Array) -> Array:
        busy = patterns.integral(
            pod.utilization, seed=scenario.seed, entity=f"{entity}:util", t0=COUNTER_ORIGIN, t=ts
        )
        return np.asarray(
            CPU_IDLE_CORES * (ts - COUNTER_ORIGIN) + CPU_BUSY_CORES * busy / 100.0, dtype=np.float64
        )

    def working_set(ts: Array) -> Array:
        fb = patterns.evaluate(pod.memory_mib, seed=scenario.seed, entity=f"{entity}:mem", t=ts, decimals=0)
        return patterns.rounded(HOST_MEMORY_BASE_BYTES + HOST_MEMORY_PER_FB_MIB * fb)

    out.append(
        Series(
            "container_cpu_usage_seconds_total",
            "counter",
            "Cumulative cpu time consumed by the container in core-seconds (simulated).",
            cadvisor,
            cpu_seconds,
        )
    )
    out.append(
        Series(
            "container_memory_working_set_bytes",
            "gauge",
            "Current working set of the container in bytes (simulated).",
            cadvisor,
            working_set,
        )
    )
    for resource, unit, value in (
        ("cpu", "core", CPU_REQUEST_CORES),
        ("memory", "byte", MEMORY_REQUEST_BYTES),
    ):
        out.append(
            Series(
                "kube_pod_container_resource_requests",
                "gauge",
                "The number of requested request resource by a container.",
                (*cadvisor, ("node", pod.node), ("resource", resource), ("unit", unit)),
                value,
            )
        )


def _deployments(scenario: Scenario, out: list[Series]) -> None:
    for w in scenario.workloads:
        if w.kind != "Deployment":
            continue
        dep = (("namespace", w.namespace), ("deployment", w.name))
        rs_name = w.pods[0].owner_name
        out.append(
            Series(
                "kube_deployment_spec_replicas",
                "gauge",
                "Number of desired pods for a deployment.",
                dep,
                float(w.replicas),
            )
        )
        out.append(
            Series(
                "kube_deployment_status_replicas_available",
                "gauge",
                "The number of available replicas per deployment.",
                dep,
                _available(w.pods) if any(p.lives for p in w.pods) else float(w.replicas),
            )
        )
        rs = (
            ("namespace", w.namespace),
            ("replicaset", rs_name),
            ("owner_kind", "Deployment"),
            ("owner_name", w.name),
            ("owner_is_controller", "true"),
        )
        out.append(
            Series("kube_replicaset_owner", "gauge", "Information about the ReplicaSet's owner.", rs, 1.0)
        )


def _available(pods: tuple[Pod, ...]) -> ValueFn:
    """Replicas alive at each time (pods with lifetimes come and go)."""

    def value(ts: Array) -> Array:
        return sum((p.alive_mask(ts) for p in pods), np.zeros_like(ts))

    return value


def _hpa(scenario: Scenario, hpa: Hpa, out: list[Series]) -> None:
    base: LabelPairs = (("namespace", hpa.namespace), ("horizontalpodautoscaler", hpa.name))
    pods = [p for p in scenario.pods if p.namespace == hpa.namespace and p.deployment == hpa.target_name]
    current = float(len(pods))
    info = (
        *base,
        ("scaletargetref_api_version", "apps/v1"),
        ("scaletargetref_kind", hpa.target_kind),
        ("scaletargetref_name", hpa.target_name),
    )
    out.append(
        Series("kube_horizontalpodautoscaler_info", "gauge", "Information about this autoscaler.", info, 1.0)
    )
    out.append(
        Series(
            "kube_horizontalpodautoscaler_spec_min_replicas",
            "gauge",
            "Lower limit for the number of pods that can be set by the autoscaler, default 1.",
            base,
            float(hpa.min_replicas),
        )
    )
    out.append(
        Series(
            "kube_horizontalpodautoscaler_spec_max_replicas",
            "gauge",
            "Upper limit for the number of pods that can be set by the autoscaler; cannot be smaller than MinReplicas.",
            base,
            float(hpa.max_replicas),
        )
    )
    out.append(
        Series(
            "kube_horizontalpodautoscaler_status_current_replicas",
            "gauge",
            "Current number of replicas of pods managed by this autoscaler.",
            base,
            current,
        )
    )

    def desired(ts: Array) -> Array:
        ratio = np.zeros_like(ts)
        for m in hpa.metrics:
            avg = _metric_average(scenario, pods, m.name, ts)
            if avg is not None and m.value > 0:
                ratio = np.maximum(ratio, avg / m.value)
        # The HPA's 10 % tolerance: inside it, keep the current count.
        want = np.where(np.abs(ratio - 1.0) <= 0.1, current, np.ceil(current * ratio - 1e-9))
        return np.clip(want, hpa.min_replicas, hpa.max_replicas)

    out.append(
        Series(
            "kube_horizontalpodautoscaler_status_desired_replicas",
            "gauge",
            "Desired number of replicas of pods managed by this autoscaler.",
            base,
            desired,
        )
    )
    for m in hpa.metrics:
        target_type = {"AverageValue": "average", "Value": "value", "Utilization": "utilization"}[
            m.target_type
        ]
        labels = (*base, ("metric_name", m.name), ("metric_target_type", target_type))
        out.append(
            Series(
                "kube_horizontalpodautoscaler_spec_target_metric",
                "gauge",
                "The metric specifications used by this autoscaler when calculating the desired replica count.",
                labels,
                m.value,
            )
        )


def _metric_average(scenario: Scenario, pods: list[Pod], name: str, ts: Array) -> Array | None:
    if not pods:
        return None
    if name == "DCGM_FI_DEV_GPU_UTIL":
        return sum((pod_utilization(scenario, p, ts) for p in pods), np.zeros_like(ts)) / len(pods)
    having = [p for p in pods if name in p.app_metrics]
    if not having:
        return None
    return sum((app_metric(scenario, p, name, ts) for p in having), np.zeros_like(ts)) / len(pods)


def evaluate(s: Series, ts: Array) -> Array:
    return np.full_like(ts, s.value) if isinstance(s.value, float) else s.value(ts)


def families(scenario: Scenario, t: float, *, all_series: list[Series] | None = None) -> list[Family]:
    """The cluster series at Unix time ``t`` as families (one per name, in first-seen order)."""
    ts = np.array([float(t)])
    out: dict[str, Family] = {}
    for s in all_series if all_series is not None else series(scenario):
        if not s.exists(t):
            continue
        fam = out.get(s.family)
        if fam is None:
            fam = out[s.family] = Family(s.family, s.kind, s.help)
        value = float(evaluate(s, ts)[0])
        if math.isfinite(value):
            fam.samples.append((s.labels, value))
    return list(out.values())
