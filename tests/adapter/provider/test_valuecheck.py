"""Values checked at the door (adapter.valuecheck): NaN/Inf skipped and counted, values beyond what a
Quantity carries and several series for one object refused for that object — logged, counted in
gpupilot_adapter_values_refused_total{reason}, never clamped or picked silently — while the other
objects of the same answer are served."""

from __future__ import annotations

import logging

import orjson
import pytest
import yaml
from prometheus_client import CollectorRegistry

from adapter.clients.prometheus import Sample
from adapter.config.mapping import load_config, parse_config
from adapter.errors import ConfigError
from adapter.provider.refresh import RefreshingCache
from adapter.provider.valuecheck import QUANTITY_MAX, ValueCheck
from adapter.provider.values import MetricValues
from adapter.serving.api import MetricsApi

NS = "ai-serving"
PODS = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/*/"
UTIL = "DCGM_FI_DEV_GPU_UTIL"  # valueRange [0, 100] in the packaged config
QUEUE = "inference_queue_depth"  # no valueRange


class Prometheus:
    timeout = 5.0

    def __init__(self, samples: list[tuple[str, float]]) -> None:
        self.samples = [Sample({"namespace": NS, "pod": pod}, v, 1764500000.0) for pod, v in samples]

    def query(self, promql: str, **_: object) -> list[Sample]:
        return list(self.samples)


def answer(
    samples: list[tuple[str, float]], *, cached: bool, metric: str = UTIL
) -> tuple[dict[str, str], CollectorRegistry]:
    registry = CollectorRegistry()
    cfg = load_config(None)
    cache: RefreshingCache[object] | None = (
        RefreshingCache(interval=15, idle_drop=600, max_age=0) if cached else None
    )
    values = MetricValues(
        config=lambda: cfg,
        prometheus=Prometheus(samples),  # type: ignore[arg-type]
        pods=None,
        max_value_age=0,
        cache=cache,
        checks=ValueCheck(registry),
    )
    api = MetricsApi(values=values, listing=lambda: None, external_enabled=True, ready=lambda: [])  # type: ignore[arg-type]
    code, body = api.answer(PODS + metric, {})
    assert code == 200, body
    if cache is not None:
        cache.stop()
    items = (orjson.loads(body) if isinstance(body, bytes) else body)["items"]  # served from memory: bytes
    return {i["describedObject"]["name"]: i["value"] for i in items}, registry


def refused(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value("gpupilot_adapter_values_refused_total", {"reason": reason})
    assert value is not None
    return value


@pytest.mark.parametrize("cached", [True, False], ids=["serve", "explain"])
def test_a_value_beyond_a_quantity_is_refused_not_clamped(
    cached: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="adapter.provider.valuecheck"):
        served, registry = answer(
            [("llm-0", 1e308), ("llm-1", 80.0), ("llm-2", -1e17)], cached=cached, metric=QUEUE
        )
    assert served == {"llm-1": "80"}  # never 9223372036854775807m
    assert refused(registry, "beyond_quantity") == 2
    assert caplog.messages == [
        "metric inference_queue_depth: not served for pod llm-0: 1e+308 is beyond what a Quantity carries "
        "(±9.2e15) and 1 more"
    ]


def test_the_largest_carried_value_is_served_exactly() -> None:
    served, registry = answer([("llm-0", 9e15), ("llm-1", QUANTITY_MAX * 1.0001)], cached=False, metric=QUEUE)
    assert served == {"llm-0": "9P"} and refused(registry, "beyond_quantity") == 1


def test_non_finite_values_are_skipped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="adapter.provider.valuecheck"):
        served, registry = answer(
            [("llm-0", float("nan")), ("llm-1", float("inf")), ("llm-2", 0.5)], cached=True
        )
    assert served == {"llm-2": "500m"}
    assert refused(registry, "not_finite") == 2 and caplog.messages == []


def test_a_value_the_metric_cannot_mean_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    """DCGM_FI_DEV_GPU_UTIL has valueRange [0, 100] in the packaged config: 140 is a broken
    series, not a reason to scale."""
    with caplog.at_level(logging.WARNING, logger="adapter.provider.valuecheck"):
        served, registry = answer([("llm-0", 140.0), ("llm-1", 100.0), ("llm-2", -0.5)], cached=True)
    assert served == {"llm-1": "100"}
    assert refused(registry, "out_of_range") == 2
    assert caplog.messages == [
        "metric DCGM_FI_DEV_GPU_UTIL: not served for pod llm-0: 140 is outside the metric's valueRange "
        "[0, 100] and 1 more"
    ]


def test_value_range_is_checked_at_parse_time() -> None:
    rule = "metrics:\n  - name: m\n    valueRange: {v}\n"
    assert parse_config(yaml.safe_load(rule.format(v="[0, 1]")), source="c").metrics[0].value_range == (
        0.0,
        1.0,
    )
    for bad in ("[1, 0]", "[0]", "[0, .inf]", "'0-1'", "[true, 2]"):
        with pytest.raises(ConfigError, match=r"^c: metrics\[0\]\.valueRange: must be \[low, high\]"):
            parse_config(yaml.safe_load(rule.format(v=bad)), source="c")


def test_two_series_for_one_pod_are_refused_for_that_pod(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="adapter.provider.valuecheck"):
        served, registry = answer([("llm-0", 10.0), ("llm-1", 55.0), ("llm-0", 90.0)], cached=True)
    assert served == {"llm-1": "55"}
    assert refused(registry, "duplicate_series") == 1
    assert caplog.messages == [
        "metric DCGM_FI_DEV_GPU_UTIL: not served for pod llm-0: 2 series (10, 90); the query must give "
        "one per object (aggregate with sum by/max by)"
    ]
