"""Autoscaled services: the scenario's services: section (one-line errors), the week's run (the HPA's
decisions within its bounds, pods Ready after the start-up delay, the queue curves), and the same
series live and in the backfill."""

from __future__ import annotations

import io
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from exporter.errors import ScenarioError
from hpa_controller import decide as hpa
from simulator import backfill, cluster, scenario, service, service_series
from simulator.cluster_server import ClusterServer
from simulator.model import Scenario

REPO = Path(__file__).resolve().parents[2]
WEEK = REPO / "examples" / "inference-week.yaml"
MONDAY = service.week_start(1796601585.0)  # 2026-11-30T00:00:00Z


def _service_text(extra: str = "", hpa_block: str = "") -> str:
    return (
        "nodes: [{name: n1, gpus: [{model: H100 80GB}]}]\n"
        "services:\n"
        "  - namespace: ai\n"
        "    deployment: chat\n"
        "    startup: 1m\n"
        "    load: {base: 5, peak: 40, bursts: {per_day: 2, duration: 5m, height: 0.5}, noise: 0.05}\n"
        "    capacity: {requests_per_second: 10}\n"
        + (
            hpa_block
            or "    hpa: {name: chat-hpa, min_replicas: 1, max_replicas: 8, metrics: [{name: inference_queue_depth, averageValue: 2}]}\n"
        )
        + extra
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            _service_text().replace("    capacity: {requests_per_second: 10}\n", ""),
            "services[0].capacity: required",
        ),
        (_service_text().replace("peak: 40", "peak: 2"), "services[0].load.peak: 2 is below base 5"),
        (
            _service_text(
                hpa_block="    hpa: {name: h, max_replicas: 3, metrics: [{name: gpu_util, averageValue: 2}]}\n"
            ),
            "services[0].hpa.metrics[0].name: 'gpu_util' is not one of the service's per-pod metrics",
        ),
        (
            _service_text(
                hpa_block="    hpa: {name: h, min_replicas: 4, max_replicas: 3, metrics: [{name: inference_queue_depth, averageValue: 2}]}\n"
            ),
            "services[0].hpa.max_replicas: 3 is below min_replicas 4",
        ),
        (
            _service_text(
                hpa_block="    hpa: {name: h, max_replicas: 3, metrics: [{name: inference_queue_depth, averageValue: 2}], "
                "behavior: {scaleUp: {policies: [{type: Pod, value: 1, periodSeconds: 60}]}}}\n"
            ),
            "services[0].hpa.behavior.scaleUp.policies[0].type: 'Pod' is not Pods or Percent",
        ),
        (_service_text().replace("startup: 1m", "startup: soon"), "services[0].startup:"),
    ],
)
def test_bad_services_are_one_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as exc:
        scenario.load(path)
    message = str(exc.value)
    assert "\n" not in message and message.startswith(str(path)), message
    assert expected in message, message


def test_the_example_week_reads_its_hpa_in_kubernetes_spelling() -> None:
    svc = scenario.load(WEEK).services[0]
    assert (svc.hpa.min_replicas, svc.hpa.max_replicas) == (2, 24)
    assert [m.name for m in svc.hpa.metrics] == ["inference_queue_depth", "inference_kv_cache_usage_ratio"]
    assert svc.hpa.behavior is not None
    assert svc.hpa.behavior.scale_up.policies == (hpa.Policy("Pods", 1, 60),)
    assert svc.hpa.behavior.scale_down.stabilization_seconds == 900
    assert (svc.capacity, svc.slots, svc.startup) == (10.0, 16, 120.0)


@pytest.fixture(scope="module")
def small() -> Scenario:
    return scenario.loads(_service_text(), name="small.yaml")


def test_the_hpa_follows_the_load_within_its_bounds(small: Scenario) -> None:
    svc = small.services[0]
    run = service.simulate(svc, small.seed, start=MONDAY, steps=5760, warmup=3600.0)
    assert run.spec.min() >= 1 and run.spec.max() <= 8
    peak = int(np.argmax(service.offered(svc, small.seed, MONDAY + 15.0 * np.arange(5760, dtype=np.float64))))
    trough = int(np.argmin(run.offered))
    assert run.spec[peak] > run.spec[trough], "more replicas at the daily peak than at the trough"
    assert np.all(run.ready <= run.spec)
    # served + rejected + backlog growth conserve the offered load over the day
    served = float(np.sum(run.served * run.ready)) * service.SYNC_S
    rejected = float(np.sum(run.rejected * run.ready)) * service.SYNC_S
    offered = float(np.sum(run.offered)) * service.SYNC_S
    assert served + rejected <= offered * 1.0001
    assert served + rejected >= offered * 0.98


