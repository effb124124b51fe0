"""The rules on a real Prometheus over a week of simulated history: every rule evaluates without
error, the recording rules count the scenario's slices, and the alerts fire where the scenario
has problems (an allocated-but-idle MIG slice) and stay quiet where it has none."""

from __future__ import annotations

import time
from typing import Any

import pytest
import requests
import yaml

from tests.rules import recorded
from tests.rules.test_rules import ALERTS
from tests.support.promquery import instant


@pytest.fixture(scope="module", autouse=True)
def _recorded(metrics_history: Any) -> None:
    """Every recording rule has data (level-2 groups lag level-1 by one evaluation)."""
    recorded.wait_for_records(metrics_history.url)


@pytest.fixture(scope="module")
def rules_state(metrics_history: Any) -> list[dict[str, Any]]:
    """Every loaded rule, once each group has been evaluated at least once."""
    deadline = time.monotonic() + 60
    while True:
        body = requests.get(f"{metrics_history.rules_url}/api/v1/rules", timeout=30).json()
        groups = body["data"]["groups"]
        if groups and all(not g["lastEvaluation"].startswith("0001") for g in groups):
            return [r for g in groups for r in g["rules"]]
        assert time.monotonic() < deadline, "rule groups never evaluated"
        time.sleep(1)


@pytest.mark.slow
def test_every_rule_evaluates_without_error(rules_state: list[dict[str, Any]]) -> None:
    assert len([r for r in rules_state if r["type"] == "alerting"]) == len(ALERTS)
    bad = [(r["name"], r.get("lastError")) for r in rules_state if r["health"] != "ok"]
    assert not bad


def test_slice_counts_match_the_scenario(metrics_history: Any) -> None:
    at = time.time()
    scen = yaml.safe_load(metrics_history.scenario_path.read_text())
    assert {n["name"] for n in scen["nodes"]} == {"sim-h100-a", "sim-h100-b", "sim-a100", "sim-h200"}
    total = {
        r["metric"]["Hostname"]: float(r["value"][1])
        for r in instant(metrics_history.url, "gpupilot:node_slices:total", at)
    }
    # 2 whole H100s; 1 whole H100 + 3g.40gb + 4 × 1g.10gb; all-2g.10gb on an A100 40GB = 3; 1 whole H200.
    assert total == {"sim-h100-a": 2, "sim-h100-b": 6, "sim-a100": 3, "sim-h200": 1}
    allocated = {
        r["metric"]["Hostname"]: float(r["value"][1])
        for r in instant(metrics_history.url, "gpupilot:node_slices:allocated", at)
    }
    assert allocated == {"sim-h100-a": 2, "sim-h100-b": 4, "sim-a100": 2, "sim-h200": 1}


def _alert_expr(name: str) -> str:
    return str(next(a["expr"] for a in ALERTS if a["alert"] == name))


def _without_coverage_clause(expr: str) -> str:
    """MIGSliceIdle24h without its coverage clauses (the rule's series must exist 24 h ago and have
    a sample in every hour since)."""
    sep = "and on (Hostname, UUID, GPU_I_ID, namespace, pod)"
    first, *rest = expr.strip().split(sep)
    coverage = [c for c in rest if "gpupilot:slice_activity:avg5m" in c]
    assert len(coverage) == 2 and any("offset 24h" in c for c in coverage)
    return sep.join([first, *(c for c in rest if c not in coverage)])


def test_a_fresh_rule_over_old_raw_history_does_not_call_a_slice_idle_for_24h(metrics_history: Any) -> None:
    """The fixture's rules run live from its start over a week of backfilled raw series: their
    series hold minutes, not a day. The idle notebook slice is what the alert looks for, yet it
    must stay silent until the rule's own series covers 24 h."""
    at = time.time()
    expr = _alert_expr("MIGSliceIdle24h")
    assert instant(metrics_history.url, expr, at) == []
    idle = instant(metrics_history.url, _without_coverage_clause(expr), at)
    assert [
        (r["metric"]["Hostname"], r["metric"]["GPU_I_PROFILE"], r["metric"]["pod"][:9]) for r in idle
    ] == [("sim-h100-b", "1g.10gb", "notebook-")]
    low = {r["metric"]["pod"][:9] for r in instant(metrics_history.url, _alert_expr("GPULowUtilization"), at)}
    assert "notebook-" in low
    assert not low & {"llm-infer", "pretrain-"}


def test_healthy_history_raises_no_hardware_alert(metrics_history: Any) -> None:
    at = time.time()
    for name in (
        "GPUDoubleBitECCErrors",
        "GPURowRemapFailure",
        "GPUDriverVersionMismatch",
        "GPUMemoryPressure",
    ):
        assert instant(metrics_history.url, _alert_expr(name), at) == [], name


def test_hpa_join_reaches_the_seed_deployment(metrics_history: Any) -> None:
    at = time.time()
    pods = instant(
        metrics_history.url, 'gpupilot:pod_hpa:info{horizontalpodautoscaler="llm-inference-hpa"}', at
    )
    assert len(pods) == 3
    assert all(r["metric"]["pod"].startswith("llm-inference-") for r in pods)
    util = instant(metrics_history.url, "gpupilot:hpa_gpu_utilization:percent", at)
    assert len(util) == 1 and 0 < float(util[0]["value"][1]) <= 100
