"""serve's report retention: report.retention (count, max_age) parsed with one-line errors, old
dated report folders removed after each report, the one written and anything else left alone."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from rightsizer.serve.config import ServeConfigError
from rightsizer.serve.retention import Retention, doomed, prune
from tests.support.rightsizer.serve_support import FakeJobs, config, start, tick

BERLIN_MONDAY_NOON = datetime(2026, 11, 30, 11, 0, tzinfo=UTC)


def folders(base: Path, *days: str) -> None:
    for day in days:
        (base / day).mkdir(parents=True)
        (base / day / "report.html").write_text("<p>r</p>")


def test_count_and_age_each_remove(tmp_path: Path) -> None:
    base = tmp_path / "reports"
    folders(base, "2026-11-02", "2026-11-09", "2026-11-16", "2026-11-23")
    (base / "2026-10-01").mkdir()  # no report.html: not a report folder, never removed
    (base / "notes").mkdir()
    removed = prune(base, Retention(count=3), today=date(2026, 11, 30))
    assert removed == ["2026-11-02"]
    removed = prune(base, Retention(max_age_s=10 * 86400), today=date(2026, 11, 30))
    assert removed == ["2026-11-16", "2026-11-09"]
    assert sorted(p.name for p in base.iterdir()) == ["2026-10-01", "2026-11-23", "notes"]


def test_the_report_just_written_stays(tmp_path: Path) -> None:
    listed = [tmp_path / "2026-11-30", tmp_path / "2026-11-23"]
    assert doomed(listed, Retention(count=1, max_age_s=86400), today=date(2027, 1, 1), written=listed[0]) == [
        listed[1]
    ]


def test_no_retention_keeps_everything(tmp_path: Path) -> None:
    folders(tmp_path, "2020-01-01")
    assert prune(tmp_path, Retention(), today=date(2026, 1, 1)) == []


@pytest.mark.parametrize(
    ("retention", "message"),
    [
        ({"count": 0}, "report.retention.count"),
        ({"max_age": "2h"}, "at least 1d"),
        ({"max_age": "soon"}, "report.retention.max_age"),
        ({"keep": 3}, "keep"),
    ],
)
def test_bad_retention_is_one_line(tmp_path: Path, retention: dict[str, object], message: str) -> None:
    with pytest.raises(ServeConfigError) as err:
        config(tmp_path, report={"schedule": "mon 06:00", "retention": retention})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_each_weekly_report_prunes_the_oldest(tmp_path: Path, scheduler_clock) -> None:
    cfg = config(tmp_path, report={"schedule": "mon 06:00", "retention": {"count": 2}})
    base = cfg.state_dir / "reports"
    folders(base, "2026-11-09", "2026-11-16", "2026-11-23")
    _, sched = start(cfg, FakeJobs(), scheduler_clock)
    tick(sched, scheduler_clock, BERLIN_MONDAY_NOON)
    assert sorted(p.name for p in base.iterdir()) == ["2026-11-23", "2026-11-30"]
    sched.shutdown()
