"""Cluster series (kube-state-metrics + application) at time t, and the live /metrics server."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import pytest

from gpupilot_common.httpserve import Limits
from simulator import cluster
from simulator.backend import SimBackend
from simulator.cli import cluster_main
from simulator.cluster_server import ClusterServer
from simulator.model import Scenario
from tests.support.common.httpclients import get, oversized_header_status, slow_client_is_closed

REPO = Path(__file__).resolve().parents[2]
T = 1_767_225_600.0 + 300 * 86400 + 15 * 3600


def _by_name(s: Scenario, t: float) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: [(dict(lab), v) for lab, v in f.samples] for f in cluster.families(s, t)}


def test_pod_series_match_the_scenario(demo: Scenario) -> None:
    fams = _by_name(demo, T)
    pods = {(p.namespace, p.name) for p in demo.pods}
    assert {(lab["namespace"], lab["pod"]) for lab, _ in fams["kube_pod_info"]} == pods
    running = {
        (lab["namespace"], lab["pod"])
        for lab, v in fams["kube_pod_status_phase"]
        if lab["phase"] == "Running" and v == 1
    }
    assert running == pods
    assert sum(v for _, v in fams["kube_pod_status_phase"]) == len(pods)
    llm = [lab for lab, _ in fams["kube_pod_labels"] if lab.get("label_app") == "llm-inference"]
    assert len(llm) == 3 and all(lab["namespace"] == "ai-serving" for lab in llm)
    owners = {lab["pod"]: (lab["owner_kind"], lab["owner_name"]) for lab, _ in fams["kube_pod_owner"]}
    rs = {lab["replicaset"]: lab["owner_name"] for lab, _ in fams["kube_replicaset_owner"]}
    for lab in llm:
        kind, name = owners[lab["pod"]]
        assert kind == "ReplicaSet" and rs[name] == "llm-inference"
    nodes = {lab["pod"]: lab["node"] for lab, _ in fams["kube_pod_info"]}
    assert all(nodes[p.name] == p.node for p in demo.pods)


def test_node_labels_carry_mig_labels(demo: Scenario) -> None:
    labels = {lab["node"]: lab for lab, _ in _by_name(demo, T)["kube_node_labels"]}
    assert set(labels) == {n.name for n in demo.nodes}
    a100 = labels["gpu-a100-a"]
    assert a100["label_nvidia_com_mig_strategy"] == "single"
    assert a100["label_nvidia_com_mig_config"] == "all-3g.20gb"
    assert a100["label_nvidia_com_mig_config_state"] == "success"
    assert a100["label_nvidia_com_gpu_product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    cap = {(lab["node"], lab["resource"]): v for lab, v in _by_name(demo, T)["kube_node_status_capacity"]}
    # gpu-h100-b: GPU 1 is all-1g.10gb (7), GPU 2 all-balanced (2 more 1g.10gb)
    assert cap[("gpu-h100-b", "nvidia_com_mig_1g_10gb")] == 9 and cap[("gpu-a100-a", "nvidia_com_gpu")] == 4


def test_hpa_series_and_desired_replicas_follow_the_metrics(demo: Scenario) -> None:
    fams = _by_name(demo, T)
    one = {
        name: fams[name][0][1]
        for name in fams
        if name.startswith("kube_horizontalpodautoscaler_") and len(fams[name]) == 1
    }
    assert one["kube_horizontalpodautoscaler_spec_min_replicas"] == 2
    assert one["kube_horizontalpodautoscaler_spec_max_replicas"] == 8
    assert one["kube_horizontalpodautoscaler_status_current_replicas"] == 3
    targets = {
        lab["metric_name"]: (lab["metric_target_type"], v)
        for lab, v in fams["kube_horizontalpodautoscaler_spec_target_metric"]
    }
    assert targets == {"DCGM_FI_DEV_GPU_UTIL": ("average", 75.0), "inference_queue_depth": ("average", 10.0)}
    assert all(
        lab["horizontalpodautoscaler"] == "llm-inference-hpa"
        for lab, _ in fams["kube_horizontalpodautoscaler_info"]
    )
    # desired = ceil(current × max(util/75, queue/10)) within [min, max], from the very values the pods publish
    pods = [p for p in demo.pods if p.deployment == "llm-inference"]
    utils = []
    for p in pods:
        snap = SimBackend(demo, node=p.node).snapshot_at(T)
        gpu = next(g for g in snap.gpus if g.info.uuid == p.devices[0].uuid)
        utils.append(gpu.values["DCGM_FI_DEV_GPU_UTIL"])
    queue = {lab["pod"]: v for lab, v in fams["inference_queue_depth"]}
    assert set(queue) == {p.name for p in pods}
    ratio = max(sum(utils) / 3 / 75, sum(queue.values()) / 3 / 10)
    expected = 3 if abs(ratio - 1) <= 0.1 else min(8, max(2, int(np.ceil(3 * ratio - 1e-9))))
    assert one["kube_horizontalpodautoscaler_status_desired_replicas"] == expected


def test_queue_depth_follows_its_daily_pattern(demo: Scenario) -> None:
    day = 1_767_225_600.0 + 300 * 86400
    peak = sum(v for _, v in _by_name(demo, day + 15 * 3600)["inference_queue_depth"])
    night = sum(v for _, v in _by_name(demo, day + 3 * 3600)["inference_queue_depth"])
    assert peak > night + 20


def test_server_serves_the_series_at_its_clock(demo: Scenario) -> None:
    server = ClusterServer(demo, port=0, clock=lambda: T).start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
            body = r.read().decode()
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=10) as r:
            assert r.status == 200
    finally:
        server.close()
    assert "# TYPE kube_pod_labels gauge" in body
    q = next(v for lab, v in _by_name(demo, T)["inference_queue_depth"])
    lines = [
        ln
        for ln in body.splitlines()
        if ln.startswith("inference_queue_depth{") and 'pod="llm-inference-' in ln
    ]
    assert len(lines) == 3 and float(lines[0].rsplit(" ", 1)[1]) == q


def test_cluster_command_rejects_bad_listen(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cluster_main(["--scenario", str(REPO / "examples" / "fleet-demo.yaml"), "--listen", "nowhere"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "argument --listen: 'nowhere': expected HOST:PORT" in err


def test_resource_series_for_every_pod(demo: Scenario) -> None:
    """cAdvisor CPU/memory and kube-state-metrics requests, for HPA Resource metrics."""
    now, later = _by_name(demo, T), _by_name(demo, T + 60)
    pods = {(p.namespace, p.name) for p in demo.pods}
    cpu = {(lab["namespace"], lab["pod"]): v for lab, v in now["container_cpu_usage_seconds_total"]}
    cpu_later = {(lab["namespace"], lab["pod"]): v for lab, v in later["container_cpu_usage_seconds_total"]}
    assert set(cpu) == pods
    for p in demo.pods:
        key = (p.namespace, p.name)
        # the counter grows by the mean use over the minute: 0.5 + 3.5 × utilisation cores
        util = float(cluster.pod_utilization(demo, p, np.array([T + 30]))[0])
        rate = (cpu_later[key] - cpu[key]) / 60
        assert cluster.CPU_IDLE_CORES <= rate <= cluster.CPU_IDLE_CORES + cluster.CPU_BUSY_CORES
        assert rate == pytest.approx(0.5 + 3.5 * util / 100, abs=0.6)
    memory = {
        (lab["namespace"], lab["pod"], lab["container"]): v
        for lab, v in now["container_memory_working_set_bytes"]
    }
    assert {(ns, pod) for ns, pod, _ in memory} == pods
    assert all(6 * 2**30 <= v < 32 * 2**30 for v in memory.values())
    requests = {
        (lab["pod"], lab["resource"], lab["unit"]): v
        for lab, v in now["kube_pod_container_resource_requests"]
    }
    assert requests[(demo.pods[0].name, "cpu", "core")] == 4.0
    assert requests[(demo.pods[0].name, "memory", "byte")] == 32 * 2**30


@pytest.mark.slow
def test_server_closes_slow_and_refuses_oversized_clients(demo: Scenario) -> None:
    limits = Limits(idle_timeout=0.5, max_header_bytes=2048)
    server = ClusterServer(demo, port=0, clock=lambda: T, limits=limits).start()
    try:
        assert slow_client_is_closed(server.port, within=0.5) < 3
        assert oversized_header_status(server.port, size=64 * 1024) == 431
        status, body = get(server.port, "/metrics")
        assert status == 200 and b"# TYPE kube_pod_labels gauge" in body
    finally:
        server.close()
