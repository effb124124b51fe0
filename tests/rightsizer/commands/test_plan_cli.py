"""``gpupilot-rightsizer plan`` end to end on the shared simulated week (``metrics_history``):
a valid plan.json from Prometheus alone, the recording rule used, evidence for idle slices, --help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rightsizer.apply.plancheck import check_plan
from rightsizer.cli import main
from rightsizer.plan.model import load_plan

pytestmark = pytest.mark.prometheus
ROOT = Path(__file__).resolve().parents[3]


def test_plan_on_simulated_week(metrics_history, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "plan.json"
    code = main(
        [
            "plan",
            "--prometheus-url",
            metrics_history.url,
            "--window",
            "7d",
            "--at",
            str(metrics_history.end),
            "--out",
            str(out),
            "--all-nodes",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "querying 7 day(s) of history" in captured.err
    plan = load_plan(out)
    check_plan(plan)  # what plan writes, apply accepts (catalogue, content hashes, plan id)
    assert plan.window.duration == "7d"
    names = {n.name: n for n in plan.nodes}
    assert set(names) == {"sim-h100-a", "sim-h100-b", "sim-a100", "sim-h200"}
    assert names["sim-a100"].mig_strategy == "single" and names["sim-a100"].model == "A100 40GB"
    assert names["sim-h100-b"].pci_device_id == "0x2330"
    # The rules only run live (from the fixture's start): the history comes from raw series.
    assert any("covered 0 of 7 day(s)" in n for n in plan.notes)
    # The idle notebook's 1g slice shows up as idle, with full coverage, in the evidence.
    notebook = [e for e in names["sim-h100-b"].evidence if "notebook" in e.pod]
    assert notebook and notebook[0].idle_hours >= 0.9 * notebook[0].coverage_hours > 100
    assert notebook[0].p95_activity is not None and notebook[0].p95_activity < 0.05
    # Every proposed layout is valid for the node's GPUs; totals add up.
    assert plan.totals.gpus == sum(len(n.current) for n in plan.nodes)
    assert plan.totals.gpus_freed == sum(n.gpus_freed for n in plan.nodes)
    assert "sim-h100-b" in captured.out


def test_plan_help_explains_every_flag() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "rightsizer", "plan", "--help"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert res.returncode == 0
    for flag in (
        "--prometheus-url",
        "--window",
        "--out",
        "--max-nodes",
        "--allow-moves",
        "--time-limit",
        "--at",
        "--keep-profiles",
        "--min-busy",
        "--headroom",
        "--idle-threshold",
    ):
        assert flag in res.stdout
    assert "Read-only" in res.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--window", "7x"], "is not a duration"),
        (["--max-nodes", "0"], "must be between 1 and 1000000"),
        (["--at", "yesterday"], "is not a time"),
        (["--min-busy", "2m"], "must be between 5m and 6h"),
        (["--headroom", "nan"], "must be between 0 and 4"),
        (["--idle-threshold", "1.5"], "must be between 0 and 1"),
    ],
)
def test_bad_flags_are_usage_errors(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--prometheus-url", "http://127.0.0.1:1", *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
