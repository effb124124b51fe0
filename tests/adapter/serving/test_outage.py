"""Prometheus stopped under a serving adapter, as docs/outages.md tells it: the last values for
--max-value-age, then 503 naming the cause, readiness kept throughout (the APIService stays
Available), and values again within one refresh of Prometheus answering."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from adapter.serving.app import Adapter
from devkit.prometheus import PrometheusServer, ScrapeJob, backfill_openmetrics, free_port
from tests.adapter.conftest import Client, _text_exposition_server, base_settings
from tests.support.adapter import data
from tests.support.adapter.pki import Pki

pytestmark = pytest.mark.slow
METRIC = (
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ai-serving/pods/llm-inference-7d9f-a/DCGM_FI_DEV_GPU_UTIL"
)
MAX_AGE = 6.0


def _until(check: Callable[[], bool], *, timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(0.25)
    raise AssertionError(f"{what} not within {timeout} s")


def test_prometheus_down_then_back(tmp_path: Path, pki: Pki, start_adapter: Callable[..., Adapter]) -> None:
    registry = CollectorRegistry()
    registry.register(data.LiveCluster())
    target_port, prom_port = free_port(), free_port()
    target = {"job": "live", "instance": f"127.0.0.1:{target_port}"}
    backfill_openmetrics(
        data.write_openmetrics(tmp_path / "c.om.txt", now=time.time(), target=target), tmp_path / "data"
    )
    exposition = _text_exposition_server(target_port, registry)

    def prometheus() -> PrometheusServer:
        return PrometheusServer(
            tmp_path / "data",
            scrape_jobs=[ScrapeJob("live", [f"127.0.0.1:{target_port}"], interval="1s")],
            scrape_interval="1s",
            port=prom_port,
        )

    server = prometheus()
    server.start()
    try:
        adapter = start_adapter(
            base_settings(server.url, pki, pod_source="none", refresh_interval=1.0, max_value_age=MAX_AGE)
        )
        client = Client(f"https://127.0.0.1:{adapter.port}", pki)
        _until(lambda: client.as_hpa(METRIC).status_code == 200, timeout=30, what="a first value")
        server.stop()
        down = time.monotonic()
        assert client.as_hpa(METRIC).status_code == 200  # the last good value, younger than MAX_AGE
        _until(lambda: client.as_hpa(METRIC).status_code == 503, timeout=MAX_AGE + 10, what="503")
        assert time.monotonic() - down >= MAX_AGE - 1.5
        answer = client.as_hpa(METRIC).json()
        assert f"cannot reach Prometheus at {server.url}" in answer["message"]
        assert "the last good value is" in answer["message"]
        assert client.get("/readyz").status_code == 200  # readiness kept: the APIService stays Available
        server = prometheus()
        server.start()
        # values again once Prometheus has scraped a sample younger than MAX_AGE and the next refresh
        # (1 s) read it: seconds, not a restart of the adapter
        _until(lambda: client.as_hpa(METRIC).status_code == 200, timeout=20, what="values again")
    finally:
        server.stop()
        exposition.shutdown()
