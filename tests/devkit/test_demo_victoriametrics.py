"""`DEMO_BACKEND=victoriametrics make demo`: the same one-shot run on VictoriaMetrics (its own module,
so it runs beside the Prometheus one-shot run rather than after it)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.devkit.demo_run import demo_env, leftovers

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


def test_one_shot_run_on_victoriametrics(tmp_path: Path) -> None:
    """DEMO_BACKEND=victoriametrics: the same steps, the history imported into VictoriaMetrics,
    vmagent scraping and vmalert evaluating rules/; every command reads VictoriaMetrics' API."""
    proc = subprocess.run(
        [sys.executable, "-m", "devkit.demo"],
        cwd=ROOT,
        env=demo_env(tmp_path, DEMO_EXIT="1", DEMO_BACKEND="victoriametrics"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "✗" not in out, out[-3000:]
    steps = re.findall(r"^==> \[(\d+)/(\d+)\]", out, flags=re.MULTILINE)
    total = int(steps[0][1]) if steps else 0
    assert total >= 14 and steps == [(str(i), str(total)) for i in range(1, total + 1)], out[-3000:]
    assert out.count("ok (") == total
    assert re.search(r"imported [\d,]+ samples \(1 days at a 120s step\) into http://127\.0\.0\.1:(\d+)", out)
    # the recording rules' history, replayed by vmalert, is what plan reads: no raw-series fallback
    assert re.search(r"recording rules for plan/report every 300s replayed by vmalert in \d+s", out), out[
        -3000:
    ]
    assert "covered 0 of" not in out, out[-3000:]
    url = re.search(r"VictoriaMetrics UI\s+(http://127\.0\.0\.1:\d+)/vmui", out)
    assert url, out[-3000:]
    assert "1. The fleet (from VictoriaMetrics" in out
    assert f"gpupilot-rightsizer plan --prometheus-url {url.group(1)}" in out
    assert f"replay-hpa -f examples/hpa-llm-inference.yaml --prometheus-url {url.group(1)}" in out
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["prometheus_url"] == url.group(1) and plan["nodes"]
    assert (tmp_path / "report" / "report.html").stat().st_size > 1000
    assert not (tmp_path / "history").exists(), "no Prometheus TSDB is built for VictoriaMetrics"
    assert leftovers(tmp_path) == []
