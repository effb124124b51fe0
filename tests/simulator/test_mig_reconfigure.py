"""A scheduled MIG reconfiguration (``mig_reconfigure`` fault): the exporter's series follow within one
interval, through the sim backend, the collector loop and the HTTP server; and the backfill ends the
old instances' series and starts the new ones at that moment."""

from __future__ import annotations

import threading
import time
import urllib.request

import numpy as np

from exporter.collect.collector import Collector
from exporter.serve.server import MetricsServer
from exporter.settings import CollectorSettings
from simulator import scenario as scenario_mod
from simulator.backend import SimBackend
from simulator.backfill import Backfiller

SCENARIO = """
seed: 7
nodes:
  - name: n
    gpus:
      - {model: H100 80GB, mig: all-balanced}
      - {model: H100 80GB}
workloads:
  - {namespace: ml, pod: small, devices: [n/0/1g.10gb], utilization: 30, memory_mib: 4000}
  - {namespace: ml, pod: whole, devices: [n/1], utilization: 50, memory_mib: 20000}
faults:
  - {kind: mig_reconfigure, node: n, gpu: 0, at: 1h, mig: all-1g.10gb}
"""


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return self.t

    def set(self, t: float) -> None:
        with self.lock:
            self.t = t


def instances(text: str) -> list[str]:
    return sorted(
        line.split('GPU_I_PROFILE="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("gpupilot_mig_instance_info{") and 'gpu="0"' in line
    )


def mig_uuids(text: str) -> set[str]:
    return {
        line.split('mig_uuid="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("gpupilot_mig_instance_info{")
    }


def test_series_follow_a_reconfiguration_within_one_interval():
    scenario = scenario_mod.loads(SCENARIO, name="reconf.yaml")
    clock = Clock(scenario.epoch + 3590)  # ten seconds before the change
    backend = SimBackend(scenario, node="n", clock=clock)
    interval = 0.2
    collector = Collector(
        backend,
        hostname="n",
        settings=CollectorSettings(interval=interval),
        allocations=backend.allocations,
    )
    server = MetricsServer(collector, host="127.0.0.1", port=0).start()
    collector.start()
    try:

        def scrape() -> str:
            with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as resp:
                body: bytes = resp.read()
                return body.decode()

        deadline = time.monotonic() + 10
        while not instances(text := scrape()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert instances(text) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
        old_pod_line = [
            ln
            for ln in text.splitlines()
            if ln.startswith("gpupilot_device_pod_info{") and 'pod="small"' in ln
        ]
        assert len(old_pod_line) == 1
        old_uuids = mig_uuids(text)
        changed_at = time.monotonic()
        clock.set(scenario.epoch + 3600 + 1)
        while instances(text := scrape()) != ["1g.10gb"] * 7 and time.monotonic() - changed_at < 5:
            time.sleep(0.01)
        took = time.monotonic() - changed_at
        assert instances(text) == ["1g.10gb"] * 7
        assert took <= interval + 0.5, f"the new layout took {took:.2f}s to show (interval {interval}s)"
        # the pod that held an old instance holds nothing now; the whole GPU's pod is untouched
        pods = [ln for ln in text.splitlines() if ln.startswith("gpupilot_device_pod_info{")]
        assert not [ln for ln in pods if 'pod="small"' in ln]
        assert len([ln for ln in pods if 'pod="whole"' in ln]) == 1
        # new instances, new UUIDs
        assert len(old_uuids) == 4 and len(mig_uuids(text)) == 7
        assert not old_uuids & mig_uuids(text)
    finally:
        server.stop()
        collector.stop()


def test_backfill_switches_layout_at_the_reconfiguration():
    scenario = scenario_mod.loads(SCENARIO, name="reconf.yaml")
    ts = scenario.epoch + np.arange(3000.0, 4200.0, 300.0)  # 3000 … 3900: the change at 3600
    runs = Backfiller(scenario).window(ts)
    info = runs["gpupilot_mig_instance_info"]
    spans: dict[str, tuple[int, int]] = {}
    for prefix, _src, i0, i1 in info.series:
        if 'gpu="0"' in prefix:
            spans[prefix] = (i0, i1)
    cut = int(np.searchsorted(ts, scenario.epoch + 3600))
    before = [p for p, (i0, i1) in spans.items() if (i0, i1) == (0, cut)]
    after = [p for p, (i0, i1) in spans.items() if (i0, i1) == (cut, len(ts))]
    assert len(before) == 4 and len(after) == 7
    assert all('GPU_I_PROFILE="1g.10gb"' in p for p in after)
