"""``plan --window 1d`` looks past its window (real Prometheus, tests/support/rightsizer/weekly_history.py):
a slice busy at the same hour every week is kept with a note saying when it was last busy, a slice
busy once long ago shrinks with a note, ``--ignore-history`` shrinks both, and a 7-day window reads
nothing more."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.prometheus import PrometheusServer, backfill_openmetrics
from rightsizer import cli
from rightsizer.analysis import lookback
from tests.support.rightsizer import weekly_history

pytestmark = pytest.mark.prometheus


@pytest.fixture(scope="module")
def weekly_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    base = tmp_path_factory.mktemp("weekly")
    now = time.time()
    end = now - now % 3600 - 3600
    weekly_history.write(base / "history.om", end=end)
    backfill_openmetrics(base / "history.om", base / "data", block_duration="96h")
    with PrometheusServer(base / "data", log_file=base / "prometheus.log") as server:
        yield server.url, end


def run_plan(
    url: str, end: float, out: Path, *extra: str, capsys: pytest.CaptureFixture[str]
) -> tuple[dict[str, Any], str]:
    code = cli.main(["plan", "--prometheus-url", url, "--at", str(end), "--out", str(out), "--quiet", *extra])
    text = capsys.readouterr().out
    assert code == 0, text
    return json.loads(out.read_text()), text


def after(node: dict[str, Any], pod: str) -> str:
    """The profile ``pod`` holds after the plan: its target when disrupted, else its own."""
    for p in node["pods_disrupted"]:
        if p["name"] == pod:
            return str(p["targets"][0]["profile"])
    return str(next(p for p in node["pods_kept"] if p["name"] == pod)["devices"][0]["profile"])


def test_weekly_burst_beyond_a_short_window_is_kept(
    weekly_prometheus: tuple[str, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, end = weekly_prometheus
    plan, text = run_plan(url, end, tmp_path / "plan.json", "--window", "1d", capsys=capsys)
    (node,) = plan["nodes"]
    assert after(node, "monday") == "3g.40gb"
    assert after(node, "once") == "1g.10gb"
    last_monday = time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(end - 3 * 86400 + 2 * 3600))
    notes = "\n".join(plan["notes"])
    assert (
        f"weekly GPU 0 3g.40gb (ml/monday): kept; last busy beyond the 1d window in the hour from {last_monday}"
        in notes
    )
    assert "same hour every week" in notes
    once = time.strftime("%Y-%m-%dT%H:00:00Z", time.gmtime(end - 10 * 86400 + 3600))
    assert f"(ml/once): shrinks to 1g.10gb; last busy beyond the 1d window in the hour from {once}" in notes
    assert "not a weekly pattern" in notes
    assert "busy hours found back to" in notes and plan["settings"]["lookback_s"] == 28 * 86400
    assert "kept; last busy" in text  # the table's notes say it too


def test_ignore_history_shrinks_the_weekly_slice(
    weekly_prometheus: tuple[str, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, end = weekly_prometheus
    plan, _ = run_plan(url, end, tmp_path / "plan.json", "--window", "1d", "--ignore-history", capsys=capsys)
    (node,) = plan["nodes"]
    assert after(node, "monday") == "1g.10gb"
    assert any("(ml/monday): shrinks to 1g.10gb though last busy" in n for n in plan["notes"])


def test_a_week_long_window_reads_no_more(
    weekly_prometheus: tuple[str, float], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, end = weekly_prometheus
    plan, _ = run_plan(url, end, tmp_path / "plan.json", "--window", "7d", capsys=capsys)
    assert "lookback_s" not in plan["settings"]
    assert not any("beyond the" in n for n in plan["notes"])


def test_weekly_recurrence_rule() -> None:
    h = 3600.0
    monday = [1000 * h, 1001 * h, 1168 * h]  # the same hour a week apart
    assert lookback.recurs_weekly(monday)
    assert not lookback.recurs_weekly([1000 * h, 1001 * h, 1100 * h])
    assert lookback.busy_beyond([(1.0, 0.5), (2.0, 2.4), (3.0, 3.0)], above=2) == (2.0, 3.0)
