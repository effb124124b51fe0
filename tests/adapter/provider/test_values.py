"""One call per request (adapter.provider.values.MetricValues.for_objects): it returns the values that
answer the request, checked, picked by the label selector and sorted, with nothing left to fetch;
from memory a selection is picked once per evaluation and pod list, never on the event loop; a query
sent for one call alone (explain-hpa) checks only the selected pods' samples.

Prometheus and the pod watch are the stand-ins of test_answers.py; the values, refreshing cache and
pod index are the adapter's own."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from adapter.clients.prometheus import Sample
from adapter.config import resources
from adapter.config.mapping import load_config
from adapter.errors import NotFound
from adapter.provider import nowait
from adapter.provider.nowait import WouldBlock
from adapter.provider.podsource import KubernetesPodSource
from adapter.provider.selectors import Selector, parse_selector
from adapter.provider.valuecheck import ValueCheck
from adapter.provider.values import MAX_PICKS, CustomValues, MetricValues
from tests.adapter.serving.test_answers import NS, T0, PodWatch, Prometheus, World

UTIL = "DCGM_FI_DEV_GPU_UTIL"  # valueRange [0, 100] in the packaged config


def _ask(values: MetricValues, *, name: str = "*", selector: str = "") -> CustomValues:
    return values.for_objects(
        metric=UTIL,
        resource=resources.PODS,
        namespace=NS,
        name=name,
        selector=parse_selector(selector),
        metric_selector=Selector(),
    )


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.close()


def test_from_memory_a_selection_is_picked_once_per_evaluation_and_pod_list(world: World) -> None:
    values = world.api._values
    first = _ask(values, selector="app=llm")
    assert [(v.name, v.value, v.timestamp) for v in first.values] == [("llm-0", 90, T0), ("llm-1", 80, T0)]
    assert first.memo is not None and [p.name for p in first.pods or []] == ["llm-0", "llm-1"]
    again = _ask(values, selector="app=llm")
    assert again.values is first.values and again.memo is first.memo  # read, not picked again
    assert [v.name for v in _ask(values).values] == ["emb-0", "llm-0", "llm-1"]  # every pod, in name order
    assert _ask(values).values is _ask(values).values
    assert world.watch.on_event is not None
    world.watch.on_event("MODIFIED", PodWatch.record("emb-0", "llm"))  # the selector now picks 3 pods
    relabelled = _ask(values, selector="app=llm")
    assert [v.name for v in relabelled.values] == ["emb-0", "llm-0", "llm-1"]
    assert relabelled.memo is first.memo  # the same evaluation, a new pick
    world.prom.set({"llm-0": 55, "llm-1": 65, "emb-0": 30}, T0 + 15)
    world.refresh()
    refreshed = _ask(values, selector="app=llm")
    assert refreshed.memo is not first.memo
    assert [(v.name, v.value) for v in refreshed.values] == [("emb-0", 30), ("llm-0", 55), ("llm-1", 65)]
    assert world.prom.queries == 2  # the first ask and the refresh


def test_a_first_pick_is_left_to_a_worker_thread_and_a_named_pod_is_not(world: World) -> None:
    values = world.api._values
    _ask(values, name="llm-0")  # evaluated (a worker's job), nothing picked yet
    token = nowait.enter()
    try:
        assert [v.name for v in _ask(values, name="llm-1").values] == ["llm-1"]  # a lookup: on the loop
        with pytest.raises(WouldBlock):
            _ask(values, selector="app=llm")
    finally:
        nowait.leave(token)
    picked = _ask(values, selector="app=llm")  # the worker picks…
    token = nowait.enter()
    try:
        assert _ask(values, selector="app=llm").values is picked.values  # …the loop reads
    finally:
        nowait.leave(token)


def test_a_named_object_without_a_value_is_not_found_and_an_empty_selection_is_empty(world: World) -> None:
    values = world.api._values
    with pytest.raises(NotFound, match="could not find the metric DCGM_FI_DEV_GPU_UTIL for pods gone-0"):
        _ask(values, name="gone-0")
    nobody = _ask(values, selector="app=nobody")
    assert list(nobody.values) == [] and nobody.pods == [] and nobody.memo is None
    assert world.prom.queries == 1  # the named pod's evaluation; the empty selection asked nothing


def test_a_query_for_one_call_checks_only_the_selected_pods(caplog: pytest.LogCaptureFixture) -> None:
    """explain-hpa's path: the selection is two of three pods (not named in the query: more than half
    the namespace), so the namespace's samples come back; the unselected pod's broken series (two
    series, one out of range) is neither served, logged nor counted, the selected pod's is."""
    prom = Prometheus()
    prom.samples = [
        Sample({"namespace": NS, "pod": "llm-1"}, 80.0, T0),
        Sample({"namespace": NS, "pod": "llm-0"}, 140.0, T0),  # selected, out of range
        Sample({"namespace": NS, "pod": "emb-0"}, 30.0, T0),
        Sample({"namespace": NS, "pod": "emb-0"}, 31.0, T0),  # not selected: two series
        Sample({"namespace": NS, "pod": "emb-1"}, 1e308, T0),  # not selected: beyond a Quantity
        Sample({"namespace": NS, "pod": "llm-2"}, 70.0, T0),  # selected
    ]
    pods = KubernetesPodSource(PodWatch({"llm-0": "llm", "llm-1": "llm", "llm-2": "llm", "emb-0": "e"}))  # type: ignore[arg-type]
    registry = CollectorRegistry()
    cfg = load_config(None)
    values = MetricValues(
        config=lambda: cfg,
        prometheus=prom,  # type: ignore[arg-type]
        pods=pods,
        max_value_age=0,
        checks=ValueCheck(registry),
    )
    try:
        assert pods.wait_synced(5)
        with caplog.at_level(logging.WARNING, logger="adapter.provider.valuecheck"):
            found = _ask(values, selector="app=llm")
    finally:
        pods.close()
    assert found.memo is None
    assert [(v.name, v.value) for v in found.values] == [("llm-1", 80.0), ("llm-2", 70.0)]
    assert [r.getMessage() for r in caplog.records] == [
        "metric DCGM_FI_DEV_GPU_UTIL: not served for pod llm-0: 140 is outside the metric's valueRange [0, 100]"
    ]

    def refused(reason: str) -> float | None:
        return registry.get_sample_value("gpupilot_adapter_values_refused_total", {"reason": reason})

    assert (refused("out_of_range"), refused("duplicate_series"), refused("beyond_quantity")) == (1, 0, 0)
    assert prom.queries == 1


def test_the_selections_kept_per_evaluation_are_bounded(world: World) -> None:
    values = world.api._values
    for i in range(MAX_PICKS + 10):
        found = _ask(values, selector=f"app=llm,idx!=n{i}")
        assert [v.name for v in found.values] == ["llm-0", "llm-1"]
    assert found.memo is not None and 0 < len(found.memo.picks) <= MAX_PICKS
