"""Week over week: every report keeps figures.json; the next one compares with the newest earlier
report's, in a section of HTML and Markdown alike; a missing or damaged earlier file is no
comparison, never an error."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rightsizer.report import weekly
from rightsizer.report.build import write_report
from tests.support.rightsizer.report_support import synthetic_report

pytestmark = pytest.mark.slow


def test_each_report_keeps_its_figures(tmp_path: Path) -> None:
    report = synthetic_report()
    write_report(report, tmp_path / "2026-11-30")
    doc = json.loads((tmp_path / "2026-11-30" / weekly.FILE).read_text())
    assert doc["schema"] == 1 and doc["idle_allocated"] == report.idle_pods_total == 4
    assert doc["gpus_freed"] == report.summary.gpus_freed
    assert weekly.load(tmp_path / "2026-11-30") == weekly.of(report)


def test_the_next_report_compares_with_the_newest_earlier_one(tmp_path: Path) -> None:
    report = synthetic_report()
    older = dataclasses.replace(weekly.of(report), idle_allocated=9, gpus_freed=1, alerts=0)
    for name, figures in (
        ("2026-11-16", dataclasses.replace(older, idle_allocated=20)),
        ("2026-11-23", older),
    ):
        (tmp_path / name).mkdir()
        (tmp_path / name / weekly.FILE).write_text(weekly.to_json(figures))
    (tmp_path / "2026-12-07").mkdir()  # a later one is never "previous"
    (tmp_path / "2026-12-07" / weekly.FILE).write_text(weekly.to_json(older))
    found = weekly.previous(tmp_path, tmp_path / "2026-11-30")
    assert found is not None and found[0] == "2026-11-23"
    written = write_report(dataclasses.replace(report, previous=found), tmp_path / "2026-11-30")
    md = written.markdown.read_text()
    assert "## Week over week" in md and "report of 2026-11-23" in md
    assert "| allocated devices idle all window | 9 | 4 | −5 |" in md
    assert "| GPUs the plan frees | 1 |" in md
    assert "Week over week" in written.html.read_text()


def test_no_earlier_report_says_so(tmp_path: Path) -> None:
    written = write_report(synthetic_report(), tmp_path / "2026-11-30")
    assert "No earlier report with its figures" in written.markdown.read_text()


@pytest.mark.parametrize("text", ["not json", '{"schema": 2}', '{"schema": 1, "idle_allocated": -1}', "[]"])
def test_a_damaged_or_foreign_file_is_no_comparison(tmp_path: Path, text: str) -> None:
    (tmp_path / "2026-11-23").mkdir()
    (tmp_path / "2026-11-23" / weekly.FILE).write_text(text)
    assert weekly.previous(tmp_path, tmp_path / "2026-11-30") is None
