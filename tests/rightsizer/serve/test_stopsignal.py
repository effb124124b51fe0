"""The emergency stop and drain requests: the annotations' meaning, read at most every few seconds,
an unreadable ConfigMap stopping nothing; serve skipping rounds while paused and resuming when the
annotation goes; an apply in progress told to stop at its next safe step (pause, drain, SIGTERM)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from rightsizer.serve.stopsignal import ANN_DRAIN, ANN_PAUSE, StopSignal, reason_of
from tests.support.rightsizer.serve_support import FakeJobs, config, start

WHERE = "ConfigMap gpupilot/gpupilot-rightsizer"
START = datetime(2026, 12, 5, 0, 0, tzinfo=UTC).timestamp()


@pytest.mark.parametrize(
    ("annotations", "stops"),
    [
        ({}, ""),
        ({ANN_PAUSE: "paused"}, "the emergency stop"),
        ({ANN_PAUSE: "Paused "}, "the emergency stop"),
        ({ANN_PAUSE: "running"}, ""),
        ({ANN_DRAIN: "2026-12-05T01:00:00Z"}, "a drain requested at 2026-12-05T01:00:00Z"),
        ({ANN_DRAIN: "2026-12-04T23:00:00Z"}, ""),  # asked before this serve started: the new pod
        ({ANN_DRAIN: "soon"}, ""),
    ],
)
def test_what_the_annotations_mean(annotations: dict[str, str], stops: str) -> None:
    reason = reason_of(annotations, started_at=START, where=WHERE)
    assert reason.startswith(stops) if stops else reason == ""


def test_read_at_most_every_ttl_and_an_unreadable_map_stops_nothing(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    answers: list[object] = [{ANN_PAUSE: "paused"}, RuntimeError("503 from the API"), {}]
    reads = []

    def read() -> dict[str, str] | None:
        reads.append(now[0])
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[return-value]

    signal = StopSignal(read, where=WHERE, started_at=START, ttl_s=5.0, monotonic=lambda: now[0])
    assert signal.reason().startswith("the emergency stop") and len(reads) == 1
    now[0] = 3.0
    assert signal.reason().startswith("the emergency stop") and len(reads) == 1  # cached
    now[0] = 6.0
    assert signal.reason().startswith("the emergency stop")  # unreadable: the last known answer
    assert "cannot read the auto-apply stop signal" in caplog.text and "503 from the API" in caplog.text
    now[0] = 12.0
    assert signal.reason() == "" and reads == [0.0, 6.0, 12.0]


def _auto_apply(tmp_path, **extra):
    return config(
        tmp_path,
        auto_apply={
            "enabled": True,
            "maintenance_window": {"days": ["sat", "sun"], "start": "00:00", "end": "23:59"},
            "min_gpus_freed": 0,
            **extra,
        },
    )


def test_a_paused_config_skips_every_round(tmp_path, scheduler_clock) -> None:
    jobs = FakeJobs()
    service, sched = start(_auto_apply(tmp_path, paused=True), jobs, scheduler_clock)
    scheduler_clock.now = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)  # a Saturday
    service.run_plan()
    assert service.run_auto_apply()
    assert not jobs.fired("apply")
    assert service.state.last_skip.startswith("paused by the emergency stop (auto_apply.paused")
    assert service.registry().get_sample_value("gpupilot_rightsizer_auto_apply_paused") == 1.0
    sched.shutdown()


def test_the_annotation_pauses_then_resumes_and_stops_a_run_at_its_next_step(
    tmp_path, scheduler_clock
) -> None:
    annotations: dict[str, str] = {ANN_PAUSE: "paused"}
    stops_seen: list[str] = []

    class Jobs(FakeJobs):
        def apply(self, plan, *, settings, nodes, stop):
            annotations[ANN_PAUSE] = "paused"  # someone pauses while the node is in flight
            signal._checked = -float("inf")  # the next safe step reads it again
            stops_seen.append(stop())
            return super().apply(plan, settings=settings, nodes=nodes, stop=stop)

    jobs = Jobs()
    service, sched = start(_auto_apply(tmp_path), jobs, scheduler_clock)
    signal = StopSignal(lambda: dict(annotations), where=WHERE, started_at=START, ttl_s=0.0)
    service.stop_signal = signal
    scheduler_clock.now = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
    service.run_plan()
    service.run_auto_apply()
    assert not jobs.fired("apply") and "emergency stop" in service.state.last_skip
    del annotations[ANN_PAUSE]  # resume
    service.run_auto_apply()
    assert jobs.fired("apply")
    assert stops_seen and stops_seen[0].startswith("the emergency stop")
    sched.shutdown()


def test_sigterm_stops_a_run_at_its_next_step(tmp_path, scheduler_clock) -> None:
    service, sched = start(_auto_apply(tmp_path), FakeJobs(), scheduler_clock)
    assert service._leading() == ""
    service.stopping.set()
    assert service._leading().startswith("the service stopping (SIGTERM")
    sched.shutdown()


def test_the_config_keys(tmp_path) -> None:
    cfg = _auto_apply(
        tmp_path, paused=True, stop_signal={"namespace": "gpupilot", "configmap": "gpupilot-rightsizer"}
    )
    assert cfg.auto_apply.paused and cfg.auto_apply.stop_signal is not None
    assert dataclasses.asdict(cfg.auto_apply.stop_signal) == {
        "namespace": "gpupilot",
        "configmap": "gpupilot-rightsizer",
    }
