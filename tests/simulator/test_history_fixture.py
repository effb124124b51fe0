"""The shared prometheus_history fixture: a week of backfilled history that agrees with live values."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from devkit.history import recording_order
from simulator import scenario
from simulator.backend import SimBackend
from tests.conftest import PrometheusHistory

pytestmark = pytest.mark.prometheus


def _query(h: PrometheusHistory, q: str, t: float) -> list[dict[str, object]]:
    url = f"{h.url}/api/v1/query?" + urllib.parse.urlencode({"query": q, "time": t})
    with urllib.request.urlopen(url, timeout=60) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def test_history_spans_a_week_and_matches_snapshots(prometheus_history: PrometheusHistory) -> None:
    h = prometheus_history
    assert h.end - h.start >= 7 * 86400 and h.end <= time.time()
    s = scenario.load(h.scenario_path)
    t = h.start + 3 * 86400 + 7 * h.step  # a sample time, days back
    t -= t % h.step
    for node in s.nodes:
        snap = SimBackend(s, node=node.name).snapshot_at(t)
        res = _query(h, f'DCGM_FI_DEV_POWER_USAGE{{Hostname="{node.name}"}}', t)
        by_gpu = {r["metric"]["gpu"]: float(r["value"][1]) for r in res}  # type: ignore[index]
        assert by_gpu == {str(g.info.index): g.values["DCGM_FI_DEV_POWER_USAGE"] for g in snap.gpus}
    assert len(_query(h, 'kube_pod_status_phase{phase="Running"} == 1', t)) == len(s.pods)


def test_live_scrapes_continue_the_same_series(prometheus_history: PrometheusHistory) -> None:
    h = prometheus_history
    now = time.time()
    assert float(_query(h, "count(DCGM_FI_DEV_GPU_TEMP)", now)[0]["value"][1]) == 6  # type: ignore[index]
    # one series per GPU across the history/live boundary: live samples carry no job/instance either
    window = f"[{int(now - h.end) + 600}s]"
    counts = _query(h, f"count(count_over_time(DCGM_FI_DEV_GPU_TEMP{window}))", now)
    assert float(counts[0]["value"][1]) == 6  # type: ignore[index]
    assert _query(h, 'kube_pod_labels{label_app="llm-inference"}', now)


def test_rules_are_loaded_and_evaluated(prometheus_history: PrometheusHistory) -> None:
    h = prometheus_history
    recorded = set()
    for path in h.rule_files:
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            recorded |= {r["record"] for r in group.get("rules", []) if "record" in r}
    assert recorded, "rules/ has no recording rules"
    assert _query(h, "gpupilot:slice_activity:avg5m", time.time())


def test_rule_files_are_backfilled_in_dependency_order(tmp_path: Path) -> None:
    base = tmp_path / "z-base.rules.yaml"
    base.write_text("groups: [{name: a, rules: [{record: 'x:y:z', expr: up}]}]\n")
    derived = tmp_path / "a-derived.rules.yaml"
    derived.write_text("groups: [{name: b, rules: [{record: 'x:y:sum', expr: sum(x:y:z)}]}]\n")
    alerts = tmp_path / "alerts.rules.yaml"
    alerts.write_text("groups: [{name: c, rules: [{alert: A, expr: up == 0}]}]\n")
    assert recording_order([derived, alerts, base]) == [base, derived]
