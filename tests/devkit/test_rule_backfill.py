"""The recording-rule backfill cannot degrade silently: a pass that writes no samples for a rule
fails naming the rules, the range and what the history covers (the demo then fails its history step).

The demo's default path (14 days of history, the rules over the last 7: about a minute of promtool's
CPU) is run whole by ``make demo-check`` in CI, which fails on any failed step; ``make test`` runs the
demo on one day of history through the same code (tests/devkit/test_demo.py)."""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pytest
import yaml

from devkit import history, prometheus
from devkit.demo import rulesubset

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
    kept = re.search(r"see (\S+/promtool\.log) and (\S+/prometheus\.log)\)$", message)
    assert kept, message  # the pass's logs outlive it, for the diagnosis
    promtool_log, prometheus_log = Path(kept[1]), Path(kept[2])
    assert "create-blocks-from rules" in promtool_log.read_text() and prometheus_log.is_file()
    shutil.rmtree(promtool_log.parent)


@pytest.mark.slow
def test_rules_starting_just_before_a_2h_boundary_are_backfilled(tmp_path: Path) -> None:
    """promtool evaluates rules 2 h block by block and, when the group's first evaluation falls past
    the first block's end (``--start`` a second before an even UTC hour, every 300 s), writes
    nothing at all and exits 0: the demo hit this when started a few minutes after an even hour."""
    boundary = int(time.time()) // 7200 * 7200 - 4 * 7200
    series = tmp_path / "history.om"
    lines = ["# TYPE test_gauge gauge"]
    lines += [f'test_gauge{{node="a"}} 1 {t}' for t in range(boundary - 7200, boundary + 7200, 60)]
    series.write_text("\n".join([*lines, "# EOF", ""]))
    data = tmp_path / "data"
    prometheus.backfill_openmetrics(series, data)
    rules = tmp_path / "rules.yaml"
    rules.write_text("groups:\n- name: g\n  rules:\n  - record: test:gauge:copy\n    expr: test_gauge\n")
    history.backfill_rules(data, [rules], start=boundary - 1, end=boundary + 3600, eval_interval=300)
    assert history.names_written(data, {"test:gauge:copy"}) == {"test:gauge:copy"}


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


def test_the_demos_rule_levels_hold_every_rule_plan_and_report_read(tmp_path: Path) -> None:
    """A rule renamed in rules/ cannot drop out of the demo's backfill unseen: every name the demo
    needs is a recording rule there, and the levels hold each one after the rules it reads."""
    files = sorted((ROOT / "rules").glob("*.rules.yaml"))
    rules = rulesubset.recording_rules(files)
    assert set(rulesubset.NEEDED) <= set(rules)
    placed: set[str] = set()
    for path in rulesubset.write_levels(files, tmp_path):
        level = {str(r["record"]) for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]}
        for name in level:
            expr = str(rules[name]["expr"])
            assert all(dep in placed for dep in rulesubset.NEEDED if dep != name and dep in expr), name
        placed |= level
    assert set(rulesubset.NEEDED) <= placed
