"""MIGSliceIdle24h's expression on a real VictoriaMetrics (the promtool tests cover Prometheus): a
slice whose recorded activity has a 23 h 40 min gap in its day does not match, one with a sample
every minute does. VictoriaMetrics' subqueries step and bound their windows in their own way; the
hourly-coverage clause must count 24 hours on it too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from devkit import victoriametrics as vmkit
from tests.rules.test_rules import ALERTS
from tests.support.promquery import instant

LABELS = 'Hostname="node-a",gpu="1",UUID="GPU-a1",GPU_I_PROFILE="1g.10gb",namespace="ns"'


def _exposition(end: float) -> bytes:
    """26 h of one-minute samples: pod_info for both slices, the recorded activity of 'watched'
    throughout and of 'gap' only in its first and last 20 minutes of the day."""
    lines = []
    start = end - 26 * 3600
    gap_from, gap_to = end - 24 * 3600 + 20 * 60, end - 20 * 60  # 23 h 20 min without a sample
    for t in range(int(start), int(end) + 1, 60):
        ms = t * 1000
        for slice_id, pod in (("12", "gap"), ("13", "watched")):
            labels = f'{LABELS},GPU_I_ID="{slice_id}",pod="{pod}"'
            lines.append(f"gpupilot_device_pod_info{{{labels}}} 1 {ms}")
            if pod == "watched" or not gap_from < t < gap_to:
                lines.append(f"gpupilot:slice_activity:avg5m{{{labels}}} 0.01 {ms}")
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.slow
def test_idle_alert_needs_every_hour_of_the_day_on_victoriametrics(tmp_path: Path) -> None:
    expr = next(a["expr"] for a in ALERTS if a["alert"] == "MIGSliceIdle24h")
    now = time.time()
    end = now - now % 3600 - 3600  # on the hour
    with vmkit.VictoriaMetricsServer(tmp_path / "data") as vm:
        vm.import_prometheus(_exposition(end))
        vm.force_flush()
        for at in (end - 30 * 60, end - 60, end):  # one off the hour, one before and one on it
            firing = {r["metric"]["pod"] for r in instant(vm.url, expr, at=at)}
            assert firing == {"watched"}, at
