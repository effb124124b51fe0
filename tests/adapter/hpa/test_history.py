"""The adapter over the shared simulated fleet (``metrics_history``: 7 days backfilled, live
scrapes, rules/ loaded): the seed's HPA explained, selectors resolved through kube_pod_labels,
values equal to what Prometheus itself holds, and the MIG-aware utilisation from the recording rule."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from adapter.cli import main
from adapter.config.settings import ServeSettings
from adapter.serving.app import Adapter
from tests.adapter.conftest import Client, base_settings
from tests.support.adapter.pki import Pki
from tests.support.promquery import instant

SEED_HPA = Path(__file__).resolve().parents[3] / "examples" / "hpa-llm-inference.yaml"
V2 = "/apis/custom.metrics.k8s.io/v1beta2"


@pytest.fixture
def history_client(
    metrics_history: Any, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> Client:
    adapter = start_adapter(base_settings(metrics_history.url, pki))
    return Client(f"https://127.0.0.1:{adapter.port}", pki)


@pytest.mark.slow
def test_selector_values_match_prometheus(metrics_history: Any, history_client: Client) -> None:
    labelled = instant(
        metrics_history.url, 'kube_pod_labels{namespace="ai-serving",label_app="llm-inference"}'
    )
    pods = {r["metric"]["pod"] for r in labelled}
    assert pods, "the simulated fleet should run ai-serving/llm-inference"
    truth = {
        r["metric"]["pod"]: float(r["value"][1])
        for r in instant(metrics_history.url, 'avg by (pod) (DCGM_FI_DEV_GPU_UTIL{namespace="ai-serving"})')
        if r["metric"]["pod"] in pods
    }
    r = history_client.as_hpa(
        f"{V2}/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL", {"labelSelector": "app=llm-inference"}
    )
    assert r.status_code == 200
    got = {i["describedObject"]["name"]: i["value"] for i in r.json()["items"]}
    assert set(got) == set(truth)
    for name, value in truth.items():  # scrapes every 10 s: allow one step of drift
        served = float(got[name][:-1]) / 1000 if got[name].endswith("m") else float(got[name])
        assert abs(served - value) <= 25, (name, served, value)


def test_mig_aware_utilisation_for_every_allocated_pod(metrics_history: Any, history_client: Client) -> None:
    rule = instant(metrics_history.url, "gpupilot:pod_gpu_utilization:percent")
    by_ns: dict[str, set[str]] = {}
    for row in rule:
        by_ns.setdefault(row["metric"]["namespace"], set()).add(row["metric"]["pod"])
    assert by_ns
    ns, pods = max(by_ns.items(), key=lambda kv: len(kv[1]))
    body = history_client.as_hpa(f"{V2}/namespaces/{ns}/pods/*/gpu_utilization").json()
    served = {i["describedObject"]["name"] for i in body["items"]}
    assert served == pods


def test_seed_hpa_explained_on_the_fleet(metrics_history: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain-hpa", "-f", str(SEED_HPA), "--prometheus-url", metrics_history.url])
    out = capsys.readouterr().out
    assert code == 0, out
    # table rows are indented by two spaces; notes under the table (e.g. "missing: …") by four
    rows = [line.split() for line in out.splitlines() if line.startswith("  pods/")]
    assert [r[0] for r in rows] == ["pods/DCGM_FI_DEV_GPU_UTIL", "pods/inference_queue_depth"]
    assert all(r[6].isdigit() for r in rows), out  # both metrics produced a proposal
    final = next(line for line in out.splitlines() if "FINAL:" in line)
    after = int(final.split("→")[1].split()[0])
    assert 2 <= after <= 8  # within the seed's min/max


def test_range_points_fall_on_the_requested_grid(metrics_history: Any) -> None:
    """replay-hpa's timeline expects points at start + k × step, on both engines (the adapter's
    POSTed range queries are not shifted to step multiples by VictoriaMetrics)."""
    from adapter.clients.prometheus import PrometheusClient  # noqa: PLC0415

    end = time.time() - 7
    start = end - 6 * 3600
    client = PrometheusClient(metrics_history.url)
    series = client.query_range(
        'avg(DCGM_FI_DEV_GPU_UTIL{namespace="ai-serving"})', start=start, end=end, step=300
    )
    assert len(series) == 1
    times = [t for t, _ in series[0].points]
    assert times[0] == pytest.approx(start) and len(times) == 73
    assert all(t == pytest.approx(start + 300 * k) for k, t in enumerate(times))
