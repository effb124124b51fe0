"""``gpupilot-rightsizer plan`` end to end on the shared simulated week (``metrics_history``):
a valid plan.json from Prometheus alone, the recording rule used, evidence for idle slices, --help."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rightsizer.apply.plancheck import check_plan
from rightsizer.cli import main
from rightsizer.plan import table
from rightsizer.plan.model import DisruptedPod, load_plan
from tests.support.rightsizer.report_support import plan_with_evidence

pytestmark = pytest.mark.prometheus
ROOT = Path(__file__).resolve().parents[3]


def test_plan_on_simulated_week(metrics_history, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
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
        (["--headroom", "nan"], "is not a finite number (must be between 0 and 4)"),
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


def test_plan_json_output_is_the_plan_file(
    metrics_history, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.json"
    argv = [
        "plan",
        "--prometheus-url",
        metrics_history.url,
        "--at",
        str(metrics_history.end),
        "--out",
        str(out),
    ]
    assert main([*argv, "-o", "json", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == json.loads(out.read_text())
    assert captured.err.strip() == f"wrote {out}"


def test_plan_table_fits_100_columns_unless_wide() -> None:
    plan = plan_with_evidence()
    text = table.plan_table(plan)
    assert max(len(line) for line in text.splitlines()) <= 100, text
    assert "-o wide shows every column" in text
    wide = table.plan_table(plan, wide=True)
    assert "evidence" in wide and max(len(line) for line in wide.splitlines()) > 100


def test_plan_table_never_splits_a_pod_name() -> None:
    """At 100 columns each disrupted pod is on a line of its own, whole: a name copied from the table
    is a name kubectl finds (it was broken after '-' mid-name). Too long for the column beside the
    others, the pods follow the table, one per line."""
    plan = plan_with_evidence()
    (node,) = [n for n in plan.nodes if n.changed][:1]
    long_pods = tuple(
        dataclasses.replace(p, name=f"llm-inference-serving-{i}-7f9c4d5b6-abcde")
        for i, p in enumerate(node.pods_disrupted)
    ) or (DisruptedPod("ml-production", "llm-inference-serving-0-7f9c4d5b6-abcde"),)
    nodes = tuple(dataclasses.replace(n, pods_disrupted=long_pods) if n is node else n for n in plan.nodes)
    text = table.plan_table(dataclasses.replace(plan, nodes=nodes))
    assert max(len(line) for line in text.splitlines()) <= 100, text
    for p in long_pods:  # in the column, or (left out to fit) one per line after the table
        assert any(f"{p.namespace}/{p.name}" in line for line in text.splitlines()), text
