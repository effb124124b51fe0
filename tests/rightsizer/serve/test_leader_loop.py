"""The leader election loop outlives any failure of a round: an exception nobody foresaw is one line
and a count in serve's gpupilot_rightsizer_loop_failures_total{loop="leader-election"}, and the next
round (at the usual period) takes the Lease."""

from __future__ import annotations

import logging
import time

import pytest
from prometheus_client import generate_latest

from gpupilot_common import loops
from rightsizer.clients.kube import Kube
from rightsizer.serve.leader import LeaderElector
from rightsizer.serve.scheduler import Service
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer.serve_support import FakeJobs, config


def test_a_round_that_raises_anything_is_counted_and_the_next_takes_the_lease(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    failures = loops.LoopFailures()
    with KubeDouble() as kube, caplog.at_level(logging.ERROR):
        elector = LeaderElector(
            Kube(kube.api_client()),
            "gpupilot",
            identity="replica-a",
            duration_s=1.0,
            on_failure=failures.counter("leader-election"),
        )
        real, rounds = elector.try_acquire_or_renew, {"n": 0}

        def odd() -> bool:
            rounds["n"] += 1
            if rounds["n"] == 1:
                raise AttributeError("'NoneType' object has no attribute 'get'")
            return real()

        elector.try_acquire_or_renew = odd  # type: ignore[method-assign]
        elector.start()
        try:
            deadline = time.monotonic() + 5
            while not elector.is_leader() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert elector.is_leader()
        finally:
            elector.stop()
    assert failures.get("leader-election") == 1
    (line,) = [r.getMessage() for r in caplog.records if "AttributeError" in r.getMessage()]
    assert line.startswith("leader election: AttributeError") and "\n" not in line
    service = Service(config(tmp_path), jobs=FakeJobs(), loop_failures=failures)
    text = generate_latest(service.registry()).decode()
    assert 'gpupilot_rightsizer_loop_failures_total{loop="leader-election"} 1.0' in text
    assert 'gpupilot_rightsizer_loop_failures_total{loop="apply-lease"} 0.0' in text
