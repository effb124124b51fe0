"""A real Prometheus (Debian's) scrapes a running exporter on the simulator; values read back equal the snapshot's."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import requests

from devkit.prometheus import PrometheusServer, ScrapeJob
from exporter.collect.collector import Collector
from exporter.contract import fields
from exporter.expose.exposition import device_families
from exporter.serve import webconfig
from exporter.serve.server import MetricsServer
from exporter.settings import CollectorSettings
from simulator import scenario as scenario_mod
from simulator.backend import SimBackend
from tests.support.exporter import pki as pki_mod
from tests.support.exporter.allocations import plugin_allocations
from tests.support.promquery import instant

pytestmark = pytest.mark.prometheus

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "fleet-demo.yaml"
NODE = "gpu-h100-a"

Key = tuple[str, tuple[tuple[str, str], ...]]


@pytest.fixture(scope="module")
def scraped(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[PrometheusServer, Collector, SimBackend]]:
    scenario = scenario_mod.load(SCENARIO)
    frozen = scenario.epoch + 15 * 3600  # the simulator is a pure function of time: freeze it
    backend = SimBackend(scenario, node=NODE, clock=lambda: frozen)
    collector = Collector(
        backend,
        hostname=NODE,
        settings=CollectorSettings(interval=1.0, collect_timeout=1.0),
        allocations=backend.allocations,
    )
    collector.start()
    tmp = tmp_path_factory.mktemp("prom")
    with MetricsServer(collector, host="127.0.0.1", port=0) as exporter:
        job = ScrapeJob(name="gpupilot-exporter", targets=[f"127.0.0.1:{exporter.port}"], interval="1s")
        with PrometheusServer(tmp / "data", scrape_jobs=[job], scrape_interval="1s") as prom:
            yield prom, collector, backend
    collector.stop()


def wait_for(prom: PrometheusServer, promql: str, timeout: float = 30.0) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = instant(prom.url, promql)
        if result:
            return result
        time.sleep(0.3)
    raise AssertionError(f"no result for {promql} after {timeout:.0f}s")


def test_every_device_series_reaches_prometheus_with_the_snapshot_value(
    scraped: tuple[PrometheusServer, Collector, SimBackend],
) -> None:
    prom, collector, backend = scraped
    wait_for(prom, 'up{job="gpupilot-exporter"} == 1')
    wait_for(prom, "gpupilot_mig_instance_info")
    snapshot = collector.snapshot
    assert snapshot is not None
    expected: dict[Key, float] = {}
    for fam in device_families(snapshot, hostname=NODE, allocations=plugin_allocations(backend)):
        for labels, value in fam.samples:
            expected[(fam.name, tuple(sorted(labels)))] = value
    got: dict[Key, float] = {}
    for series in instant(
        prom.url, '{job="gpupilot-exporter", __name__=~"DCGM_.*|gpupilot_(gpu|mig|device|xid).*"}'
    ):
        metric = dict(series["metric"])
        name = metric.pop("__name__")
        metric.pop("job"), metric.pop("instance")
        got[(name, tuple(sorted(metric.items())))] = float(series["value"][1])
    assert got == expected
    assert len(got) > 100
    # names as dcgm-exporter's: counters without _total, MIG series with GPU_I_PROFILE
    assert instant(prom.url, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    assert instant(prom.url, 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE="1g.10gb"}')


def test_scrape_is_clean_and_self_metrics_arrive(
    scraped: tuple[PrometheusServer, Collector, SimBackend],
) -> None:
    prom, _, _ = scraped
    wait_for(prom, "gpupilot_exporter_snapshot_age_seconds")
    targets = requests.get(f"{prom.url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    ours = [t for t in targets if t["labels"]["job"] == "gpupilot-exporter"]
    assert ours and ours[0]["health"] == "up" and ours[0]["lastError"] == ""
    up = instant(prom.url, 'gpupilot_exporter_backend_up{backend="sim"}')
    assert float(up[0]["value"][1]) == 1.0
    age = float(instant(prom.url, "gpupilot_exporter_snapshot_age_seconds")[0]["value"][1])
    assert 0.0 <= age < 5.0
    errors = instant(prom.url, 'gpupilot_exporter_collection_errors_total{kind="timeout"}')
    assert float(errors[0]["value"][1]) == 0.0
    # Prometheus prefers OpenMetrics; the DCGM counters (no _total) keep name and type because the
    # exporter answers in text 0.0.4 then, as dcgm-exporter does. Every DCGM counter, as published:
    meta = requests.get(f"{prom.url}/api/v1/metadata", timeout=10).json()["data"]
    dcgm_counters = [f.name for f in fields.BY_NAME.values() if f.kind == "counter"]
    published = [name for name in dcgm_counters if name in meta]
    assert len(published) >= 7
    for name in published:
        assert [m["type"] for m in meta[name]] == ["counter"], name
    assert meta["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0]["type"] == "counter"
    assert meta["DCGM_FI_DEV_GPU_TEMP"][0]["type"] == "gauge"
    assert meta["gpupilot_exporter_collection_errors_total"][0]["type"] == "counter"


class _SecurePrometheus(PrometheusServer):
    """Adds TLS (trusting our test CA) and basic auth to every scrape job."""

    def __init__(self, data_dir: Path, *, ca_file: Path, password: str, **kw: Any) -> None:
        super().__init__(data_dir, **kw)
        self.ca_file, self.password = ca_file, password

    def config(self) -> dict[str, object]:
        cfg = super().config()
        for job in cfg["scrape_configs"]:  # type: ignore[attr-defined]
            job["tls_config"] = {"ca_file": str(self.ca_file)}
            job["basic_auth"] = {"username": "prometheus", "password": self.password}
        return cfg


def test_prometheus_scrapes_over_tls_with_basic_auth(tmp_path: Path, exporter_pki: pki_mod.Pki) -> None:
    hashed = bcrypt.hashpw(b"s3cret-scrape", bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(
        f"tls_server_config:\n  cert_file: {exporter_pki.server_cert}\n  key_file: {exporter_pki.server_key}\n"
        f"basic_auth_users:\n  prometheus: {hashed}\n"
    )
    scenario = scenario_mod.load(SCENARIO)
    backend = SimBackend(scenario, node="gpu-h200-a", clock=lambda: scenario.epoch + 3600)
    collector = Collector(
        backend, hostname="gpu-h200-a", settings=CollectorSettings(interval=1.0, collect_timeout=1.0)
    )
    collector.collect_once()
    with MetricsServer(collector, host="127.0.0.1", port=0, web_config=webconfig.load(web)) as exporter:
        job = ScrapeJob(name="secure", targets=[f"127.0.0.1:{exporter.port}"], interval="1s", scheme="https")
        prom = _SecurePrometheus(
            tmp_path / "data",
            ca_file=exporter_pki.ca_cert,
            password="s3cret-scrape",
            scrape_jobs=[job],
            scrape_interval="1s",
        )
        with prom:
            temps = wait_for(prom, 'DCGM_FI_DEV_GPU_TEMP{job="secure"}')
            targets = requests.get(f"{prom.url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    assert len(temps) == 2  # both H200s of the node
    assert targets[0]["health"] == "up" and targets[0]["lastError"] == ""
