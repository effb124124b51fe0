"""`make demo` (python -m devkit.demo): a one-shot run shows every section with real content, a
second run reuses the history and stops every process on SIGTERM, and bad settings fail clearly."""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from devkit.demo import history
from devkit.demo.console import Console, StepFailed, table
from devkit.demo.settings import SettingsError, from_env
from tests.support.devkit.demo_run import demo_env, leftovers

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "examples" / "fleet-demo.yaml"

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


@dataclass(frozen=True)
class DemoRun:
    code: int
    out: str
    work: Path
    seconds: float


@pytest.fixture(scope="module")
def one_shot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    work = tmp_path_factory.mktemp("demo")
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "devkit.demo"],
        cwd=ROOT,
        env=demo_env(work, DEMO_EXIT="1"),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    yield DemoRun(proc.returncode, proc.stdout + proc.stderr, work, time.monotonic() - started)


def section(out: str, title: str) -> str:
    start = out.index(title)
    rest = out[start + len(title) :]
    end = rest.find("━━ ")
    return rest if end < 0 else rest[:end]


def test_one_shot_run_succeeds_with_every_step(one_shot: DemoRun) -> None:
    assert one_shot.code == 0, one_shot.out[-3000:]
    assert "✗" not in one_shot.out, one_shot.out[-3000:]
    setup = re.search(r"set-up took (\d+)s", one_shot.out)
    assert setup and int(setup.group(1)) < 180


def test_fleet_section_lists_every_node_gpu_and_slice_state(one_shot: DemoRun) -> None:
    text = section(one_shot.out, "1. The fleet")
    nodes = [n["name"] for n in yaml.safe_load(SCENARIO.read_text())["nodes"]]
    for node in nodes:
        assert node in text
    summary = re.search(
        r"(\d+) nodes, (\d+) GPUs \((\d+) with MIG\), (\d+) devices: (\d+) busy, (\d+) allocated but idle",
        text,
    )
    assert summary, text
    assert int(summary.group(1)) == len(nodes)
    assert int(summary.group(5)) > 0 and int(summary.group(6)) > 0, "the demo fleet has busy and idle slices"
    assert "1g.10gb×7" in text and "MIG off (whole GPU)" in text
    assert "research/notebook" in section(text, "Allocated but idle")


def test_autoscaling_section_explains_the_example_hpa_and_shows_the_raw_api(one_shot: DemoRun) -> None:
    text = section(one_shot.out, "2. Autoscaling")
    assert "gpupilot-adapter explain-hpa -f examples/hpa-llm-inference.yaml" in text
    assert "DCGM_FI_DEV_GPU_UTIL" in text and "inference_queue_depth" in text
    assert "gpupilot-adapter replay-hpa -f examples/hpa-llm-inference.yaml" in text
    replayed = re.search(r"mean replicas\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", text)
    assert replayed, text
    assert re.search(r"GPU-hours\s+[\d.]+\s+[\d.]+\s+[\d.]+", text)
    assert (one_shot.work / "replay-hpa.png").read_bytes()[:4] == b"\x89PNG"
    # one day of history: recommend-hpa needs three (make demo-check runs it on the default fortnight)
    assert "recommend-hpa learns from at least 3 days" in text
    assert "kubectl get --raw '/apis/custom.metrics.k8s.io/v1beta2/namespaces/ai-serving/pods/*/" in text
    assert '"kind": "MetricValueList"' in text
    values = re.search(r"values: (.+)", text)
    assert values and values.group(1).count("llm-inference-") == 3


def test_rightsizing_section_writes_plan_and_report(one_shot: DemoRun) -> None:
    text = section(one_shot.out, "3. Rightsizing")
    assert "gpupilot-rightsizer plan --prometheus-url" in text
    plan = json.loads((one_shot.work / "plan.json").read_text())
    assert isinstance(plan, dict) and plan
    report = re.search(r"weekly report: (\S+\.html)", text)
    assert report and Path(report.group(1)).stat().st_size > 1000
    # the plan applied to the simulated cluster: every disrupted workload Running again, none Pending
    assert "gpupilot-rightsizer apply --plan" in text and "--dry-run" in text
    rows = [ln.split() for ln in text.splitlines() if ln.strip().startswith("deployment/")]
    assert rows and all(r[-1].split("/")[0] == r[-1].split("/")[1] for r in rows), text
    assert "status.phase=Pending: none" in text
    # the demo fleet's own plan changes one request (the summarizer, 2g.20gb → 1g.10gb): it ends
    # Running and Ready on the new slice
    changed = [
        ln for ln in text.splitlines() if ln.strip().startswith("deployment/") and "(unchanged)" not in ln
    ]
    assert len(changed) == 1, text
    assert "nvidia.com/mig-2g.20gb: 1" in changed[0] and "nvidia.com/mig-1g.10gb: 1" in changed[0], text
    assert changed[0].split()[-1] == "1/1", text
    assert "pod ai-serving/summarizer-" in text and "to nvidia.com/mig-1g.10gb" in text


def test_urls_section_and_cleanup(one_shot: DemoRun) -> None:
    text = section(one_shot.out, "4. Where everything is")
    assert re.search(r"Prometheus UI\s+http://127\.0\.0\.1:\d+/graph", text)
    assert len(re.findall(r"exporter \S+\s+http://127\.0\.0\.1:\d+/metrics", text)) == 5
    assert re.search(r"adapter\s+https://127\.0\.0\.1:\d+/apis/custom\.metrics\.k8s\.io/v1beta2", text)
    stopped = re.search(r"Stopped (\d+) processes", one_shot.out)
    assert stopped and int(stopped.group(1)) >= 8
    assert leftovers(one_shot.work) == []


