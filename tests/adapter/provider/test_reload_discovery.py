"""Config reload without restart (file change; a broken file keeps the old config) and background
discovery that lists a newly scraped series within seconds, not the anchor's 10 minutes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import Gauge

from adapter.config.settings import ServeSettings
from adapter.serving.app import Adapter
from gpupilot_common import atomicfile
from tests.adapter.conftest import Client, PromEnv, base_settings
from tests.support.adapter.pki import Pki

V2 = "/apis/custom.metrics.k8s.io/v1beta2"


def wait_for(check: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_config_file_change_reloads_without_dropping_requests(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> None:
    cfg = tmp_path / "adapter.yaml"
    cfg.write_text("metrics:\n  - name: gpu_busy\n    series: DCGM_FI_DEV_GPU_UTIL\n")
    adapter = start_adapter(base_settings(prom.url, pki, config_path=cfg))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    path = f"{V2}/namespaces/ai-serving/pods/embedder-0/"
    assert client.as_hpa(path + "gpu_busy").json()["items"][0]["value"] == "30"
    assert client.as_hpa(path + "gpu_hot").status_code == 404

    codes: list[int] = []
    stop = threading.Event()

    def hammer() -> None:  # requests keep flowing while the config changes under them
        while not stop.is_set():
            codes.append(client.as_hpa(V2).status_code)

    t = threading.Thread(target=hammer)
    t.start()
    try:
        # swapped in whole, as kubelet swaps a ConfigMap: a half-written file would be one more failure
        atomicfile.write_text(cfg, "metrics:\n  - name: gpu_hot\n    series: DCGM_FI_DEV_GPU_UTIL\n")
        assert wait_for(lambda: client.as_hpa(path + "gpu_hot").status_code == 200)
        assert client.as_hpa(path + "gpu_busy").status_code == 404  # renamed
        # a broken file is refused and the working config stays
        atomicfile.write_text(cfg, "metrics:\n  - name: [broken\n")
        assert wait_for(
            lambda: (
                'gpupilot_adapter_config_reloads_total{result="failure"} 1.0'
                in client.as_hpa("/metrics").text
            )
        )
        assert client.as_hpa(path + "gpu_hot").status_code == 200
    finally:
        stop.set()
        t.join()
    assert codes and set(codes) == {200}


@pytest.mark.slow
def test_new_series_are_discovered_within_seconds(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> None:
    cfg = tmp_path / "adapter.yaml"
    cfg.write_text(
        "metrics:\n  - name: DCGM_FI_DEV_GPU_UTIL\n  - name: late_arrival\n    series: gpu_late_arrival\n"
    )
    adapter = start_adapter(base_settings(prom.url, pki, config_path=cfg))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)

    def listed() -> set[str]:
        return {e["name"] for e in client.as_hpa(V2).json()["resources"]}

    assert wait_for(lambda: "pods/DCGM_FI_DEV_GPU_UTIL" in listed() and "pods/late_arrival" not in listed())
    gauge = Gauge(
        "gpu_late_arrival", "appears during the test", ["namespace", "pod"], registry=prom.live.registry
    )
    gauge.labels("ai-serving", "embedder-0").set(7)
    start = time.monotonic()
    assert wait_for(lambda: "pods/late_arrival" in listed(), timeout=30)
    assert time.monotonic() - start < 30
    r = client.as_hpa(f"{V2}/namespaces/ai-serving/pods/embedder-0/late_arrival")
    assert r.json()["items"][0]["value"] == "7"  # live scrape, served at once


def test_a_reloaded_query_replaces_the_one_in_memory(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> None:
    """The same metric name with a new query after a reload answers from the new query at once: the
    rendered query that keys the values in memory is kept per config, never across a reload."""
    cfg = tmp_path / "adapter.yaml"
    cfg.write_text("metrics:\n  - name: gpu_busy\n    series: DCGM_FI_DEV_GPU_UTIL\n")
    adapter = start_adapter(base_settings(prom.url, pki, config_path=cfg))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    path = f"{V2}/namespaces/ai-serving/pods/embedder-0/gpu_busy"
    assert client.as_hpa(path).json()["items"][0]["value"] == "30"
    atomicfile.write_text(
        cfg,
        "metrics:\n  - name: gpu_busy\n    series: DCGM_FI_DEV_GPU_UTIL\n"
        "    query: avg by (<<by>>) (<<series>>{<<matchers>>}) * 2\n",
    )
    assert wait_for(lambda: client.as_hpa(path).json()["items"][0]["value"] == "60")
