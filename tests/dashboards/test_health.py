"""The gpupilot / Health dashboard over the services' own series: the exposition of a real exporter
(``--once`` on the simulator), of the adapter's and the rightsizer's own registries after some work,
backfilled into a real Prometheus as an hour of scrapes; every panel's query returns data."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from adapter.serving.selfmetrics import SelfMetrics
from devkit.prometheus import PrometheusServer, backfill_openmetrics
from rightsizer.serve import status
from rightsizer.serve.state import State
from tests.dashboards import panels
from tests.support.rightsizer.apply_support import Change, make_plan

pytestmark = pytest.mark.prometheus
REPO = Path(__file__).resolve().parents[2]
HEALTH = REPO / "dashboards" / panels.SELF_HEALTH
STEP_S = 30
POINTS = 120  # an hour of scrapes


def exporter_text() -> str:
    res = subprocess.run(
        [sys.executable, "-m", "exporter", "--backend", "sim", "--once",
         "--scenario", str(REPO / "examples" / "fleet-demo.yaml")],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return res.stdout


def adapter_text(step: int) -> str:
    metrics = SelfMetrics()
    for _ in range(10 * step):
        metrics.requests.record("custom", 200, 0.004)
    metrics.requests.record("external", 503, 0.002)
    metrics.prometheus.query_seconds.labels(purpose="value").observe(0.01)
    metrics.prometheus.errors.labels(purpose="value").inc(step % 3)
    metrics.values_age.set(12.0)
    metrics.serving_cert_expiry.set(time.time() + 40 * 86400)
    return metrics.exposition().decode()


def rightsizer_text(now: float) -> str:
    plan = make_plan([Change("gpu-a", "all-1g.10gb", {"7g.80gb": 1}, gpus_freed=2)])
    state = State(plan=plan, plan_made_at=now, started_at=now - 3600)
    state.last_success = {"plan": now - 600, "report": now - 86400}
    state.intervals = {"plan": 6 * 3600.0, "report": 7 * 86400.0}
    state.applies["applied"] = 1

    class Families(Collector):
        def collect(self) -> Iterator[Metric]:
            return status.metric_families(state, Counter({"plan": 1}))

    registry = CollectorRegistry()
    registry.register(Families())
    return generate_latest(registry).decode()


def openmetrics(texts: list[tuple[float, dict[str, str], str]]) -> str:
    """Exposition texts (at a time, with target labels) as one OpenMetrics file of gauges."""
    series: dict[str, list[str]] = {}
    for at, target, text in texts:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = {**s.labels, **target}
                body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                series.setdefault(s.name, []).append(f"{s.name}{{{body}}} {s.value} {at:.0f}")
    lines = []
    for name, samples in series.items():
        lines.append(f"# TYPE {name} gauge")
        lines += sorted(samples, key=lambda line: float(line.rsplit(" ", 1)[1]))
    return "\n".join([*lines, "# EOF", ""])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, float]]:
    base = tmp_path_factory.mktemp("health")
    now = time.time()
    end = now - now % STEP_S
    exporter = exporter_text()
    texts = []
    for i in range(POINTS):
        at = end - (POINTS - 1 - i) * STEP_S
        texts.append((at, {"job": "gpupilot-exporter", "instance": "n1:9400"}, exporter))
        texts.append((at, {"job": "gpupilot-adapter", "instance": "a1:6443"}, adapter_text(i)))
        texts.append((at, {"job": "gpupilot-rightsizer", "instance": "r1:9500"}, rightsizer_text(at)))
    (base / "health.om").write_text(openmetrics(texts))
    backfill_openmetrics(base / "health.om", base / "data")
    with PrometheusServer(base / "data", log_file=base / "prometheus.log") as server:
        yield server.url, end


QUERIES = panels.queries([HEALTH])


@pytest.mark.parametrize("query", QUERIES, ids=[q.id for q in QUERIES])
def test_health_panel_query_returns_data(query: panels.Query, prometheus: tuple[str, float]) -> None:
    url, end = prometheus
    expr = panels.substitute(query.expr, {"cluster": ".*", "job": ".*"}, range_s=3600, interval_s=STEP_S)
    assert "$" not in expr
    params = urllib.parse.urlencode({"query": expr, "time": f"{end:.0f}"})
    with urllib.request.urlopen(f"{url}/api/v1/query?{params}", timeout=30) as answer:
        doc = json.loads(answer.read())
    assert doc["status"] == "success", doc
    assert doc["data"]["result"], f"{query.id}: empty: {expr}"


def test_every_panel_is_covered() -> None:
    assert len(QUERIES) >= 14
