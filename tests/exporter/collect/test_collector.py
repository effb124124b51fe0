"""The collection loop against a scripted fake backend: every fault of the issue, and what scrapes then see."""

from __future__ import annotations

import threading
import time
from types import MappingProxyType

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.collect.collector import AllocationsSource, Collector
from exporter.errors import BackendError, BackendUnavailable
from exporter.settings import CollectorSettings
from exporter.snapshot import Allocations, GpuSnapshot, NodeSnapshot, PodRef
from tests.support.clocks import ManualClock
from tests.support.exporter import fakes


def make(
    backend: fakes.FakeBackend,
    *,
    clock: ManualClock | None = None,
    allocations: AllocationsSource | None = None,
    timeout: float = 1.0,
) -> Collector:
    settings = CollectorSettings(interval=10.0, collect_timeout=timeout, backoff_initial=1.0, backoff_max=8.0)
    return Collector(
        backend, hostname="node-a", settings=settings, allocations=allocations, clock=clock or ManualClock()
    )


def scrape(c: Collector, now: float | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = c.page.body(openmetrics=False, gzip=False, now=time.monotonic() if now is None else now).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name.removesuffix("_total"), []).append((s.labels, s.value))
    return out


def value(series: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    hits = [v for lb, v in series.get(name, []) if all(lb.get(k) == w for k, w in labels.items())]
    assert len(hits) == 1, f"{name}{labels}: {len(hits)} samples"
    return hits[0]


def test_success_serves_snapshot_and_self_metrics() -> None:
    clock = ManualClock()
    c = make(fakes.FakeBackend(fakes.node(fakes.whole_gpu(0))), clock=clock)
    assert c.collect_once()
    clock.now += 4
    s = scrape(c, now=clock.now)
    assert value(s, "DCGM_FI_DEV_GPU_TEMP", gpu="0") == 41.0
    assert value(s, "gpupilot_exporter_backend_up") == 1.0
    assert value(s, "gpupilot_exporter_snapshot_age_seconds") == pytest.approx(4.0)
    assert value(s, "gpupilot_exporter_collection_errors", kind="timeout") == 0.0
    assert "gpupilot_exporter_collection_duration_seconds" in s
    assert "gpupilot_exporter_last_success_timestamp_seconds" in s
    text = c.page.text.decode()
    assert "Cached" in text.split("# HELP DCGM_FI_DEV_GPU_TEMP")[1].splitlines()[0]
    assert c.readiness()[0]


def test_init_failure_backs_off_exponentially_then_recovers() -> None:
    clock = ManualClock()
    backend = fakes.FakeBackend(fakes.node(fakes.whole_gpu(0)), open_failures=3)
    c = make(backend, clock=clock)
    assert not c.collect_once()
    s = scrape(c, now=clock.now)
    assert value(s, "gpupilot_exporter_backend_up") == 0.0
    assert value(s, "gpupilot_exporter_collection_errors", kind="init") == 1.0
    assert "DCGM_FI_DEV_GPU_TEMP" not in s
    assert "gpupilot_exporter_snapshot_age_seconds" not in s
    assert "libnvidia-ml" in c.last_error
    ready, why = c.readiness()
    assert not ready and "no successful collection" in why
    # retries only when due, with doubling delays: failed at 1000, 1001, 1003; succeeds at 1007
    attempts = []
    for step in range(1, 29):
        clock.now = 1000.0 + step * 0.25
        before = backend.open_calls
        c.collect_once()
        if backend.open_calls > before:
            attempts.append(clock.now)
    assert attempts == [1001.0, 1003.0, 1007.0]
    assert backend.read_calls == 1
    assert value(scrape(c, now=clock.now), "gpupilot_exporter_backend_up") == 1.0
    assert value(scrape(c, now=clock.now), "gpupilot_exporter_collection_errors", kind="init") == 3.0


def test_backoff_is_capped() -> None:
    clock = ManualClock()
    backend = fakes.FakeBackend(fakes.node(), open_failures=100)
    c = make(backend, clock=clock)
    for _ in range(200):
        c.collect_once()
        clock.now += 0.5
    # 1+2+4+8+8+… over 100 s: capped at 8 s, so about a dozen attempts, not 7 (uncapped) or 200
    assert 11 <= backend.open_calls <= 16


def test_hung_read_times_out_keeps_last_snapshot_with_growing_age_without_piling_threads() -> None:
    backend = fakes.FakeBackend(fakes.node(fakes.whole_gpu(0)))
    c = make(backend, timeout=0.2, clock=time.monotonic)  # type: ignore[arg-type]
    assert c.collect_once()
    first_at = c.page.snapshot_at
    backend.hang = threading.Event()
    threads_before = set(threading.enumerate())  # threads of earlier tests may end meanwhile
    started = time.monotonic()
    assert not c.collect_once()
    assert time.monotonic() - started < 1.0
    assert not c.collect_once()  # still hung: refused at once, no second thread
    assert backend.read_calls == 2
    assert set(threading.enumerate()) - threads_before == set()
    s = scrape(c, now=time.monotonic() + 5)
    assert value(s, "DCGM_FI_DEV_GPU_TEMP", gpu="0") == 41.0  # last good snapshot still served
    assert value(s, "gpupilot_exporter_collection_errors", kind="timeout") == 2.0
    assert value(s, "gpupilot_exporter_backend_up") == 0.0
    assert value(s, "gpupilot_exporter_snapshot_age_seconds") >= 5.0
    assert c.page.snapshot_at == first_at
    backend.hang.set()  # the call returns; the next collection works again
    backend.hang = None
    for _ in range(50):
        if c.collect_once():
            break
        time.sleep(0.02)
    assert c.page.snapshot_at != first_at
    c.stop()


def test_ready_turns_false_after_three_intervals() -> None:
    clock = ManualClock()
    backend = fakes.FakeBackend(fakes.node(fakes.whole_gpu(0)))
    c = make(backend, clock=clock)
    c.collect_once()
    backend.read_error = BackendError("NVML_ERROR_UNKNOWN")
    clock.now += 29
    assert not c.collect_once()
    assert c.readiness()[0]
    clock.now += 2
    ready, why = c.readiness()
    assert not ready
    assert "31.0s old" in why and "NVML_ERROR_UNKNOWN" in why


def test_field_errors_are_counted_by_kind_and_only_that_series_is_missing() -> None:
    gpu = fakes.whole_gpu(0)
    values = {k: v for k, v in gpu.values.items() if k != "DCGM_FI_DEV_POWER_USAGE"}
    snap = NodeSnapshot(
        taken_at=1.0,
        gpus=(GpuSnapshot(info=gpu.info, values=MappingProxyType(values)),),
        field_errors=MappingProxyType({"field:DCGM_FI_DEV_POWER_USAGE": 1}),
    )
    c = make(fakes.FakeBackend(snap))
    assert c.collect_once()
    assert c.collect_once()
    s = scrape(c)
    assert "DCGM_FI_DEV_POWER_USAGE" not in s
    assert value(s, "DCGM_FI_DEV_GPU_TEMP", gpu="0") == 41.0
    assert value(s, "gpupilot_exporter_collection_errors", kind="field:DCGM_FI_DEV_POWER_USAGE") == 2.0
    assert value(s, "gpupilot_exporter_backend_up") == 1.0


def test_gpu_lost_drops_its_series_others_keep_flowing() -> None:
    before = fakes.node(fakes.whole_gpu(0), fakes.whole_gpu(1))
    after = fakes.node(fakes.whole_gpu(0), lost=(fakes.lost(1),))
    c = make(fakes.FakeBackend(before, after))
    c.collect_once()
    assert {lb["gpu"] for lb, _ in scrape(c)["DCGM_FI_DEV_GPU_TEMP"]} == {"0", "1"}
    c.collect_once()
    s = scrape(c)
    assert {lb["gpu"] for lb, _ in s["DCGM_FI_DEV_GPU_TEMP"]} == {"0"}
    assert value(s, "gpupilot_gpu_lost", gpu="1") == 1.0


def test_mig_reconfigured_between_collections() -> None:
    seven = fakes.node(fakes.mig_gpu(0, 7, profile="1g.10gb"))
    two = fakes.node(fakes.mig_gpu(0, 2, profile="3g.40gb"))
    c = make(fakes.FakeBackend(seven, two))
    c.collect_once()
    assert len(scrape(c)["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]) == 7
    c.collect_once()
    s = scrape(c)
    active = s["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    assert len(active) == 2
    assert {lb["GPU_I_PROFILE"] for lb, _ in active} == {"3g.40gb"}


def test_read_error_keeps_last_snapshot_and_counts() -> None:
    backend = fakes.FakeBackend(fakes.node(fakes.whole_gpu(0)))
    c = make(backend)
    c.collect_once()
    backend.read_error = BackendError("NVML_ERROR_UNKNOWN")
    assert not c.collect_once()
    s = scrape(c)
    assert value(s, "gpupilot_exporter_collection_errors", kind="read") == 1.0
    assert value(s, "DCGM_FI_DEV_GPU_TEMP", gpu="0") == 41.0


def test_backend_unavailable_during_read_reopens() -> None:
    clock = ManualClock()
    backend = fakes.FakeBackend(fakes.node(fakes.whole_gpu(0)))
    c = make(backend, clock=clock)
    c.collect_once()
    backend.read_error = BackendUnavailable("NVML_ERROR_DRIVER_NOT_LOADED")
    assert not c.collect_once()
    assert backend.close_calls == 1
    backend.read_error = None
    clock.now += 1.0
    assert c.collect_once()
    assert backend.open_calls == 2


class FlakyKubelet:
    def __init__(self, pod: PodRef, device: str) -> None:
        self.pod, self.device, self.fail = pod, device, False

    def __call__(self) -> Allocations:
        if self.fail:
            raise OSError("/var/lib/kubelet/pod-resources/kubelet.sock: not found")
        return {self.device: (self.pod,)}


def test_allocations_source_failing_gives_series_without_pod_labels(caplog: pytest.LogCaptureFixture) -> None:
    snap = fakes.node(fakes.whole_gpu(0))
    kubelet = FlakyKubelet(PodRef("ai-serving", "llm-0", "server"), fakes.gpu_info(0).uuid)
    c = make(fakes.FakeBackend(snap), allocations=kubelet)
    c.collect_once()
    assert value(scrape(c), "DCGM_FI_DEV_GPU_TEMP", gpu="0", pod="llm-0") == 41.0
    kubelet.fail = True
    with caplog.at_level("WARNING"):
        assert c.collect_once()
        assert c.collect_once()
    s = scrape(c)
    assert [lb.get("pod") for lb, _ in s["DCGM_FI_DEV_GPU_TEMP"]] == [None]
    assert value(s, "gpupilot_exporter_collection_errors", kind="podresources") == 2.0
    assert value(s, "gpupilot_exporter_backend_up") == 1.0
    warnings = [r for r in caplog.records if "pod attribution unavailable" in r.getMessage()]
    assert len(warnings) == 1  # logged once, not every interval
    kubelet.fail = False
    c.collect_once()
    assert value(scrape(c), "DCGM_FI_DEV_GPU_TEMP", gpu="0", pod="llm-0") == 41.0


def test_finished_pod_labels_disappear_on_the_next_collection() -> None:
    snap = fakes.node(fakes.whole_gpu(0))
    held = {fakes.gpu_info(0).uuid: (PodRef("a", "done-pod", "c"),)}
    answers = [held, {}]
    c = make(fakes.FakeBackend(snap), allocations=lambda: answers.pop(0))
    c.collect_once()
    assert "gpupilot_device_pod_info" in scrape(c)
    c.collect_once()
    s = scrape(c)
    assert "gpupilot_device_pod_info" not in s
    assert [lb.get("pod") for lb, _ in s["DCGM_FI_DEV_GPU_TEMP"]] == [None]


@pytest.mark.slow
def test_background_loop_collects_every_interval_and_stops() -> None:
    backend = fakes.FakeBackend(fakes.node(fakes.whole_gpu(0)))
    settings = CollectorSettings(interval=0.05, collect_timeout=0.05)
    c = Collector(backend, hostname="n", settings=settings)
    c.start()
    time.sleep(0.4)
    c.stop()
    calls = backend.read_calls
    assert 4 <= calls <= 10
    time.sleep(0.15)
    assert backend.read_calls == calls
    assert backend.close_calls == 1


def test_hung_open_counts_a_timeout_and_retries_later() -> None:
    clock = ManualClock()
    backend = fakes.FakeBackend(fakes.node(fakes.whole_gpu(0)))
    backend.open_hang = threading.Event()
    c = make(backend, clock=clock, timeout=0.1)
    assert not c.collect_once()
    assert c.errors["timeout"] == 1 and c.errors["init"] == 0
    backend.open_hang.set()
    backend.open_hang = None
    for _ in range(100):  # the abandoned open() returns on the worker
        if not c._worker.busy:
            break
        time.sleep(0.01)
    clock.now += 1.0  # the first retry is due after backoff_initial
    assert c.collect_once()
    assert c.snapshot is not None
    c.stop()


class BuggyBackend(fakes.FakeBackend):
    def read(self) -> NodeSnapshot:
        raise KeyError("a bug in a backend")


def test_a_backend_bug_is_a_read_error_not_a_dead_loop(caplog: pytest.LogCaptureFixture) -> None:
    c = make(BuggyBackend(fakes.node()))
    with caplog.at_level("ERROR"):
        assert not c.collect_once()
    assert c.errors["read"] == 1
    assert "KeyError" in c.last_error
    assert value(scrape(c), "gpupilot_exporter_backend_up") == 0.0


def test_a_slow_collection_is_one_warning_per_slow_spell(caplog: pytest.LogCaptureFixture) -> None:
    clock = ManualClock()
    took = [6.0]  # of a 10 s interval

    class Slow(fakes.FakeBackend):
        def read(self) -> NodeSnapshot:
            clock.advance(took[0])
            return super().read()

    c = make(Slow(fakes.node(fakes.whole_gpu(0))), clock=clock)
    try:
        with caplog.at_level("INFO", logger="exporter.collect.collector"):
            assert c.collect_once() and c.collect_once()
            took[0] = 1.0
            assert c.collect_once()
    finally:
        c.stop()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert lines == [
        (
            "WARNING",
            "collection took 6.00s of its 10s interval (1 GPUs, 0 device holders); "
            "gpupilot_exporter_collection_duration_seconds has each one's time",
        ),
        ("INFO", "collection back under 50% of its interval (1.00s)"),
    ]


def test_the_collection_loop_survives_an_exception_nobody_foresaw(caplog):
    """A failure outside what collect_once handles (here a KeyError from inside it) is one line, a
    count in gpupilot_exporter_loop_failures_total{loop="collector"}, the last page kept; the loop
    carries on and collects again."""
    c = Collector(
        fakes.FakeBackend(NodeSnapshot(taken_at=1.0, gpus=(fakes.whole_gpu(0),))),
        hostname="n",
        settings=CollectorSettings(interval=0.05, backoff_initial=0.05),
    )
    assert c.collect_once()
    good = c.page
    real, calls, done = c.collect_once, {"n": 0}, threading.Event()

    def flaky() -> bool:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyError("a field nobody expected")
        done.set()
        return real()

    c.collect_once = flaky  # type: ignore[method-assign]
    c.start()
    try:
        assert done.wait(5.0)
        time.sleep(0.1)
    finally:
        c.stop()
    assert c.loop_failures.get("collector") == 1
    assert calls["n"] >= 2 and c.page is not good  # collected again after the failure
    assert b'gpupilot_exporter_loop_failures_total{loop="collector"} 1' in c.page.text
    lines = [r.getMessage() for r in caplog.records if "KeyError" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
