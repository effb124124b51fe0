"""The mission's loop with Kubernetes' own controllers: a simulated GPU's utilisation rises and falls
(a burst of the simulated fleet), Prometheus scrapes it, the adapter serves it as an external metric
through kube-apiserver's aggregator, and the kube-controller-manager's HPA controller scales a GPU
Deployment out and back in; kube-state-metrics (built from its module) records the replica counts.
``replay-hpa`` over the same Prometheus history agrees with what the real controller did (replica
counts and times within the controller's sync period) and ``explain-hpa`` gives the controller's
last decision."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from devkit import gobuild
from devkit.history import LiveFleet
from devkit.pki import make_ca
from devkit.process import free_port, stop_process
from devkit.prometheus import PrometheusServer, ScrapeJob
from simulator import scenario as scenario_mod
from simulator.values import NodeModel
from tests.kube import world
from tests.kube.conftest import REPO, RealCluster

SYNC_S = 5.0
"""The controller-manager's --horizontal-pod-autoscaler-sync-period in devkit.cluster."""
TARGET = 40.0
"""Target average value of the external metric per replica (percent of one GPU)."""
LOW, PEAK = 15.0, 95.0
"""The burst: 1 replica below it (15/40 → 1), 3 in it (95/40 → 3)."""
EVERY_S, DURATION_S = 3600.0, 75.0
"""One burst an hour of the fleet's time, at a seed-chosen offset."""
LEAD_S = 20.0
"""The burst starts this long after the loop is up: the fleet's clock is set so that it does."""
METRIC = "llm_gpu_busy"


def _scenario_text(namespace: str, seed: int) -> str:
    return yaml.safe_dump(
        {
            "seed": seed,
            "epoch": "2026-01-01T00:00:00Z",
            "nodes": [
                {
                    "name": f"{namespace}-sim",
                    "labels": {"nvidia.com/mig.strategy": "mixed"},
                    "gpus": [{"model": "H100 80GB"}],
                }
            ],
            "workloads": [
                {
                    "namespace": namespace,
                    "pod": "llm-load-0",
                    "container": "vllm",
                    "labels": {"app": "llm-load"},
                    "devices": [f"{namespace}-sim/0"],
                    "utilization": {
                        "pattern": "bursty",
                        "base": LOW,
                        "peak": PEAK,
                        "every": f"{int(EVERY_S)}s",
                        "duration": f"{int(DURATION_S)}s",
                        "noise": 0,
                    },
                    "memory_mib": {"pattern": "constant", "value": 20000},
                }
            ],
        },
        sort_keys=False,
    )


def _next_burst(text: str, after: float) -> tuple[float, float]:
    """Start and end (the fleet's time) of the scenario's first burst after ``after``."""
    scen = scenario_mod.loads(text, name="hpa-loop")
    ts = np.arange(after, after + 2 * EVERY_S, 1.0)
    util = NodeModel(scen, scen.nodes[0]).continuous(ts)[(0, -1, "DCGM_FI_DEV_GPU_UTIL")]
    high = util > (LOW + PEAK) / 2
    first = int(np.argmax(high))
    last = first + int(np.argmax(~high[first:]))
    return float(ts[first]), float(ts[last])


class FleetClock:
    """The simulated fleet's time: real time plus an offset the test moves (values are pure
    functions of time, so a jump is just another instant of the scenario)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def _wait_http(url: str, timeout: float = 60) -> None:
    import urllib.request  # noqa: PLC0415

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


class Recorder:
    """The Deployment's replica count every half second, as the cluster has it."""

    def __init__(self, cluster: RealCluster, namespace: str, name: str) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(cluster, namespace, name), daemon=True)
        self._thread.start()

    def _run(self, cluster: RealCluster, namespace: str, name: str) -> None:
        while not self._stop.wait(0.5):
            dep = cluster.kube.get("apps/v1", "Deployment", name, namespace)
            if dep is not None:
                self.samples.append((time.time(), int(dep["spec"]["replicas"])))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def at(self, t: float) -> int | None:
        before = [r for s, r in self.samples if s <= t]
        return before[-1] if before else None

    def changes(self) -> list[tuple[float, int]]:
        out: list[tuple[float, int]] = []
        for t, r in self.samples:
            if not out or out[-1][1] != r:
                out.append((t, r))
        return out


