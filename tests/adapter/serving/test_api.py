"""The API over real HTTPS against a real Prometheus with backfilled data: discovery, every path
form, v1beta1/v1beta2 shapes, values, 404/400 Status, stale values, external metrics, health,
/version, the adapter's own /metrics, and 503 with the cause when Prometheus is down."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import orjson
import pytest

from adapter.config import resources
from adapter.config.settings import ServerLimits, ServeSettings
from adapter.provider import nowait
from adapter.provider.selectors import parse_selector
from adapter.provider.values import ObjectValue
from adapter.serving.api import MetricsApi
from adapter.serving.app import Adapter
from devkit.prometheus import free_port
from tests.adapter.conftest import Client, PromEnv, base_settings
from tests.support.adapter import data
from tests.support.adapter.pki import Pki

V2 = "/apis/custom.metrics.k8s.io/v1beta2"
V1 = "/apis/custom.metrics.k8s.io/v1beta1"
EXT = "/apis/external.metrics.k8s.io/v1beta1"
LLM = {"labelSelector": "app=llm-inference"}


def values(body: dict[str, Any]) -> dict[str, str]:
    return {i["describedObject"]["name"]: i["value"] for i in body["items"]}


def test_pods_star_with_selector_v1beta2(adapter_client: Client) -> None:
    r = adapter_client.as_hpa(f"{V2}/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL", LLM)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/json"
    body = r.json()
    assert body["kind"] == "MetricValueList"
    assert body["apiVersion"] == "custom.metrics.k8s.io/v1beta2"
    assert values(body) == {
        "llm-inference-7d9f-a": "90",
        "llm-inference-7d9f-b": "80",
        "llm-inference-7d9f-c": "70",
    }
    item = body["items"][0]
    assert item["describedObject"] == {
        "kind": "Pod",
        "namespace": "ai-serving",
        "name": "llm-inference-7d9f-a",
        "apiVersion": "/v1",
    }
    assert item["metric"] == {"name": "DCGM_FI_DEV_GPU_UTIL", "selector": None}
    assert item["windowSeconds"] == 60
    assert item["timestamp"].endswith("Z") and len(item["timestamp"]) == 20


def test_v1beta1_items_are_flat(adapter_client: Client) -> None:
    body = adapter_client.as_hpa(f"{V1}/namespaces/ai-serving/pods/*/inference_queue_depth", LLM).json()
    assert body["apiVersion"] == "custom.metrics.k8s.io/v1beta1"
    item = body["items"][0]
    assert set(item) == {"describedObject", "metricName", "timestamp", "window", "value", "selector"}
    assert item["metricName"] == "inference_queue_depth"
    assert sorted(i["value"] for i in body["items"]) == ["10", "12", "14"]


def test_single_pod_and_quantity_forms(adapter_client: Client) -> None:
    body = adapter_client.as_hpa(f"{V2}/namespaces/ai-serving/pods/embedder-0/gpu_memory_used_bytes").json()
    assert len(body["items"]) == 1
    assert body["items"][0]["value"] == "1572864k"  # 1500 MiB = 1,572,864,000 bytes, canonical
    ratio = adapter_client.as_hpa(
        f"{V2}/namespaces/ai-serving/pods/llm-inference-7d9f-a/gpu_memory_used_ratio"
    ).json()
    assert ratio["items"][0]["value"] == "250m"  # 20000 / (20000 + 60000)


def test_mig_pod_uses_the_recording_rule(adapter_client: Client) -> None:
    body = adapter_client.as_hpa(f"{V2}/namespaces/research/pods/*/gpu_utilization").json()
    assert values(body) == {"trainer-0": "42"}


def test_namespace_metric_and_cluster_scoped_forms(adapter_client: Client) -> None:
    body = adapter_client.as_hpa(f"{V2}/namespaces/ai-serving/metrics/inference_queue_depth").json()
    assert body["items"][0]["describedObject"] == {
        "kind": "Namespace",
        "name": "ai-serving",
        "apiVersion": "/v1",
    }
    assert body["items"][0]["value"] == "36"  # 14 + 12 + 10
    same = adapter_client.as_hpa(f"{V2}/namespaces/ai-serving/inference_queue_depth").json()
    assert same["items"][0]["value"] == "36"
    node = adapter_client.as_hpa(f"{V2}/nodes/gpu-node-03/DCGM_FI_DEV_GPU_UTIL").json()
    assert node["items"][0]["describedObject"] == {"kind": "Node", "name": "gpu-node-03", "apiVersion": "/v1"}
    assert node["items"][0]["value"] == "70"
    nodes = adapter_client.as_hpa(f"{V2}/nodes/*/DCGM_FI_DEV_GPU_UTIL").json()
    assert values(nodes)["gpu-node-01"] == "60"  # mean of 90 and 30


def test_metric_label_selector(adapter_client: Client) -> None:
    params = {**LLM, "metricLabelSelector": "Hostname in (gpu-node-01,gpu-node-02)"}
    body = adapter_client.as_hpa(f"{V2}/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL", params).json()
    assert values(body) == {"llm-inference-7d9f-a": "90", "llm-inference-7d9f-b": "80"}
    assert body["items"][0]["metric"]["selector"] == {
        "matchExpressions": [{"key": "Hostname", "operator": "In", "values": ["gpu-node-01", "gpu-node-02"]}]
    }


def test_selector_paths_agree_whether_pods_are_named_or_matched_in_process(adapter_client: Client) -> None:
    # one embedder of five pods: named in the (POST) query; all five: namespace-wide and matched here
    few = adapter_client.as_hpa(
        f"{V2}/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL", {"labelSelector": "app=embedder"}
    )
    many = adapter_client.as_hpa(
        f"{V2}/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL", {"labelSelector": "app!=nothing"}
    )
    assert values(few.json()) == {"embedder-0": "30"}
    assert values(many.json()) == {
        "embedder-0": "30",
        "llm-inference-7d9f-a": "90",
        "llm-inference-7d9f-b": "80",
        "llm-inference-7d9f-c": "70",
    }  # batch-stale is absent: its values are older than --max-value-age


def test_stale_values_are_not_served(adapter_client: Client) -> None:
    r = adapter_client.as_hpa(f"{V2}/namespaces/ai-serving/pods/batch-stale/DCGM_FI_DEV_GPU_UTIL")
    assert r.status_code == 404
    assert "no value newer than 120s" in r.json()["message"]


def test_stale_values_are_served_when_the_age_limit_allows(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> None:
    adapter = start_adapter(base_settings(prom.url, pki, max_value_age=0.0))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    # Prometheus' own 5-minute lookback has expired too: the series ended 10 minutes ago
    assert (
        client.as_hpa(f"{V2}/namespaces/ai-serving/pods/batch-stale/DCGM_FI_DEV_GPU_UTIL").status_code == 404
    )
    adapter2 = start_adapter(base_settings(prom.url, pki, max_value_age=900.0))
    client2 = Client(f"https://127.0.0.1:{adapter2.port}", pki)
    r = client2.as_hpa(f"{V2}/namespaces/ai-serving/pods/batch-stale/DCGM_FI_DEV_GPU_UTIL")
    assert r.status_code == 200
    assert r.json()["items"][0]["value"] == "55"


@pytest.mark.parametrize(
    ("path", "params", "code", "text"),
    [
        (
            f"{V2}/namespaces/ai-serving/pods/*/no_such_metric",
            LLM,
            404,
            "could not find the metric no_such_metric for pods",
        ),
        (
            f"{V2}/namespaces/ai-serving/pods/ghost-pod/DCGM_FI_DEV_GPU_UTIL",
            None,
            404,
            "for pods ghost-pod in namespace ai-serving",
        ),
        (
            f"{V2}/namespaces/ai-serving/deployments.apps/llm-inference/DCGM_FI_DEV_GPU_UTIL",
            None,
            404,
            "for deployments.apps",
        ),
        (f"{V2}/namespaces/ai-serving/widgets/*/DCGM_FI_DEV_GPU_UTIL", None, 404, "for widgets"),
        (
            f"{V2}/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL",
            {"labelSelector": "app in (x"},
            400,
            "unbalanced",
        ),
        (f"{V2}/pods/*/DCGM_FI_DEV_GPU_UTIL", None, 400, "pods are namespaced"),
        ("/apis/custom.metrics.k8s.io/v2/namespaces/x/pods/*/y", None, 404, "version v2"),
        (f"{EXT}/namespaces/ai-serving/no_such_external", None, 404, "external metric no_such_external"),
    ],
)
def test_errors_are_status_objects(
    adapter_client: Client, path: str, params: dict[str, Any] | None, code: int, text: str
) -> None:
    r = adapter_client.as_hpa(path, params)
    assert r.status_code == code
    body = r.json()
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["code"] == code
    assert text in body["message"]


def test_empty_selection_is_an_empty_list(adapter_client: Client) -> None:
    body = adapter_client.as_hpa(
        f"{V2}/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL", {"labelSelector": "app=nobody"}
    ).json()
    assert body["kind"] == "MetricValueList" and body["items"] == []


def test_discovery(adapter_client: Client) -> None:
    body = adapter_client.as_hpa(V2).json()
    assert body["kind"] == "APIResourceList" and body["groupVersion"] == "custom.metrics.k8s.io/v1beta2"
    entries = {e["name"]: e for e in body["resources"]}
    assert entries["pods/DCGM_FI_DEV_GPU_UTIL"] == {
        "name": "pods/DCGM_FI_DEV_GPU_UTIL",
        "singularName": "",
        "namespaced": True,
        "kind": "MetricValueList",
        "verbs": ["get"],
    }
    assert entries["nodes/DCGM_FI_DEV_GPU_UTIL"]["namespaced"] is False
    assert "pods/gpu_utilization" in entries and "pods/inference_queue_depth" in entries
    assert adapter_client.as_hpa(V1).json()["groupVersion"] == "custom.metrics.k8s.io/v1beta1"
    ext = adapter_client.as_hpa(EXT).json()
    assert {e["name"]: e["kind"] for e in ext["resources"]}[
        "gpupilot_fleet_waste_gpu_equivalents"
    ] == "ExternalMetricValueList"
    groups = adapter_client.as_hpa("/apis").json()
    custom = next(g for g in groups["groups"] if g["name"] == "custom.metrics.k8s.io")
    assert custom["preferredVersion"]["version"] == "v1beta2"
    assert [v["version"] for v in custom["versions"]] == ["v1beta2", "v1beta1"]


def test_external_metrics(adapter_client: Client) -> None:
    body = adapter_client.as_hpa(f"{EXT}/namespaces/ai-serving/gpupilot_fleet_waste_gpu_equivalents").json()
    assert (
        body["kind"] == "ExternalMetricValueList" and body["apiVersion"] == "external.metrics.k8s.io/v1beta1"
    )
    assert body["items"][0]["value"] == "1500m"
    assert set(body["items"][0]) == {"metricName", "metricLabels", "timestamp", "window", "value"}
    total = adapter_client.as_hpa(f"{EXT}/namespaces/ai-serving/inference_queue_depth_total").json()
    assert total["items"][0]["value"] == "36"
    other = adapter_client.as_hpa(f"{EXT}/namespaces/research/inference_queue_depth_total").json()
    assert other["items"] == []  # scoped by namespace: research has no queue


def test_external_metrics_can_be_switched_off(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> None:
    adapter = start_adapter(base_settings(prom.url, pki, external_metrics=False))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    assert client.as_hpa(EXT).status_code == 404
    assert (
        client.as_hpa(f"{EXT}/namespaces/ai-serving/gpupilot_fleet_waste_gpu_equivalents").status_code == 404
    )
    names = [g["name"] for g in client.as_hpa("/apis").json()["groups"]]
    assert names == ["custom.metrics.k8s.io"]


def test_version_health_and_self_metrics(adapter_client: Client) -> None:
    version = adapter_client.as_hpa("/version").json()
    assert version["major"] == "1" and version["gitVersion"].startswith("v1.")
    for path in ("/healthz", "/livez", "/readyz"):
        r = adapter_client.get(path)  # no credentials: probes carry none
        assert (r.status_code, r.text) == (200, "ok")
    assert "[+]pod-source ok" in adapter_client.get("/readyz", params={"verbose": "1"}).text
    adapter_client.as_hpa(f"{V2}/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL", LLM)
    text = adapter_client.as_hpa("/metrics").text
    assert 'gpupilot_adapter_requests_total{code="200",kind="custom"}' in text
    assert "gpupilot_adapter_prometheus_query_duration_seconds_bucket" in text
    assert "gpupilot_adapter_discovery_age_seconds" in text


def test_prometheus_down_is_503_with_the_cause(
    pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    adapter = start_adapter(base_settings(dead, pki, pod_source="none"))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    r = client.as_hpa(f"{V2}/namespaces/ai-serving/pods/llm-inference-7d9f-a/DCGM_FI_DEV_GPU_UTIL")
    assert r.status_code == 503
    body = r.json()
    assert body["reason"] == "ServiceUnavailable" and body["code"] == 503
    assert f"cannot reach Prometheus at {dead}: connection refused" in body["message"]
    # discovery still answers (everything configured is listed until Prometheus is back)
    assert client.as_hpa(V2).status_code == 200


def test_prometheus_query_error_is_503_naming_the_error(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path
) -> None:
    cfg = tmp_path / "bad-query.yaml"
    cfg.write_text(
        "metrics:\n  - name: broken\n    series: DCGM_FI_DEV_GPU_UTIL\n    query: 'rate(<<series>>{<<matchers>>})'\n"
    )
    adapter = start_adapter(base_settings(prom.url, pki, config_path=cfg))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    r = client.as_hpa(f"{V2}/namespaces/ai-serving/pods/embedder-0/broken")
    assert r.status_code == 503
    message = r.json()["message"]
    assert f"Prometheus at {prom.url} refused the query (bad_data: " in message
    assert 'expected type range vector in call to function "rate"' in message


def test_data_fixture_matches_the_seed_expectations() -> None:
    llm = [p for p in data.PODS if p.app == "llm-inference"]
    assert sum(p.util for p in llm) / len(llm) == 80


def test_too_many_requests_in_flight_is_429(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> None:
    settings = base_settings(
        prom.url, pki, limits=ServerLimits(max_inflight=2, inflight_wait=0.25), refresh_interval=30.0
    )
    adapter = start_adapter(settings)
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    gate = threading.Event()
    entered = threading.Semaphore(0)
    real = adapter.app.api.answer

    def slow(path: str, query: Mapping[str, str]) -> Any:
        nowait.check()  # an answer that needs a worker thread (a first evaluation, say)
        entered.release()
        gate.wait(10)
        return real(path, query)

    adapter.app.api.answer = slow  # type: ignore[method-assign]
    path = f"{V2}/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        held = [pool.submit(client.as_hpa, path, LLM) for _ in range(2)]  # two slow requests hold both slots
        assert entered.acquire(timeout=10) and entered.acquire(timeout=10)
        r = client.as_hpa(path, LLM)
        assert r.status_code == 429
        assert r.json()["reason"] == "TooManyRequests"
        gate.set()
        assert [f.result().status_code for f in held] == [200, 200]
    assert client.as_hpa(path, LLM).status_code == 200


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
@pytest.mark.parametrize("msel", ["", "Hostname in (gpu-node-01,gpu-node-02)"])
def test_items_are_encoded_as_the_reference_shapes_them_and_kept_in_the_memo(version: str, msel: str) -> None:
    """Each item field for field as custom.metrics.k8s.io's MetricValue of that version (written out
    here from the API reference); encoded once, then joined from the memo."""
    objects = [
        ObjectValue(resources.PODS, "ai-serving", 'odd-"name\\', 1.5, 1764500000.9, 60),
        ObjectValue(resources.PODS, "ai-serving", "llm-0", 3e9, 1764500001.0, 30),
        ObjectValue(resources.NODES, "", "gpu-node-01", 0.25, 1764500000.0, 60),
    ]
    selector = parse_selector(msel)
    selector_object = (
        {
            "matchExpressions": [
                {"key": "Hostname", "operator": "In", "values": ["gpu-node-01", "gpu-node-02"]}
            ]
        }
        if msel
        else None
    )
    described = [
        {"kind": "Pod", "namespace": "ai-serving", "name": 'odd-"name\\', "apiVersion": "/v1"},
        {"kind": "Pod", "namespace": "ai-serving", "name": "llm-0", "apiVersion": "/v1"},
        {"kind": "Node", "name": "gpu-node-01", "apiVersion": "/v1"},
    ]
    stamps = [("2025-11-30T10:53:20Z", 60), ("2025-11-30T10:53:21Z", 30), ("2025-11-30T10:53:20Z", 60)]
    quantities = ["1500m", "3G", "250m"]
    if version == "v1beta2":
        expected = [
            {
                "describedObject": d,
                "metric": {"name": "DCGM_FI_DEV_GPU_UTIL", "selector": selector_object},
                "timestamp": t,
                "windowSeconds": w,
                "value": q,
            }
            for d, (t, w), q in zip(described, stamps, quantities, strict=True)
        ]
    else:
        expected = [
            {
                "describedObject": d,
                "metricName": "DCGM_FI_DEV_GPU_UTIL",
                "timestamp": t,
                "window": w,
                "value": q,
                "selector": selector_object,
            }
            for d, (t, w), q in zip(described, stamps, quantities, strict=True)
        ]
    memo: dict[Hashable, bytes] = {}
    cold = MetricsApi._custom_list(version, "DCGM_FI_DEV_GPU_UTIL", objects, selector, memo)
    decoded = orjson.loads(cold)
    assert decoded == {
        "kind": "MetricValueList",
        "apiVersion": f"custom.metrics.k8s.io/{version}",
        "metadata": {},
        "items": expected,
    }
    assert [list(i) for i in decoded["items"]] == [list(i) for i in expected]  # field order as well
    assert [list(i["describedObject"]) for i in decoded["items"]] == [list(d) for d in described]
    assert len(memo) == 3
    memo[(version, "DCGM_FI_DEV_GPU_UTIL", selector, "llm-0")] = b'{"from":"memo"}'
    hot = MetricsApi._custom_list(version, "DCGM_FI_DEV_GPU_UTIL", objects, selector, memo)
    assert orjson.loads(hot)["items"][1] == {"from": "memo"}  # a kept item is joined, not encoded again
