"""The report's autoscaling section from recommend-hpa's JSON answers: read and checked at the door
(one line naming file, line and field), laid out in HTML and Markdown, files or folders given."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rightsizer.report import hpas
from rightsizer.report.build import build_report, write_report
from tests.support.rightsizer.report_support import report_data

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "recommend-hpa.json"


def test_a_recommend_hpa_answer_becomes_one_line() -> None:
    line = hpas.read(SAMPLE)
    doc = json.loads(SAMPLE.read_text())
    assert line.hpa == "ai-serving/chat-inference-hpa" and line.target == "Deployment/chat-inference"
    assert line.held_out_days == tuple(doc["held_out_days"])
    assert line.current_gpu_hours == doc["current"]["held_out"]["gpu_hours"]
    assert line.recommended_gpu_hours == doc["recommended"]["held_out"]["gpu_hours"]
    assert line.saving_percent == doc["recommended"]["saving_percent"]
    current = doc["current"]["configuration"]["targets"]
    rec = doc["recommended"]["configuration"]["targets"]
    name = next(n for n in rec if rec[n] != current[n])
    assert f"{name} {current[name]:g} → {rec[name]:g}" in line.changes
    assert "behaviour: up 0s window" in line.changes
    assert line.bound.startswith('inference_queue_wait_seconds{quantile="0.95"} <= 2')
    assert line.trusted


@pytest.mark.slow
def test_the_report_shows_each_hpa_beside_the_rightsizing(tmp_path: Path) -> None:
    line = hpas.read(SAMPLE)
    report = build_report(report_data(price=None, alerts=False), hpas=(line,))
    written = write_report(report, tmp_path / "out")
    md, html = written.markdown.read_text(), written.html.read_text()
    for text in (md, html):
        assert "Autoscaling: HPA recommendations" in text
        assert f"could spend {line.saving_percent:.0f} % fewer GPU-hours" in text
        assert "ai-serving/chat-inference-hpa" in text
    days = " ".join(f"{d} {m:g} min" for d, m in zip(line.held_out_days, line.bound_minutes, strict=True))
    assert days.split(" ")[0] in md
    bare = write_report(build_report(report_data(price=None, alerts=False)), tmp_path / "bare")
    assert "Autoscaling" not in bare.markdown.read_text()


def test_folders_are_read_for_their_json_files(tmp_path: Path) -> None:
    shutil.copy(SAMPLE, tmp_path / "a.json")
    shutil.copy(SAMPLE, tmp_path / "b.json")
    (tmp_path / "notes.txt").write_text("not read")
    assert [p.name for p in hpas.paths([tmp_path])] == ["a.json", "b.json"]
    assert len(hpas.load([tmp_path, SAMPLE])) == 3


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.pop("current"), "current: required (is this recommend-hpa -o json output?)"),
        (lambda d: d["bound"].update(op="=="), "bound.op: '==' is not <= or >="),
        (
            lambda d: d["current"]["held_out"].update(gpu_hours="many"),
            "current.held_out.gpu_hours: must be a number",
        ),
        (
            lambda d: d["recommended"]["held_out"].update(gpu_hours=float("inf")),
            "recommended.held_out.gpu_hours",
        ),
    ],
)
def test_a_damaged_answer_is_one_line(tmp_path: Path, edit, expected: str) -> None:
    doc = json.loads(SAMPLE.read_text())
    edit(doc)
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(doc, indent=2).replace("Infinity", "1e999"))
    with pytest.raises(hpas.HpaRecommendationError) as exc:
        hpas.read(path)
    message = str(exc.value)
    assert "\n" not in message and message.startswith(str(path)) and expected in message, message


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(hpas.HpaRecommendationError) as exc:
        hpas.load([tmp_path / "nope.json"])
    assert "nope.json" in str(exc.value) and "\n" not in str(exc.value)


def test_when_nothing_met_the_bound_the_line_says_so(tmp_path: Path) -> None:
    doc = json.loads(SAMPLE.read_text())
    doc["recommended"] = None
    path = tmp_path / "none.json"
    path.write_text(json.dumps(doc))
    line = hpas.read(path)
    assert line.recommended_gpu_hours is None and "no configuration met the bound" in line.changes
