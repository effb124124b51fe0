"""The demo's fleet view counts "allocated but idle" with the recording rule the report's trend
counts (gpupilot:device_idle:bool), so the two give one number."""

from __future__ import annotations

import time

import pytest

from devkit.demo import fleet, promql

pytestmark = pytest.mark.prometheus


def test_fleet_view_idle_count_is_the_rules(prometheus_history) -> None:
    url = prometheus_history.url
    # the level-2 rule is evaluated live after level 1 exists: wait for it (a fresh fixture has none),
    # then compare at one moment (both move when a slice crosses the idle threshold, so read twice)
    deadline = time.monotonic() + 90
    while True:
        gpus, _, _ = fleet.collect(url)
        devices = [d for g in gpus for d in g.devices]
        idle = sum(1 for d in devices if d.state == "idle")
        # the instant the report's trend ends on: sum of gpupilot:node_slices:idle
        answer = promql.query(url, "sum(gpupilot:node_slices:idle)")
        if (answer and idle == int(answer[0].value)) or time.monotonic() > deadline:
            break
        time.sleep(2)
    (total,) = answer
    assert idle == int(total.value) > 0
    assert all(d.idle_rule is not None for d in devices if d.pods)  # the rule's answer, not a re-derivation
