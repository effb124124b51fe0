"""Every panel query of every committed dashboard returns data from a real Prometheus over a week of
simulated fleet history (the ``metrics_history`` fixture: backfilled, then scraped live, rules loaded).

Template variables take the values their own queries return on that history: a panel passes when
some real selection shows data (a MIG panel on a node without MIG is rightly empty), and fails on a
query error for any selection or when no selection gives it data.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
import requests

from tests.dashboards import panels
from tests.rules import recorded

RANGE_S = 6 * 3600
STEP_S = 300
SIMULATED = [p for p in panels.DASHBOARD_FILES if p.name != panels.SELF_HEALTH]
QUERIES = panels.queries(SIMULATED)


class Prom:
    def __init__(self, url: str, at: float, *, engine: str = "prometheus") -> None:
        self.url, self.at, self.engine = url, at, engine
        self.session = requests.Session()

    def run(self, expr: str, *, instant: bool) -> list[Any]:
        if instant:
            params: dict[str, Any] = {"query": expr, "time": self.at}
            path = "query"
        else:
            params = {"query": expr, "start": self.at - RANGE_S, "end": self.at, "step": STEP_S}
            path = "query_range"
            if self.engine == "victoriametrics":
                # VictoriaMetrics aligns start/end down to a multiple of step (for its cache) unless
                # nocache=1: evaluate at the same instants as Prometheus (the rules only run live).
                params["nocache"] = "1"
        body = self.session.get(f"{self.url}/api/v1/{path}", params=params, timeout=30).json()
        if body.get("status") != "success":
            raise AssertionError(f"{expr!r}: {body.get('errorType')}: {body.get('error')}")
        result: list[Any] = body["data"]["result"]
        if body["data"]["resultType"] == "scalar":
            return [result]
        return [r for r in result if r.get("values", [None]) or r.get("value")]


@pytest.fixture(scope="module")
def history_prom(metrics_history: Any) -> Prom:
    """The session's simulated week (on each engine), queried once its recording rules have data."""
    recorded.wait_for_records(metrics_history.url)
    return Prom(metrics_history.url, time.time(), engine=metrics_history.engine)


def _values(history_prom: Prom, variable: dict[str, Any], chosen: dict[str, str]) -> list[str]:
    text = panels.substitute(variable["definition"], chosen, range_s=RANGE_S, interval_s=STEP_S)
    m = panels.LABEL_VALUES.match(text.strip())
    assert m, f"variable {variable['name']}: only label_values(selector, label) is supported: {text}"
    label = m["label"]
    rows = history_prom.run(f"group by ({label}) ({m['selector']})", instant=True)
    return sorted({r["metric"][label] for r in rows if label in r["metric"]})


def _selections(history_prom: Prom, dashboard: dict[str, Any]) -> list[dict[str, str]]:
    """Every combination of real variable values (and All where offered), chained in order."""
    selections: list[dict[str, str]] = [{}]
    for variable in panels.variables(dashboard):
        grown = []
        for chosen in selections:
            values = _values(history_prom, variable, chosen)
            # cluster and job: the backfilled series carry neither label, so All (.*) may be the only choice
            assert values or variable["name"] in ("cluster", "job"), (
                f"variable {variable['name']} has no values for {chosen}"
            )
            if variable.get("includeAll"):
                values = [variable["allValue"], *values]
            grown += [{**chosen, variable["name"]: v} for v in values]
        selections = grown
    return selections


@pytest.fixture(scope="module")
def selections(history_prom: Prom) -> dict[str, list[dict[str, str]]]:
    return {p.name: _selections(history_prom, panels.load(p)) for p in SIMULATED}


def test_every_dashboard_has_queries() -> None:
    files = {q.file for q in QUERIES}
    assert files == {p.name for p in SIMULATED}
    assert len(QUERIES) >= 60


@pytest.mark.slow
def test_variables_resolve_to_real_values(selections: dict[str, list[dict[str, str]]]) -> None:
    node = selections["gpupilot-node.json"]
    assert {s["gpu"] for s in node} >= {".*", "0"}
    assert any(s["Hostname"].startswith("sim-") for s in node)
    assert {
        "cluster": ".*",
        "job": ".*",
        "namespace": "ai-serving",
        "hpa": "llm-inference-hpa",
    } in selections["gpupilot-autoscaling.json"]


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_panel_query_returns_data(
    query: panels.Query, history_prom: Prom, selections: dict[str, list[dict[str, str]]]
) -> None:
    tried = []
    for chosen in selections[query.file]:
        expr = panels.substitute(query.expr, chosen, range_s=RANGE_S, interval_s=STEP_S)
        assert "$" not in expr, f"unsubstituted variable in {expr!r}"
        if history_prom.run(expr, instant=query.instant):
            return
        tried.append(chosen)
    pytest.fail(f"{query.id}: empty for every selection {tried}: {query.expr}")


def test_an_empty_query_is_caught(history_prom: Prom) -> None:
    assert history_prom.run('DCGM_FI_DEV_GPU_TEMP{Hostname="no-such-node"}', instant=False) == []
    # Prometheus says bad_data; VictoriaMetrics its HTTP status for the same parse error (422 in 1.79,
    # 400 in 1.151).
    with pytest.raises(
        AssertionError, match="bad_data" if history_prom.engine == "prometheus" else "422|400"
    ):
        history_prom.run("sum by (", instant=True)


def test_mig_and_whole_gpu_utilisation_agree_with_the_raw_series(history_prom: Prom) -> None:
    """The per-pod recording rule on real data: whole GPUs = GPU_UTIL, MIG = 100 × GR_ENGINE_ACTIVE."""
    # Evaluate at the rule's own sample time, where it saw the same raw samples.
    stamp = history_prom.run("max(timestamp(gpupilot:pod_gpu_utilization:percent))", instant=True)
    at_rule = Prom(history_prom.url, float(stamp[0]["value"][1]), engine=history_prom.engine)
    # The rule saw the raw samples as of its evaluation. A scrape whose timestamp is just before the
    # evaluation can be appended after it on a loaded machine (Prometheus), and vmalert queries with
    # a small latency offset (VictoriaMetrics): look for the shift (0-30 s) at which every pod agrees
    # exactly.
    differences = []
    for shift in range(31):
        off = f" offset {shift}s" if shift else ""
        whole = at_rule.run(
            'gpupilot:pod_gpu_utilization:percent{pod=~"llm-inference.*"}'
            f' - on (namespace, pod) avg by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{{pod=~"llm-inference.*"}}{off})',
            instant=True,
        )
        mig = at_rule.run(
            'gpupilot:pod_gpu_utilization:percent{pod="trainer-0"}'
            " - on (namespace, pod) 100 * avg by (namespace, pod)"
            f' (DCGM_FI_PROF_GR_ENGINE_ACTIVE{{pod="trainer-0"}}{off})',
            instant=True,
        )
        assert len(whole) == 3 and len(mig) == 1
        rows = [abs(float(row["value"][1])) for row in itertools.chain(whole, mig)]
        differences.append(max(rows))
        if max(rows) < 1e-6:
            break
    assert differences[-1] < 1e-6, differences
    # MIG pods have no DCGM_FI_DEV_GPU_UTIL at all: the seed's GPU_UTIL-only rules never saw them.
    assert at_rule.run('DCGM_FI_DEV_GPU_UTIL{pod="trainer-0"}', instant=True) == []
