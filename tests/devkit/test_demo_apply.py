"""The demo's apply step: a plan that resizes a workload, applied to the simulated cluster started from
it, ends with the table showing the workload Running on the new slice and nothing Pending. That the
demo fleet's own plan resizes one (the summarizer, 2g.20gb → 1g.10gb) is checked on the one-shot
demo run (tests/devkit/test_demo.py), which plans and applies it."""

from __future__ import annotations

import io
import os

import pytest

from devkit.demo import applyplan
from devkit.demo.console import Console
from devkit.demo.procs import Supervisor
from devkit.demo.settings import from_env
from tests.support.rightsizer.apply_support import resize_plan, write_plan


@pytest.mark.slow
def test_the_demo_applies_a_resizing_plan_to_its_simulated_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("DEMO_DIR", str(tmp_path / "work"))
    settings = from_env()
    settings.work.mkdir(parents=True)
    plan = resize_plan(
        "gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", "reports-0a1b2c3d4e-x1y2z", "1g.10gb")]
    )
    plan_file = write_plan(plan, settings.work / "plan.json")
    out = io.StringIO()
    con = Console(total_steps=1, out=out)
    sup = Supervisor(settings.logs)
    try:
        with con.step("apply"):
            applyplan.show(con, settings, sup, plan_file)
        started = sup.pids()
    finally:
        sup.stop_all()
    text = out.getvalue()
    assert con.degraded == [], text
    assert "gpu-a  applied" in text, text
    row = next(line for line in text.splitlines() if "deployment/ml/reports" in line)
    assert (
        row.split()[-1] == "1/1" and "nvidia.com/mig-3g.40gb: 1" in row and "nvidia.com/mig-1g.10gb: 1" in row
    )
    assert "1 workload template patch(es)" in text
    assert "status.phase=Pending: none" in text
    assert len(started) == 1 and not _alive(started[0])  # the simulated cluster, stopped with the demo


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