def test_pods_are_ready_after_the_startup_delay_and_publish_only_then(small: Scenario) -> None:
    svc = small.services[0]
    wk = service.week(svc, small.seed, MONDAY)
    young = next(p for p in wk.pods if p.created > MONDAY + 3600)
    assert young.ready_at == pytest.approx(young.created + 60.0)
    series = {s.family + str(s.labels): s for s in service_series._pod(small.seed, svc, wk, young)}
    queue = next(s for k, s in series.items() if k.startswith("inference_queue_depth"))
    ts = np.array([young.created + 15.0, young.ready_at + 15.0])
    assert callable(queue.value)
    got = queue.value(ts)
    assert math.isnan(got[0]) and math.isfinite(got[1])


def test_queue_and_wait_grow_as_load_per_replica_nears_capacity() -> None:
    low = service._curves(0.5, 0.0, 10.0, 100.0, 16)
    mid = service._curves(0.85, 0.0, 10.0, 100.0, 16)
    high = service._curves(0.95, 0.0, 10.0, 100.0, 16)
    assert low[0] < mid[0] < high[0] and high[0] > 10 * mid[0] / 2
    assert low[2] == 0.0 < mid[2] < high[2]
    assert low[3] < mid[3] < high[3] < 1.0
    queued = service._curves(0.95, 50.0, 10.0, 100.0, 16)
    assert queued[0] == pytest.approx(high[0] + 50.0) and queued[2] == pytest.approx(high[2] + 5.0)


def test_a_what_if_model_replaces_the_scenarios_hpa(small: Scenario) -> None:
    svc = small.services[0]
    stricter = replace(
        svc.hpa, metrics=(hpa.MetricSpec("Pods", "inference_queue_depth", "AverageValue", 0.5),)
    )
    base = service.simulate(svc, small.seed, start=MONDAY, steps=2880, warmup=3600.0)
    more = service.simulate(svc, small.seed, start=MONDAY, steps=2880, model=stricter, warmup=3600.0)
    assert service.replica_seconds(more.spec) > service.replica_seconds(base.spec)
    assert np.array_equal(base.offered, more.offered)


def test_live_endpoint_and_backfill_publish_the_same_service_samples(small: Scenario) -> None:
    t = MONDAY + 13 * 3600 + 7.0
    live = {
        (f.name, labels): value
        for f in cluster.families(small, t, all_series=service_series.window_series(small, t, t))
        for labels, value in f.samples
    }
    filler = backfill.Backfiller(small)
    runs = filler.window(np.array([t - 60.0, t, t + 60.0]))
    got = {}
    for name, run in runs.items():
        for prefix, src, i0, i1 in run.series:
            value = src if isinstance(src, float) else float(src[1])
            if i0 <= 1 < i1 and math.isfinite(value):
                got[(name, prefix)] = value
    queue = {k: v for k, v in live.items() if k[0] == "inference_queue_depth"}
    assert queue, "the service's pods publish their queue live"
    for (name, labels), value in queue.items():
        prefix = filler._fmt.prefix(name, labels)
        assert got[(name, prefix)] == value
    spec_live = live[("kube_deployment_spec_replicas", (("namespace", "ai"), ("deployment", "chat")))]
    assert (
        spec_live
        == got[
            (
                "kube_deployment_spec_replicas",
                'kube_deployment_spec_replicas{namespace="ai",deployment="chat"} ',
            )
        ]
    )


def test_cluster_server_serves_the_services_pods(small: Scenario) -> None:
    t = MONDAY + 15 * 3600.0
    server = ClusterServer(small, clock=lambda: t)
    text = server.render()
    assert 'kube_deployment_spec_replicas{namespace="ai",deployment="chat"}' in text
    assert "inference_requests_total{" in text and 'inference_queue_wait_seconds{namespace="ai"' in text


def test_the_backfill_writes_no_sample_where_a_pod_did_not_exist(tmp_path: Path) -> None:
    runs = {"x": backfill._Run("gauge", "h", [('x{pod="a"} ', np.array([1.0, math.nan, 3.0]), 0, 3)])}
    out = io.StringIO()
    n = backfill.write_window(out, runs, np.array([10.0, 20.0, 30.0]))
    assert n == 2
    assert 'x{pod="a"} 1.0 10\n' in out.getvalue() and " 20\n" not in out.getvalue()
