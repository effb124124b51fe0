"""Per-pod figures of time-sliced GPUs to the HPA, end to end: the simulator's time-sliced node served
by the exporter, scraped by a real Prometheus with the cluster's kube-state series, answered by the
adapter's default rule over real HTTPS — each pod its own share, not the whole device's."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from adapter.config.settings import ServeSettings
from adapter.serving.app import Adapter
from devkit.prometheus import PrometheusServer, ScrapeJob
from exporter.collect.collector import Collector
from exporter.serve.server import MetricsServer
from exporter.settings import CollectorSettings
from simulator import scenario as scenario_mod
from simulator.backend import SimBackend
from simulator.cluster_server import ClusterServer
from tests.adapter.conftest import Client, base_settings
from tests.support.adapter.pki import Pki

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "fleet-sharing.yaml"
V2 = "/apis/custom.metrics.k8s.io/v1beta2"

pytestmark = pytest.mark.prometheus


@pytest.fixture(scope="module")
def shared_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    scenario = scenario_mod.load(EXAMPLE)
    backend = SimBackend(scenario, node="gpu-ts")
    collector = Collector(
        backend,
        hostname="gpu-ts",
        settings=CollectorSettings(interval=1.0),
        allocations=backend.allocations,
        process_owners=backend.process_owners,
    )
    exporter = MetricsServer(collector, host="127.0.0.1", port=0).start()
    collector.start()
    cluster = ClusterServer(scenario).start()
    server = PrometheusServer(
        tmp_path_factory.mktemp("shared-prom") / "data",
        scrape_jobs=[
            ScrapeJob("exporter", [f"127.0.0.1:{exporter.port}"], interval="1s"),
            ScrapeJob("cluster", [f"127.0.0.1:{cluster.port}"], interval="1s"),
        ],
        scrape_interval="1s",
    )
    try:
        with server:
            deadline = time.monotonic() + 60
            query = "count(gpupilot_pod_gpu_utilization_ratio) and count(kube_pod_labels)"
            while time.monotonic() < deadline:
                r = requests.get(f"{server.url}/api/v1/query", params={"query": query}, timeout=5).json()
                if r["data"]["result"]:
                    break
                time.sleep(0.3)
            else:
                raise RuntimeError(f"the exporter was not scraped within 60 s; see {server.log_file}")
            yield server.url
    finally:
        collector.stop()
        exporter.stop()
        cluster.close()


def prom_values(url: str, query: str) -> dict[str, float]:
    r = requests.get(f"{url}/api/v1/query", params={"query": query}, timeout=5).json()
    return {s["metric"].get("pod", ""): float(s["value"][1]) for s in r["data"]["result"]}


def test_hpa_gets_each_pods_own_share_of_a_time_sliced_gpu(
    shared_prometheus: str, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> None:
    adapter = start_adapter(base_settings(shared_prometheus, pki))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    deadline = time.monotonic() + 20
    while True:
        r = client.as_hpa(
            f"{V2}/namespaces/chat/pods/*/gpu_shared_utilization_ratio", {"labelSelector": "app=chat-small"}
        )
        items = r.json().get("items", []) if r.status_code == 200 else []
        if len(items) == 4 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert r.status_code == 200, r.text
    assert len(items) == 4, r.text
    served = {i["describedObject"]["name"]: i["value"] for i in items}
    own = prom_values(
        shared_prometheus, 'sum by (pod) (gpupilot_pod_gpu_utilization_ratio{namespace="chat"})'
    )
    device = prom_values(shared_prometheus, 'max(DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-ts", gpu="0"}) / 100')[""]
    assert set(served) == set(own)
    assert sum(own.values()) <= device + 1e-9
    assert all(v < device for v in own.values())  # each pod its own share, not the device's figure
    mem = client.as_hpa(
        f"{V2}/namespaces/chat/pods/*/gpu_shared_memory_used_bytes", {"labelSelector": "app=chat-small"}
    )
    assert mem.status_code == 200
    assert {i["value"] for i in mem.json()["items"]} == {"9437184k"}  # 9000 MiB each, canonical
