"""Values from memory: the refreshing cache on its own (first ask, shared first evaluation, refresh,
failure within and past --max-value-age, idle drop) and in the server, where Prometheus load stays
flat whatever the request rate and the served value follows the live one within an interval."""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import Gauge

from adapter.config.settings import ServeSettings
from adapter.errors import PrometheusUnavailable, UpstreamUnavailable
from adapter.provider.refresh import RefreshingCache
from adapter.serving.app import Adapter
from tests.adapter.conftest import Client, PromEnv, base_settings
from tests.support.adapter.pki import Pki
from tests.support.clocks import ManualClock

V2 = "/apis/custom.metrics.k8s.io/v1beta2"
LLM = {"labelSelector": "app=llm-inference"}


def cache(clock: ManualClock, *, max_age: float = 60.0) -> RefreshingCache[int]:
    return RefreshingCache(interval=10.0, idle_drop=100.0, max_age=max_age, clock=clock)


def drain(c: RefreshingCache[int]) -> None:
    deadline = time.monotonic() + 5
    while any(s.running for s in c._slots.values()) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_first_ask_evaluates_then_refreshes_once_per_interval() -> None:
    clock, calls = ManualClock(), []

    def load() -> int:
        calls.append(clock.now)
        return len(calls)

    c = cache(clock)
    assert c.get("k", load, wait=1).value == 1
    for _ in range(100):
        assert c.get("k", load, wait=1).value == 1  # requests never evaluate again
    assert c.refresh_due() == 0  # not due yet
    clock.now += 10
    assert c.refresh_due() == 1
    drain(c)
    assert c.get("k", load, wait=1).value == 2
    assert len(calls) == 2


def test_concurrent_first_asks_share_one_evaluation() -> None:
    clock, calls = ManualClock(), []
    gate = threading.Event()

    def load() -> int:
        calls.append(1)
        gate.wait(5)
        return 7

    c = cache(clock)
    results: list[int] = []
    threads = [
        threading.Thread(target=lambda: results.append(c.get("k", load, wait=5).value)) for _ in range(8)
    ]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join()
    assert results == [7] * 8
    assert calls == [1]


def test_failed_refresh_serves_the_last_value_until_max_age_then_the_error() -> None:
    clock = ManualClock()
    state = {"fail": False}

    def load() -> int:
        if state["fail"]:
            raise PrometheusUnavailable("Prometheus at http://x unreachable: Connection refused")
        return 5

    c = cache(clock, max_age=30.0)
    assert c.get("k", load, wait=1).value == 5
    state["fail"] = True
    clock.now += 10
    c.refresh_due()
    drain(c)
    assert c.get("k", load, wait=1).value == 5  # 10 s old: still served
    clock.now += 5
    assert c.refresh_due() == 0  # a failed refresh is retried one interval later, not every tick
    clock.now += 25
    with pytest.raises(PrometheusUnavailable, match=r"Connection refused \(the last good value is 40s old\)"):
        c.get("k", load, wait=1)


def test_a_refresh_that_hangs_past_max_age_says_so() -> None:
    """A refresh still running when the value passes --max-value-age: the error names the refresh
    and the age, not a first evaluation."""
    clock, gate = ManualClock(), threading.Event()
    state = {"hang": False}

    def load() -> int:
        if state["hang"]:
            gate.wait(5)
        return 5

    c = cache(clock, max_age=30.0)
    assert c.get("k", load, wait=1).value == 5
    state["hang"] = True
    clock.now += 10
    assert c.refresh_due() == 1  # starts, and hangs
    clock.now += 25
    try:
        with pytest.raises(UpstreamUnavailable) as err:
            c.get("k", load, wait=0.05)
        assert str(err.value) == (
            "refresh running longer than --max-value-age (30s): the last good value is 35s old and "
            "not served; Prometheus answers slowly"
        )
    finally:
        gate.set()
        drain(c)


def test_keys_nobody_asks_for_are_dropped() -> None:
    clock = ManualClock()
    c = cache(clock)
    c.get("a", lambda: 1, wait=1)
    c.get("b", lambda: 2, wait=1)
    clock.now += 60
    c.get("b", lambda: 2, wait=1)
    clock.now += 60
    c.refresh_due()
    drain(c)
    assert set(c._slots) == {"b"}


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_intervals_must_be_finite_and_positive(bad: float) -> None:
    with pytest.raises(ValueError, match="must be a finite number of seconds > 0"):
        RefreshingCache(interval=bad, idle_drop=10, max_age=0)


def value_queries(client: Client) -> float:
    text = client.as_hpa("/metrics").text
    match = re.search(
        r'gpupilot_adapter_prometheus_query_duration_seconds_count\{purpose="value"\} (\S+)', text
    )
    return float(match.group(1)) if match else 0.0


