"""``--hostname-label Hostname|hostname|none`` with the shipped ServiceMonitor's relabelling: a real
Prometheus evaluating rules/recording.rules.yaml sees ``Hostname`` on every node in all three modes."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from devkit.prometheus import PrometheusServer, ScrapeJob
from exporter.collect.collector import Collector
from exporter.contract.layout import SeriesLayout
from exporter.serve.server import MetricsServer
from exporter.settings import CollectorSettings
from simulator import scenario as scenario_mod
from simulator.backend import SimBackend

pytestmark = pytest.mark.prometheus

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "examples" / "fleet-demo.yaml"
MODES = {"gpu-h100-a": "Hostname", "gpu-h100-b": "hostname", "gpu-a100-b": "none"}
_KEYS = {"sourceLabels": "source_labels", "targetLabel": "target_label"}


def service_monitor_endpoint() -> dict[str, Any]:
    docs = yaml.safe_load((ROOT / "deploy" / "exporter" / "servicemonitor.yaml").read_text())
    endpoint: dict[str, Any] = docs["spec"]["endpoints"][0]
    return endpoint


def as_prometheus(rule: dict[str, object]) -> dict[str, object]:
    """A prometheus-operator relabelling (camelCase) as Prometheus' own scrape config writes it."""
    return {_KEYS.get(k, k): v for k, v in rule.items()}


@pytest.fixture(scope="module")
def hostname_label_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """One exporter per hostname-label mode, scraped through the ServiceMonitor's relabelling."""
    scenario = scenario_mod.load(SCENARIO)
    frozen = scenario.epoch + 15 * 3600
    endpoint = service_monitor_endpoint()
    metric_relabel = [as_prometheus(r) for r in endpoint["metricRelabelings"]]
    # the target-level relabelling fills Hostname from the pod's node (__meta_kubernetes_pod_node_name);
    # static targets here carry that value as a target label
    target_rule = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "Hostname"]
    assert target_rule == [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "Hostname"}]
    servers, collectors, jobs = [], [], []
    for node, label in MODES.items():
        backend = SimBackend(scenario, node=node, clock=lambda: frozen)
        collector = Collector(
            backend,
            hostname=node,
            settings=CollectorSettings(interval=1.0, collect_timeout=1.0),
            allocations=backend.allocations,
            layout=SeriesLayout(hostname_label=label),  # type: ignore[arg-type]
        )
        collector.collect_once()
        server = MetricsServer(collector, host="127.0.0.1", port=0)
        server.start()
        servers.append(server)
        collectors.append(collector)
        jobs.append(
            ScrapeJob(
                name=f"exporter-{label}",
                targets=[f"127.0.0.1:{server.port}"],
                interval="1s",
                labels={"Hostname": node},
                metric_relabel_configs=metric_relabel,
            )
        )
    rules = [ROOT / "rules" / "recording.rules.yaml"]
    try:
        data = tmp_path_factory.mktemp("prom") / "data"
        with PrometheusServer(
            data, scrape_jobs=jobs, rule_files=rules, scrape_interval="1s", evaluation_interval="1s"
        ) as p:
            yield p
    finally:
        for server in servers:
            server.stop()
        for collector in collectors:
            collector.stop()


def wait_for(
    hostname_label_prom: PrometheusServer,
    promql: str,
    *,
    count: int,
    hosts: frozenset[str] = frozenset(),
    timeout: float = 40.0,
) -> list[dict[str, object]]:
    """The query's result once it has ``count`` series and a ``Hostname`` for each of ``hosts``
    (rule evaluations for different targets land in different ticks on a busy machine)."""
    deadline = time.monotonic() + timeout
    result: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        r = requests.get(f"{hostname_label_prom.url}/api/v1/query", params={"query": promql}, timeout=10)
        result = r.json()["data"]["result"]
        seen = {s["metric"].get("Hostname") for s in result}
        if len(result) >= count and hosts <= seen:
            return result
        time.sleep(0.5)
    raise AssertionError(f"{promql}: {len(result)} series after {timeout:.0f}s, wanted {count}")


def test_every_mode_reaches_rules_and_dashboards_as_hostname(hostname_label_prom: PrometheusServer) -> None:
    # the alert expression of GPUHighTemperature and the fleet dashboard's temperature panel
    temps = wait_for(hostname_label_prom, "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)", count=3)
    assert {s["metric"]["Hostname"] for s in temps} == set(MODES)  # type: ignore[index]
    # a recording rule of rules/recording.rules.yaml, grouped by Hostname
    recorded = wait_for(
        hostname_label_prom,
        "count by (Hostname) (gpupilot:slice_activity:avg5m)",
        count=2,
        hosts=frozenset({"gpu-h100-a", "gpu-h100-b"}),
    )
    assert {s["metric"]["Hostname"] for s in recorded} >= {"gpu-h100-a", "gpu-h100-b"}  # type: ignore[index]
    # the exporter's own label is kept as sent: hostname in that mode, none in the other
    lower = wait_for(hostname_label_prom, 'DCGM_FI_DEV_GPU_TEMP{hostname!=""}', count=1)
    assert {s["metric"]["hostname"] for s in lower} == {"gpu-h100-b"}  # type: ignore[index]