@pytest.fixture
def loop(real_cluster: RealCluster, namespace: str) -> Iterator[dict[str, Any]]:
    """The simulated GPU, kube-state-metrics, Prometheus and the adapter behind the aggregator
    (their files and logs in the control plane's folder: kept when the test fails)."""
    tmp_path = Path(real_cluster.cp.directory) / namespace
    tmp_path.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    fleet = server = None
    text = _scenario_text(namespace, seed=7)
    scen_path = tmp_path / "scenario.yaml"
    scen_path.write_text(text)
    clock = FleetClock()
    fleet_start, fleet_end = _next_burst(text, time.time() + EVERY_S)
    clock.offset = fleet_start - EVERY_S / 2 - time.time()  # half an hour before it: quiet
    config = tmp_path / "adapter.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "external": [
                    {
                        "name": METRIC,
                        "series": "DCGM_FI_DEV_GPU_UTIL",
                        "namespaceLabel": "namespace",
                        "query": "sum(DCGM_FI_DEV_GPU_UTIL{<<matchers>>})",
                    }
                ]
            }
        )
    )
    try:
        fleet = LiveFleet(scenario_mod.load(scen_path), clock=clock).start()
        ksm_port, ksm_telemetry = free_port(), free_port()
        ksm = gobuild.binary("kube-state-metrics")
        procs.append(
            subprocess.Popen(
                [
                    str(ksm),
                    f"--kubeconfig={real_cluster.kubeconfig}",
                    "--host=127.0.0.1",
                    f"--port={ksm_port}",
                    "--telemetry-host=127.0.0.1",
                    f"--telemetry-port={ksm_telemetry}",
                    "--resources=deployments,horizontalpodautoscalers",
                    f"--namespaces={namespace}",
                ],
                stdout=(tmp_path / "ksm.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
        )
        _wait_http(f"http://127.0.0.1:{ksm_port}/metrics")
        server = PrometheusServer(
            tmp_path / "prom" / "data",
            scrape_jobs=[
                *fleet.scrape_jobs(interval="5s"),
                ScrapeJob("kube-state-metrics", [f"127.0.0.1:{ksm_port}"], interval="5s"),
            ],
            scrape_interval="5s",
            evaluation_interval="5s",
        ).start()
        # the adapter: HTTPS for adapter.<namespace>.svc, request-header auth from the control plane
        ca = make_ca(tmp_path / "pki", "adapter-ca")
        leaf = ca.issue(
            tmp_path / "pki", cn="adapter", server=True, hosts=(f"adapter.{namespace}.svc",), stem="adapter"
        )
        port = free_port()
        certs = real_cluster.cp.certs
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "adapter",
                    "serve",
                    f"--prometheus-url={server.url}",
                    f"--config={config}",
                    f"--kubeconfig={real_cluster.kubeconfig}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={port}",
                    f"--tls-cert-file={leaf.cert}",
                    f"--tls-private-key-file={leaf.key}",
                    f"--requestheader-client-ca-file={certs.front_proxy_ca.path}",
                    "--requestheader-allowed-names=front-proxy-client",
                    "--pod-source=none",
                    "--refresh-interval=2",
                ],
                cwd=REPO,
                stdout=(tmp_path / "adapter.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
        )
        real_cluster.kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "adapter", "namespace": namespace},
                "spec": {"type": "ExternalName", "externalName": "localhost"},
            }
        )
        real_cluster.kube.apply(
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": "v1beta1.external.metrics.k8s.io"},
                "spec": {
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                    "caBundle": base64.b64encode(ca.path.read_bytes()).decode(),
                    "service": {"name": "adapter", "namespace": namespace, "port": port},
                },
            }
        )
        yield {
            "prometheus": server.url,
            "config": config,
            "clock": clock,
            "burst": (fleet_start, fleet_end),
            "work": tmp_path,
        }
    finally:
        real_cluster.kube.delete("apiregistration.k8s.io/v1", "APIService", "v1beta1.external.metrics.k8s.io")
        for p in procs:
            stop_process(p)
        if server is not None:
            server.stop()
        if fleet is not None:
            fleet.stop()


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
    real_cluster: RealCluster, namespace: str, loop: dict[str, Any]
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
        fleet_start, fleet_end = loop["burst"]
        loop["clock"].offset = fleet_start - LEAD_S - time.time()
        burst_start = fleet_start - loop["clock"].offset
        burst_end = fleet_end - loop["clock"].offset
        world.wait(
            lambda: recorder.at(time.time()) == 3,
            what=f"scale-out to 3 in the burst (metric {_metric_now(loop['prometheus'], namespace)}; adapter log {loop['work'] / 'adapter.log'})",
            timeout=burst_start - time.time() + DURATION_S,
        )
        world.wait(
            lambda: recorder.at(time.time()) == 1,
            what="scale-in to 1 after the burst",
            timeout=burst_end - time.time() + 120,
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
    hpa_file = loop["work"] / "hpa.yaml"
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
            f"--prometheus-url={loop['prometheus']}",
            f"--config={loop['config']}",
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
            f"--prometheus-url={loop['prometheus']}",
            f"--config={loop['config']}",
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


def _metric_now(url: str, namespace: str) -> str:
    import urllib.parse  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    query = urllib.parse.urlencode({"query": f'sum(DCGM_FI_DEV_GPU_UTIL{{namespace="{namespace}"}})'})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as r:
        return str([v["value"][1] for v in json.load(r)["data"]["result"]])


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
