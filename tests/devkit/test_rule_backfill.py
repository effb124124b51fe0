"""The recording-rule backfill cannot degrade silently: a pass that writes no samples for a rule
fails naming the rules, the range and what the history covers; the demo's default path (14 days of
history, the rules over the last 7) writes samples for every rule it backfills."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from devkit import history
from devkit.demo import history as demo_history
from devkit.demo import rulesubset
from devkit.demo.settings import from_env

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.prometheus


def test_a_pass_that_writes_nothing_fails_with_the_reason(tmp_path: Path) -> None:
    """No raw history under the rules: promtool exits 0 having written no block; the backfill says so."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "groups:\n- name: g\n  rules:\n  - record: test:gpu_util:avg\n    expr: avg(DCGM_FI_DEV_GPU_UTIL)\n"
    )
    data = tmp_path / "data"
    data.mkdir()
    end = float(int(time.time()) // 3600 * 3600)
    with pytest.raises(history.RuleBackfillError) as failed:
        history.backfill_rules(data, [rules], start=end - 3600, end=end, eval_interval=300)
    message = str(failed.value)
    assert "wrote no samples for test:gpu_util:avg" in message
    assert "the history covers no blocks" in message and "\n" not in message
    assert not list(data.iterdir()) or not history.blocks(data)


def test_names_are_matched_whole_in_a_blocks_index(tmp_path: Path) -> None:
    block = tmp_path / "01ABC"
    block.mkdir()
    (block / "meta.json").write_text('{"stats": {"numSamples": 10}, "minTime": 0, "maxTime": 1000}')
    name = b"gpupilot:node_slices:idle_total"
    (block / "index").write_bytes(b"\x00\x01" + bytes([len(name)]) + name)
    found = history.names_written(tmp_path, {"gpupilot:node_slices:idle", "gpupilot:node_slices:idle_total"})
    assert found == {"gpupilot:node_slices:idle_total"}  # a longer name does not stand for a shorter one
    (block / "meta.json").write_text('{"stats": {"numSamples": 0}}')
    assert history.names_written(tmp_path, {"gpupilot:node_slices:idle_total"}) == set()


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the demo's whole default history: 2-5 minutes of CPU on 2 cores
def test_default_demo_history_backfills_every_rule(tmp_path: Path) -> None:
    """The demo's default settings (14 days at a 120 s step, rules every 300 s over the last 7 days):
    every recording rule the plan and report read has samples over the rules' window."""
    settings = from_env({"DEMO_DIR": str(tmp_path / "work")}, root=ROOT)
    assert settings.days == 14.0 and settings.step == "120s" and settings.rule_step_seconds == 300.0
    data, line = demo_history.ensure_history(settings, log=tmp_path / "backfill.log")
    assert line.startswith("built 14 days at a 120s step")
    needed = set(rulesubset.NEEDED)
    assert history.names_written(data, needed) == needed
