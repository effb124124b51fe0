"""The HPA loop's world, shared by the real-cluster tests of the HPA controller and of KEDA: a
simulated GPU whose utilisation bursts when the test says (the fleet's clock is moved), Prometheus
scraping it and kube-state-metrics, and the adapter serving it (through the aggregator, or as KEDA's
external scaler over TLS). Everything's files and logs live in the control plane's folder, kept when
a test fails."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from devkit import gobuild
from devkit.history import LiveFleet
from devkit.pki import CA, Issued, make_ca
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


def metric_now(url: str, namespace: str) -> str:
    import urllib.parse  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    query = urllib.parse.urlencode({"query": f'sum(DCGM_FI_DEV_GPU_UTIL{{namespace="{namespace}"}})'})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as r:
        return str([v["value"][1] for v in json.load(r)["data"]["result"]])


@dataclass
class Loop:
    prometheus: str
    config: Path
    clock: FleetClock
    burst: tuple[float, float]
    """The burst's start and end in the fleet's time."""
    work: Path
    ca: CA
    """The CA of the adapter's serving certificates (the aggregator's and the scaler's)."""
    scaler: str = ""
    """``127.0.0.1:PORT`` of the external scaler (gRPC over TLS), when asked for."""
    client: Issued | None = None
    """A client certificate the scaler accepts (KEDA's tlsClientCert), when asked for."""

    def start_burst(self) -> tuple[float, float]:
        """Move the fleet's clock so that the burst starts LEAD_S from now; its (start, end) in real time."""
        fleet_start, fleet_end = self.burst
        self.clock.offset = fleet_start - LEAD_S - time.time()
        return fleet_start - self.clock.offset, fleet_end - self.clock.offset

    def out_and_back(self, recorder: Recorder, namespace: str, *, logs: str) -> tuple[float, float]:
        """Start the burst, wait until the Deployment runs 3 replicas in it and 1 again after it
        (``logs``: where a timeout's message sends the reader); the burst's (start, end) in real time."""
        burst_start, burst_end = self.start_burst()
        world.wait(
            lambda: recorder.at(time.time()) == 3,
            what=f"scale-out to 3 in the burst (metric {metric_now(self.prometheus, namespace)}; {logs})",
            timeout=burst_start - time.time() + DURATION_S,
        )
        world.wait(
            lambda: recorder.at(time.time()) == 1,
            what="scale-in to 1 after the burst",
            timeout=burst_end - time.time() + 120,
        )
        return burst_start, burst_end


@contextlib.contextmanager
def running_loop(
    cluster: RealCluster, namespace: str, *, aggregated: bool = True, scaler: bool = False
) -> Iterator[Loop]:
    """The loop's world for ``namespace``; ``aggregated``: the adapter registered as
    ``v1beta1.external.metrics.k8s.io``; ``scaler``: its KEDA external scaler on, over mutual TLS."""
    tmp_path = Path(cluster.cp.directory) / namespace
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
                    f"--kubeconfig={cluster.kubeconfig}",
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
        certs = cluster.cp.certs
        assert certs is not None
        scaler_flags: list[str] = []
        client = None
        scaler_address = ""
        if scaler:
            scaler_address = f"127.0.0.1:{free_port()}"
            serving = ca.issue(
                tmp_path / "pki", cn="scaler", server=True, hosts=("127.0.0.1", "localhost"), stem="scaler"
            )
            client = ca.issue(tmp_path / "pki", cn="keda", stem="keda-client")
            scaler_flags = [
                f"--external-scaler-address={scaler_address}",
                f"--external-scaler-tls-cert-file={serving.cert}",
                f"--external-scaler-tls-key-file={serving.key}",
                f"--external-scaler-client-ca-file={ca.path}",
            ]
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "adapter",
                    "serve",
                    f"--prometheus-url={server.url}",
                    f"--config={config}",
                    f"--kubeconfig={cluster.kubeconfig}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={port}",
                    f"--tls-cert-file={leaf.cert}",
                    f"--tls-private-key-file={leaf.key}",
                    f"--requestheader-client-ca-file={certs.front_proxy_ca.path}",
                    "--requestheader-allowed-names=front-proxy-client",
                    "--pod-source=none",
                    "--refresh-interval=2",
                    *scaler_flags,
                ],
                cwd=REPO,
                stdout=(tmp_path / "adapter.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
        )
        if aggregated:
            _register(cluster, namespace, port, ca)
        yield Loop(server.url, config, clock, (fleet_start, fleet_end), tmp_path, ca, scaler_address, client)
    finally:
        if aggregated:
            cluster.kube.delete("apiregistration.k8s.io/v1", "APIService", "v1beta1.external.metrics.k8s.io")
        for p in procs:
            stop_process(p)
        if server is not None:
            server.stop()
        if fleet is not None:
            fleet.stop()


def _register(cluster: RealCluster, namespace: str, port: int, ca: CA) -> None:
    """The adapter as ``v1beta1.external.metrics.k8s.io`` through an ExternalName Service."""
    cluster.kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "adapter", "namespace": namespace},
            "spec": {"type": "ExternalName", "externalName": "localhost"},
        }
    )
    cluster.kube.apply(
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