@pytest.mark.slow
def test_prometheus_load_does_not_follow_the_request_rate(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> None:
    adapter = start_adapter(base_settings(prom.url, pki, refresh_interval=60.0))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    path = f"{V2}/namespaces/ai-serving/pods/*/DCGM_FI_DEV_GPU_UTIL"
    for _ in range(30):
        assert len(client.as_hpa(path, LLM).json()["items"]) == 3
    for name in ("llm-inference-7d9f-a", "embedder-0"):  # a named pod reads the same namespace index
        assert (
            client.as_hpa(f"{V2}/namespaces/ai-serving/pods/{name}/DCGM_FI_DEV_GPU_UTIL").status_code == 200
        )
    assert value_queries(client) == 1
    client.as_hpa(f"{V2}/namespaces/research/pods/*/gpu_utilization")
    assert value_queries(client) == 2  # another namespace is another query


@pytest.mark.slow
def test_served_values_follow_the_live_series_within_an_interval(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> None:
    gauge = Gauge(
        "gpu_refresh_probe", "changes during the test", ["namespace", "pod"], registry=prom.live.registry
    )
    gauge.labels("ai-serving", "embedder-0").set(1)
    cfg = tmp_path / "adapter.yaml"
    cfg.write_text("metrics:\n  - name: gpu_refresh_probe\n")
    adapter = start_adapter(base_settings(prom.url, pki, refresh_interval=0.5, config_path=cfg))
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    path = f"{V2}/namespaces/ai-serving/pods/embedder-0/gpu_refresh_probe"

    def served() -> str:
        r = client.as_hpa(path)
        return r.json()["items"][0]["value"] if r.status_code == 200 else f"HTTP {r.status_code}"

    def wait_for(value: str, timeout: float) -> float:
        started = time.monotonic()
        while served() != value and time.monotonic() - started < timeout:
            time.sleep(0.1)
        assert served() == value
        return time.monotonic() - started

    try:
        wait_for("1", 15)
        first = client.as_hpa(path).json()["items"][0]["timestamp"]
        gauge.labels("ai-serving", "embedder-0").set(2)
        assert wait_for("2", 10) < 4  # 1 s scrape + 0.5 s refresh, with room for a busy machine
        assert client.as_hpa(path).json()["items"][0]["timestamp"] >= first
    finally:
        prom.live.registry.unregister(gauge)


def test_the_default_refresh_interval_is_prometheus_scrape_interval(
    prom: PromEnv, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter]
) -> None:
    adapter = start_adapter(base_settings(prom.url, pki))  # the test Prometheus scrapes every 1s
    client = Client(f"https://127.0.0.1:{adapter.port}", pki)
    assert adapter.cache.interval == 1.0
    assert "gpupilot_adapter_refresh_interval_seconds 1.0" in client.as_hpa("/metrics").text


def test_past_max_keys_a_new_query_is_answered_but_not_kept() -> None:
    clock, calls = ManualClock(), list[str]()
    c: RefreshingCache[int] = RefreshingCache(interval=10, idle_drop=100, max_age=60, max_keys=2, clock=clock)

    def load(key: str) -> int:
        calls.append(key)
        return len(calls)

    for key in ("a", "b", "c", "c"):
        assert c.get(key, functools.partial(load, key), wait=1).value == len(calls)
    assert set(c._slots) == {"a", "b"}
    assert calls == ["a", "b", "c", "c"]  # "c" is evaluated per request, never refreshed


def test_the_refresher_thread_survives_an_exception_nobody_foresaw(caplog: pytest.LogCaptureFixture) -> None:
    """refresh_due raising (here a ZeroDivisionError): one line, counted, and the thread goes on
    starting the refreshes that are due."""
    failures: list[BaseException] = []
    cache: RefreshingCache[int] = RefreshingCache(
        interval=0.05, idle_drop=60, max_age=60, on_failure=failures.append
    )
    real, ticks = cache.refresh_due, {"n": 0}
    ran = threading.Event()

    def flaky() -> int:
        ticks["n"] += 1
        if ticks["n"] == 1:
            raise ZeroDivisionError("a clock that went backwards")
        ran.set()
        return real()

    cache.refresh_due = flaky  # type: ignore[method-assign]
    cache.start()
    try:
        assert ran.wait(5.0)
    finally:
        cache.stop()
    assert [type(f) for f in failures] == [ZeroDivisionError]
    (line,) = [r.getMessage() for r in caplog.records if "ZeroDivisionError" in r.getMessage()]
    assert line.startswith("refresher: ZeroDivisionError") and "\n" not in line
