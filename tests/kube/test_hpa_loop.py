"""The mission's loop with Kubernetes' own controllers: a simulated GPU's utilisation rises and falls
(a burst of the simulated fleet), Prometheus scrapes it, the adapter serves it as an external metric
through kube-apiserver's aggregator, and the kube-controller-manager's HPA controller scales a GPU
Deployment out and back in; kube-state-metrics (built from its module) records the replica counts.
``replay-hpa`` over the same Prometheus history agrees with what the real controller did (replica
counts and times within the controller's sync period) and ``explain-hpa`` gives the controller's
last decision."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.kube import world
from tests.kube.conftest import REPO, RealCluster
from tests.kube.loop import METRIC, SYNC_S, TARGET, Loop, Recorder, running_loop


@pytest.fixture
def loop(real_cluster: RealCluster, namespace: str) -> Iterator[Loop]:
    with running_loop(real_cluster, namespace) as world_loop:
        yield world_loop


def _hpa(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "inference", "namespace": namespace},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "inference"},
            "minReplicas": 1,
            "maxReplicas": 3,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"name": METRIC},
                        "target": {"type": "AverageValue", "averageValue": str(int(TARGET))},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 20,
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
                },
            },
        },
    }


def test_the_hpa_controller_scales_on_the_fleets_gpu_metric_and_replay_hpa_agrees(
    real_cluster: RealCluster, namespace: str, loop: Loop
) -> None:
    node = f"{namespace[:40]}-gpu"
    world.add_gpu_node(real_cluster, node, config="all-disabled", gpus=4)
    world.deployment(
        real_cluster, namespace, "inference", resources={"nvidia.com/gpu": 1}, node=node, replicas=1
    )
    world.wait(lambda: world.running_pods(real_cluster, namespace, "inference"), what="inference Running")
    hpa = _hpa(namespace)
    real_cluster.kube.apply(hpa)
    recorder = Recorder(real_cluster, namespace, "inference")
    started = time.time()
    try:
        world.wait(
            lambda: _available(real_cluster), what="the external metrics APIService Available", timeout=60
        )
        world.wait(lambda: _status_ok(real_cluster, namespace), what="the HPA reading its metric", timeout=60)
        # the loop is up: the fleet's burst LEAD_S from now (real time)
        burst_start, burst_end = loop.out_and_back(
            recorder, namespace, logs=f"adapter log {loop.work / 'adapter.log'}"
        )
        time.sleep(2 * SYNC_S)
    finally:
        recorder.stop()
    ended = time.time()
    changes = recorder.changes()
    assert [r for _, r in changes] == [1, 3, 1], changes
    assert burst_start <= changes[1][0] <= burst_end, "out during the burst"
    assert changes[2][0] >= burst_end, "in after it"

    # replay-hpa over the same history: the real controller's counts and times, within its sync period
    hpa_file = loop.work / "hpa.yaml"
    dep = real_cluster.kube.get("apps/v1", "Deployment", "inference", namespace)
    assert dep is not None
    hpa_file.write_text(
        yaml.safe_dump_all([hpa, {k: dep[k] for k in ("apiVersion", "kind", "metadata", "spec")}])
    )
    since = int(ended - started + 10)
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "adapter",
            "replay-hpa",
            "-f",
            str(hpa_file),
            f"--prometheus-url={loop.prometheus}",
            f"--config={loop.config}",
            "--pod-source=none",
            f"--since={since}s",
            f"--until={int(ended)}",
            f"--step={int(SYNC_S)}s",
            "--rows=1000",
            "-o",
            "json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-1000:]
    out = json.loads(res.stdout)
    assert out["recorded_from"].startswith("kube_deployment_spec_replicas"), out["recorded_from"]
    steps = [(_unix(s["from"]), int(s["runs"][0]["max"])) for s in out["slices"]]
    replayed = [(t, r) for t, r in steps if started + SYNC_S <= t <= ended - SYNC_S]
    mismatched = [
        (t, r, recorder.at(t))
        for t, r in replayed
        if r not in {recorder.at(t - SYNC_S - 2), recorder.at(t), recorder.at(t + SYNC_S + 2)}
    ]
    assert not mismatched, (
        f"replay-hpa differs from the controller at {len(mismatched)} of {len(replayed)} steps: {mismatched[:5]}"
    )
    up_real, down_real = changes[1][0], changes[2][0]
    up_replay = next(t for t, r in replayed if r == 3)
    down_replay = next(t for t, r in replayed if t > up_replay and r == 1)
    assert abs(up_replay - up_real) <= SYNC_S + 2, (up_replay, up_real)
    assert abs(down_replay - down_real) <= SYNC_S + 2, (down_replay, down_real)
    print(
        f"controller: 1→3 at +{up_real - burst_start:.1f}s into the burst, 3→1 at +{down_real - burst_end:.1f}s after it; "
        f"replay-hpa: {len(replayed)} steps agree, scale-out {up_replay - up_real:+.1f}s, scale-in {down_replay - down_real:+.1f}s"
    )

    # explain-hpa, as users ask about a live HPA (pods from the API): the controller's last decision
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "adapter",
            "explain-hpa",
            "-f",
            str(hpa_file),
            f"--prometheus-url={loop.prometheus}",
            f"--config={loop.config}",
            "--pod-source=kubernetes",
            f"--kubeconfig={real_cluster.kubeconfig}",
            "-o",
            "json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-1000:]
    explained = json.loads(res.stdout)
    status = (
        real_cluster.kube.get("autoscaling/v2", "HorizontalPodAutoscaler", "inference", namespace) or {}
    )["status"]
    assert explained["current_replicas"] == status["currentReplicas"] == 1, (explained, status)
    assert explained["decision"]["final"] == status["desiredReplicas"] == 1, (explained["decision"], status)
    (metric,) = explained["metrics"]
    assert metric["metric"] == f"external/{METRIC}" and not metric["error"], metric


def _status_ok(cluster: RealCluster, namespace: str) -> bool:
    """The HPA controller has read the external metric (ScalingActive True)."""
    obj = cluster.kube.get("autoscaling/v2", "HorizontalPodAutoscaler", "inference", namespace) or {}
    conds = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "ScalingActive" and c["status"] == "True" for c in conds)


def _available(cluster: RealCluster) -> bool:
    obj = cluster.kube.get("apiregistration.k8s.io/v1", "APIService", "v1beta1.external.metrics.k8s.io") or {}
    return any(
        c["type"] == "Available" and c["status"] == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _unix(stamp: str) -> float:
    import datetime as dt  # noqa: PLC0415

    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
