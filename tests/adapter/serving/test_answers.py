"""Encoded answers kept between refreshes (``adapter.serving.answers``) and answering on the event loop
(``adapter.provider.nowait``): a stored answer is served only while the evaluation and the pod selection it
was built from are current — a refresh with new values, a pod whose labels change, a pod that
arrives, each gives a new answer — different requests never share one, the store is bounded, and
an answer that needs the network or encoding is left to a worker thread.

The API, values, refreshing cache and pod index are the adapter's own; Prometheus and the pod
watch are stand-ins the test drives (the same paths over real HTTPS, Prometheus and the Kubernetes
API double are in test_refresh.py and test_kube.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sized
from typing import cast

import orjson
import pytest

from adapter.clients.kube import PodRecord
from adapter.clients.prometheus import Sample
from adapter.config.mapping import AdapterConfig, load_config, parse_config
from adapter.provider import nowait
from adapter.provider.discovery import Listing
from adapter.provider.podsource import KubernetesPodSource
from adapter.provider.refresh import RefreshingCache
from adapter.provider.values import MetricValues
from adapter.serving.answers import POD_BYTES, AnswerCache
from adapter.serving.api import MetricsApi, rfc3339
from adapter.serving.auth import Authenticator, Authorizer
from adapter.serving.selfmetrics import SelfMetrics
from adapter.serving.server import App
from tests.support.clocks import ManualClock

NS = "ai-serving"
V2 = "/apis/custom.metrics.k8s.io/v1beta2"
V1 = "/apis/custom.metrics.k8s.io/v1beta1"
UTIL = f"{V2}/namespaces/{NS}/pods/*/DCGM_FI_DEV_GPU_UTIL"
T0 = 1764500000.0


class Prometheus:
    """Answers every instant query with ``samples`` (what a namespace-wide query returns)."""

    timeout = 5.0

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        self.queries = 0

    def set(self, values: dict[str, float], at: float) -> None:
        self.samples = [Sample({"namespace": NS, "pod": pod}, v, at) for pod, v in values.items()]

    def query(self, promql: str, **_: object) -> list[Sample]:
        self.queries += 1
        return list(self.samples)


class PodWatch:
    """The pod list+watch the pod source consumes: one list, then the events the test sends."""

    def __init__(self, pods: dict[str, str]) -> None:
        self.initial = [self.record(name, app) for name, app in pods.items()]
        self.on_event: Callable[[str, PodRecord], None] | None = None

    @staticmethod
    def record(name: str, app: str) -> PodRecord:
        return PodRecord(NS, name, {"app": app}, "Running", True, False)

    def watch_pods(
        self,
        *,
        on_reset: Callable[[list[PodRecord]], None],
        on_event: Callable[[str, PodRecord], None],
        stop: threading.Event,
    ) -> None:
        self.on_event = on_event
        on_reset(self.initial)
        stop.wait()


EMPTY_LISTING = Listing(custom=(), external=(), refreshed=0.0)
"""Discovery is not what these tests read."""


class World:
    def __init__(self, *, config: AdapterConfig | None = None, answers: AnswerCache | None = None) -> None:
        self.prom = Prometheus()
        self.prom.set({"llm-0": 90, "llm-1": 80, "emb-0": 30}, T0)
        self.watch = PodWatch({"llm-0": "llm", "llm-1": "llm", "emb-0": "embedder"})
        self.pods = KubernetesPodSource(self.watch)  # type: ignore[arg-type]
        assert self.pods.wait_synced(5)
        self.clock = ManualClock()
        self.cache: RefreshingCache[object] = RefreshingCache(
            interval=15, idle_drop=600, max_age=0, clock=self.clock
        )
        cfg = config or load_config(None)
        values = MetricValues(
            config=lambda: cfg,
            prometheus=self.prom,  # type: ignore[arg-type]
            pods=self.pods,
            max_value_age=0,
            cache=self.cache,
        )
        self.api = MetricsApi(
            values=values,
            listing=lambda: EMPTY_LISTING,
            external_enabled=False,
            ready=lambda: [],
            answers=answers,
        )

    def get(self, path: str, **query: str) -> bytes:
        code, body = self.api.answer(path, query)
        assert code == 200 and isinstance(body, bytes), body
        return body

    def items(self, path: str, **query: str) -> dict[str, tuple[str, str]]:
        """name → (value, timestamp) of an answer."""
        doc = orjson.loads(self.get(path, **query))
        return {i["describedObject"]["name"]: (i["value"], i["timestamp"]) for i in doc["items"]}

    def refresh(self) -> None:
        self.clock.now += 15
        assert self.cache.refresh_due() >= 1
        deadline = time.monotonic() + 5
        while any(s.running for s in self.cache._slots.values()) and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self) -> None:
        self.pods.close()
        self.cache.stop()


@pytest.fixture
def world() -> Iterator[World]:
    w = World()
    yield w
    w.close()


def test_a_stored_answer_is_served_until_a_refresh_brings_new_values(world: World) -> None:
    first = world.get(UTIL, labelSelector="app=llm")
    assert world.get(UTIL, labelSelector="app=llm") is first  # the stored bytes, not a re-encoding
    assert world.api.answers.hits == 1
    assert world.items(UTIL, labelSelector="app=llm") == {
        "llm-0": ("90", rfc3339(T0)),
        "llm-1": ("80", rfc3339(T0)),
    }
    world.prom.set({"llm-0": 55, "llm-1": 65, "emb-0": 30}, T0 + 15)
    assert world.get(UTIL, labelSelector="app=llm") is first  # not refreshed yet: the same answer
    world.refresh()
    after = world.items(UTIL, labelSelector="app=llm")
    # the new values, each stamped with its sample's time (not the refresh's or the request's)
    assert after == {"llm-0": ("55", rfc3339(T0 + 15)), "llm-1": ("65", rfc3339(T0 + 15))}
    assert world.prom.queries == 2  # one first ask, one refresh: requests did not query


def test_an_answer_follows_pod_label_changes(world: World) -> None:
    assert set(world.items(UTIL, labelSelector="app=llm")) == {"llm-0", "llm-1"}
    assert world.watch.on_event is not None
    world.watch.on_event("MODIFIED", PodWatch.record("llm-1", "embedder"))  # relabelled
    assert set(world.items(UTIL, labelSelector="app=llm")) == {"llm-0"}
    assert set(world.items(UTIL, labelSelector="app=embedder")) == {"emb-0", "llm-1"}
    world.watch.on_event("MODIFIED", PodWatch.record("emb-0", "llm"))
    assert set(world.items(UTIL, labelSelector="app=llm")) == {"llm-0", "emb-0"}
    world.watch.on_event("DELETED", PodWatch.record("llm-0", "llm"))
    assert set(world.items(UTIL, labelSelector="app=llm")) == {"emb-0"}
    assert world.prom.queries == 1  # pod changes re-match pods; values stay from the one evaluation


def test_different_requests_do_not_share_entries(world: World) -> None:
    llm = world.get(UTIL, labelSelector="app=llm")
    emb = world.get(UTIL, labelSelector="app=embedder")
    llm_set = world.get(UTIL, labelSelector="app in (llm)")  # the same pods, another selector
    assert set(world.items(UTIL, labelSelector="app=embedder")) == {"emb-0"}
    assert llm != emb and world.get(UTIL, labelSelector="app=llm") is llm
    assert orjson.loads(llm_set)["items"] == orjson.loads(llm)["items"]
    # API versions encode differently; a metricLabelSelector is echoed in each item
    v1 = orjson.loads(world.get(f"{V1}/namespaces/{NS}/pods/*/DCGM_FI_DEV_GPU_UTIL", labelSelector="app=llm"))
    assert v1["apiVersion"].endswith("v1beta1") and "metricName" in v1["items"][0]
    msel = orjson.loads(world.get(UTIL, labelSelector="app=llm", metricLabelSelector="gpu=0"))
    assert msel["items"][0]["metric"]["selector"] == {"matchLabels": {"gpu": "0"}}
    assert orjson.loads(llm)["items"][0]["metric"]["selector"] is None
    # a named pod and all pods are their own answers
    assert set(world.items(f"{V2}/namespaces/{NS}/pods/emb-0/DCGM_FI_DEV_GPU_UTIL")) == {"emb-0"}
    assert set(world.items(UTIL)) == {"llm-0", "llm-1", "emb-0"}
    assert len(world.api.answers) == 7


def test_metrics_sharing_one_query_keep_their_own_names() -> None:
    """Two names for one series render the same query, so they share an evaluation (and its item
    memo): each answer must still name its own metric."""
    config = parse_config(
        {
            "metrics": [
                {"name": "util_a", "series": "DCGM_FI_DEV_GPU_UTIL"},
                {"name": "util_b", "series": "DCGM_FI_DEV_GPU_UTIL"},
            ]
        },
        source="test",
    )
    w = World(config=config)
    try:
        for metric in ("util_a", "util_b", "util_a"):
            doc = orjson.loads(w.get(f"{V2}/namespaces/{NS}/pods/*/{metric}", labelSelector="app=llm"))
            assert {i["metric"]["name"] for i in doc["items"]} == {metric}
        assert w.prom.queries == 1
    finally:
        w.close()


def test_the_store_is_bounded_by_entries_and_bytes() -> None:
    store = AnswerCache(max_entries=3, max_bytes=1000)
    pods: list[object] = []
    for i in range(5):
        store.put(i, b"x" * 100, generation=1, pods=pods)
    assert len(store) == 3 and store.get(0, generation=1, pods=pods) is None
    assert store.get(4, generation=1, pods=pods) == b"x" * 100
    store.put("big", b"y" * 700, generation=1, pods=pods)  # a fourth entry: the oldest (2) goes
    assert [k for k in (2, 3, 4, "big") if store.get(k, generation=1, pods=pods)] == [3, 4, "big"]
    store.put("big2", b"w" * 700, generation=1, pods=pods)  # 1,600 bytes: out until it fits
    assert list(store._data) == ["big2"] and store.bytes == 700
    store.put("huge", b"z" * 1001, generation=1, pods=pods)  # over the whole budget: not kept
    assert store.get("huge", generation=1, pods=pods) is None
    selected = [object()] * 5  # kept pod lists count too
    store.put("sel", b"s", generation=1, pods=selected)
    assert store.bytes <= 1000 and store.get("sel", generation=1, pods=selected) == b"s"
    assert store.get("sel", generation=1, pods=list(selected)) is None  # another selection
    assert store.get("sel", generation=2, pods=selected) is None  # another evaluation
    assert store.bytes == sum(len(e[2]) + POD_BYTES * len(cast("Sized", e[1])) for e in store._data.values())


def test_many_selectors_stay_within_the_bound_and_answer_correctly() -> None:
    w = World(answers=AnswerCache(max_entries=4, max_bytes=1 << 20))
    try:
        for i in range(20):
            assert set(w.items(UTIL, labelSelector=f"app=llm,idx!=n{i}")) == {"llm-0", "llm-1"}
        assert len(w.api.answers) == 4
    finally:
        w.close()


def test_only_answers_from_memory_are_given_on_the_event_loop(world: World) -> None:
    app = App(
        api=world.api,
        authenticator=Authenticator(requestheader=None, allow_anonymous=True),
        authorizer=Authorizer(mode="none", kube=None),
        metrics=SelfMetrics(),
        always_allow_paths=frozenset(),
    )
    query = {"labelSelector": "app=llm"}
    assert app.handle_inline(UTIL, query, {}, None) is None  # first ask: a Prometheus query
    assert world.prom.queries == 0 and len(world.cache) == 0  # …not even started on the loop
    worker = app.handle(UTIL, query, {}, None)
    assert worker.status == 200 and world.prom.queries == 1
    inline = app.handle_inline(UTIL, query, {}, None)
    assert inline is not None and inline.body is worker.body
    world.refresh()
    assert app.handle_inline(UTIL, query, {}, None) is None  # new values: encoding is a worker's
    assert app.handle(UTIL, query, {}, None).status == 200
    assert app.handle_inline(UTIL, query, {}, None) is not None
    # errors that need nothing from the network are answered on the loop too
    missing = app.handle_inline(f"{V2}/namespaces/{NS}/pods/*/no_such_metric", {}, {}, None)
    assert missing is not None and missing.status == 404
    assert nowait.active() is False


def test_answers_on_the_loop_still_check_credentials(world: World) -> None:
    app = App(
        api=world.api,
        authenticator=Authenticator(requestheader=None, allow_anonymous=False),
        authorizer=Authorizer(mode="none", kube=None),
        metrics=SelfMetrics(),
        always_allow_paths=frozenset(),
    )
    world.get(UTIL, labelSelector="app=llm")  # encoded and stored
    refused = app.handle_inline(UTIL, {"labelSelector": "app=llm"}, {"X-Remote-User": ["hpa"]}, None)
    assert refused is not None and refused.status == 401