def test_second_run_reuses_history_and_sigterm_stops_everything(one_shot: DemoRun) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "devkit.demo"],
        cwd=ROOT,
        env=demo_env(one_shot.work, DEMO_SKIP_SECTIONS="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    try:
        deadline = time.monotonic() + 120
        for line in proc.stdout:
            lines.append(line)
            if "Running until Ctrl-C" in line or time.monotonic() > deadline:
                break
        assert any("reused 1 days of history" in line for line in lines), "".join(lines)
        assert leftovers(one_shot.work), "the demo's services should be running now"
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "SIGTERM received: stopping." in rest
    assert proc.returncode == 128 + signal.SIGTERM
    assert leftovers(one_shot.work) == []


def test_bad_settings_fail_with_one_line(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"DEMO_DAYS='two': expected a number"):
        from_env({"DEMO_DAYS": "two"}, root=tmp_path)
    with pytest.raises(SettingsError, match="DEMO_STEP='1h'"):
        from_env({"DEMO_STEP": "1h"}, root=tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "devkit.demo"],
        cwd=ROOT,
        env=demo_env(tmp_path, DEMO_DAYS="-3"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "DEMO_DAYS='-3'" in proc.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "devkit.demo"],
        cwd=ROOT,
        env=demo_env(tmp_path, DEMO_SCENARIO=str(tmp_path / "nope.yaml")),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert (
        missing.stderr.strip()
        == f"error: {tmp_path / 'nope.yaml'} not found: set DEMO_SCENARIO to a fleet scenario file"
    )
    assert not (tmp_path / "history").exists(), "nothing is started or written for an impossible run"


def test_a_failing_step_prints_one_line_and_the_rest_goes_on() -> None:
    out = io.StringIO()
    con = Console(total_steps=2, out=out)
    with con.step("first"):
        raise StepFailed("gpupilot-adapter is not available in this checkout yet")
    with con.step("second"):
        con.note("ran")
    text = out.getvalue()
    assert (
        "==> [1/2] first\n      ✗ skipped: gpupilot-adapter is not available in this checkout yet\n" in text
    )
    assert "==> [2/2] second\n      ran\n      ok (" in text
    assert con.degraded == ["first: gpupilot-adapter is not available in this checkout yet"]
    with pytest.raises(KeyboardInterrupt), con.step("third"):
        raise KeyboardInterrupt  # anything else propagates, so the demo's clean-up runs


def test_history_is_reused_only_for_the_same_scenario_rules_days_and_step(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("nodes: []\n")
    settings = from_env(
        {"DEMO_SCENARIO": str(scenario), "DEMO_DIR": str(tmp_path / "w"), "DEMO_DAYS": "2"}, root=tmp_path
    )
    (settings.history_dir / "data").mkdir(parents=True)
    stamp = history.wanted_stamp(settings, now=1000.0)
    (settings.history_dir / history.STAMP).write_text(json.dumps(stamp.__dict__))
    assert history.reusable(settings, history.wanted_stamp(settings, now=2000.0)) == stamp
    later = history.wanted_stamp(settings, now=1000.0 + 7 * 3600)
    assert history.reusable(settings, later) is None, "history older than 6 h is rebuilt"
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "a.rules.yaml").write_text("groups: []\n")
    assert history.reusable(settings, history.wanted_stamp(settings, now=2000.0)) is None, "rules changed"
    (tmp_path / "rules" / "a.rules.yaml").unlink()
    assert history.reusable(settings, history.wanted_stamp(settings, now=2000.0)) == stamp
    scenario.write_text("nodes: [changed]\n")
    assert history.reusable(settings, history.wanted_stamp(settings, now=2000.0)) is None
    other = from_env(
        {"DEMO_SCENARIO": str(scenario), "DEMO_DIR": str(tmp_path / "w"), "DEMO_DAYS": "3"}, root=tmp_path
    )
    assert history.reusable(other, history.wanted_stamp(other, now=2000.0)) is None


def test_table_aligns_columns() -> None:
    lines = table(["NODE", "BUSY"], [["gpu-a", "3"], ["gpu-long-name", "12"]])
    assert lines[0] == "NODE           BUSY"
    assert lines[2] == "gpu-a             3"
    assert lines[3] == "gpu-long-name    12"


def test_sigterm_during_the_backfill_leaves_nothing_behind(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "devkit.demo"],
        cwd=ROOT,
        env=demo_env(tmp_path, DEMO_DAYS="3", DEMO_EXIT="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if "History:" in line:
                break
        deadline = time.monotonic() + 30
        while not any("backfill" in p for p in leftovers(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert any("backfill" in p for p in leftovers(tmp_path)), "the backfill should be running"
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "SIGTERM received: stopping." in rest
    assert proc.returncode == 128 + signal.SIGTERM
    time.sleep(0.5)
    assert leftovers(tmp_path) == []


def test_unknown_backend_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(
        SettingsError, match=r"^DEMO_BACKEND='thanos': expected one of prometheus, victoriametrics$"
    ):
        from_env({"DEMO_BACKEND": "thanos"}, root=tmp_path)
    assert from_env({}, root=tmp_path).backend == "prometheus"
    proc = subprocess.run(
        [sys.executable, "-m", "devkit.demo"],
        cwd=ROOT,
        env=demo_env(tmp_path, DEMO_BACKEND="mimir"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: DEMO_BACKEND='mimir': expected one of prometheus, victoriametrics"
