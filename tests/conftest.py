"""Shared fixtures. ``prometheus_history``: a real Prometheus over a week of simulated fleet history;
``kube``: an empty Kubernetes API double for one test.

Kept import-cheap: the simulator, devkit and the API double are imported inside the fixtures, only
when a test asks.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

REPO = Path(__file__).resolve().parent.parent
HISTORY_SCENARIO = REPO / "tests" / "data" / "fleet-small.yaml"
HISTORY_DAYS = 7
HISTORY_STEP_S = 60.0
"""One sample a minute: [1m]+ rates and 5-minute windows work; a week of 4 nodes is ~3.4M samples."""
LIVE_INTERVAL = "10s"
"""Scrape and rule-evaluation interval of the live part (after the history ends, at fixture start)."""


@dataclass(frozen=True)
class PrometheusHistory:
    url: str
    start: float
    """First backfilled sample (Unix seconds)."""
    end: float
    """Last backfilled sample: when the run's shared history was built (the fixture's start, or a
    little before it under pytest-xdist). After the fixture starts, Prometheus scrapes the same
    scenario live (every 10 s, same series) and evaluates rules/, so queries at the current time find
    data."""
    scenario_path: Path
    step: float
    data_dir: Path
    rule_files: tuple[Path, ...]
    """Loaded into Prometheus. Recording rules have results from the fixture's start on; their
    history can be backfilled with ``devkit.history.build_history(rule_files=...)`` (slow)."""
    engine: str = "prometheus"
    """``prometheus`` or ``victoriametrics`` (single node, rules evaluated by vmalert)."""
    rules_url: str = ""
    """Where ``/api/v1/rules`` answers: Prometheus itself, or vmalert."""


def _query(url: str, query: str) -> list[dict[str, Any]]:
    import json  # noqa: PLC0415
    import urllib.parse  # noqa: PLC0415
    import urllib.request  # noqa: PLC0415

    with urllib.request.urlopen(
        f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query}), timeout=10
    ) as r:
        result: list[dict[str, Any]] = json.load(r)["data"]["result"]
    return result


def _wait_for(url: str, query: str, *, minimum: float, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = _query(url, query)
        if result and float(result[0]["value"][1]) >= minimum:
            return
        time.sleep(0.5)
    raise TimeoutError(f"prometheus_history: {query} stayed below {minimum} for {timeout:.0f}s")


def _wait_for_rules(url: str, rule_files: tuple[Path, ...], *, timeout: float) -> None:
    """Until every recording rule whose expression has an answer now has written a result: each
    rule group is evaluated on its own schedule (and vmalert's results reach VictoriaMetrics by remote
    write), so one rule's series says nothing of the others'. A rule over another rule's result is
    waited for once that result exists."""
    import yaml  # noqa: PLC0415

    rules = {
        str(r["record"]): str(r["expr"])
        for path in rule_files
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", [])
        for r in group.get("rules", [])
        if "record" in r
    }
    deadline = time.monotonic() + timeout
    missing: list[str] = []
    while time.monotonic() < deadline:
        written = {
            row["metric"]["__name__"]
            for row in _query(url, 'count by (__name__) ({__name__=~"gpupilot:.+"})')
        }
        missing = sorted(name for name, expr in rules.items() if name not in written and _query(url, expr))
        if not missing:
            return
        time.sleep(0.5)
    raise TimeoutError(f"prometheus_history: no result after {timeout:.0f}s for the rules {missing}")


if TYPE_CHECKING:
    from tests.support.kubedouble import KubeDouble


@pytest.fixture
def kube() -> Iterator[KubeDouble]:
    """An empty API double (MIG Manager, ClusterPolicy and default MIG ConfigMap as it starts them),
    serving on a free loopback port for one test. Modules that need more seed it themselves."""
    from tests.support.kubedouble import KubeDouble  # noqa: PLC0415

    with KubeDouble() as k:
        yield k


@pytest.fixture(scope="session")
def prometheus_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusHistory]:
    from devkit.history import LiveFleet, build_history  # noqa: PLC0415
    from devkit.prometheus import PrometheusServer  # noqa: PLC0415
    from simulator import scenario as scenario_mod  # noqa: PLC0415
    from tests.support.shared import built_once, linked_copy  # noqa: PLC0415

    def build(where: Path) -> dict[str, float]:
        now = time.time()
        end = now - now % HISTORY_STEP_S
        start = end - HISTORY_DAYS * 86400.0
        build_history(
            HISTORY_SCENARIO, start=start, end=end, step=HISTORY_STEP_S, out_dir=where / "data", progress=None
        )
        return {"start": start, "end": end}

    # Backfilled once per run (the first xdist worker to ask builds, the others wait): each worker's
    # Prometheus runs on a hard-linked copy, scraping the same scenario live from its own start on.
    shared, facts = built_once(tmp_path_factory, f"fleet-history-{HISTORY_DAYS}d", build)
    base = tmp_path_factory.mktemp("prometheus-history")
    data = linked_copy(shared / "data", base / "data")
    start, end = float(facts["start"]), float(facts["end"])
    rules = tuple(sorted((REPO / "rules").glob("*.rules.yaml")))
    with LiveFleet(scenario_mod.load(HISTORY_SCENARIO)) as live:
        server = PrometheusServer(
            data,
            rule_files=rules,
            scrape_jobs=live.scrape_jobs(interval=LIVE_INTERVAL),
            scrape_interval=LIVE_INTERVAL,
            evaluation_interval=LIVE_INTERVAL,
            log_file=base / "prometheus.log",
        )
        server.start()
        try:
            _wait_for(server.url, "count(up == 1)", minimum=len(live.servers), timeout=60)
            if rules:
                _wait_for_rules(server.url, rules, timeout=60)
            yield PrometheusHistory(
                url=server.url,
                start=start,
                end=end,
                scenario_path=HISTORY_SCENARIO,
                step=HISTORY_STEP_S,
                data_dir=data,
                rule_files=rules,
                rules_url=server.url,
            )
        finally:
            server.stop()


@pytest.fixture(scope="session")
def victoriametrics_history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusHistory]:
    """The same simulated week in a real single-node VictoriaMetrics: imported through
    ``/api/v1/import/prometheus`` (faster than promtool blocks + vmctl here), then scraped live by
    vmagent (remote write), with vmalert evaluating rules/ and writing recording rules back."""
    from devkit.history import LiveFleet  # noqa: PLC0415
    from devkit.victoriametrics import VictoriaMetricsServer, VMAgent, VMAlert, import_history  # noqa: PLC0415
    from simulator import scenario as scenario_mod  # noqa: PLC0415

    base = tmp_path_factory.mktemp("victoriametrics-history")
    data = base / "data"
    now = time.time()
    end = now - now % HISTORY_STEP_S
    start = end - HISTORY_DAYS * 86400.0
    scenario = scenario_mod.load(HISTORY_SCENARIO)
    rules = tuple(sorted((REPO / "rules").glob("*.rules.yaml")))
    with LiveFleet(scenario) as live:
        server = VictoriaMetricsServer(data, log_file=base / "vm.log")
        server.start()
        agent = VMAgent(server, live.scrape_jobs(interval=LIVE_INTERVAL), log_file=base / "vmagent.log")
        vmalert = VMAlert(server, rules, evaluation_interval=LIVE_INTERVAL, log_file=base / "vmalert.log")
        try:
            import_history(server, scenario, start=start, end=end, step=HISTORY_STEP_S)
            agent.start()
            vmalert.start()
            _wait_for(server.url, "count(up == 1)", minimum=len(live.servers), timeout=60)
            _wait_for_rules(server.url, rules, timeout=60)
            yield PrometheusHistory(
                url=server.url,
                start=start,
                end=end,
                scenario_path=HISTORY_SCENARIO,
                step=HISTORY_STEP_S,
                data_dir=data,
                rule_files=rules,
                engine="victoriametrics",
                rules_url=vmalert.url,
            )
        finally:
            vmalert.stop()
            agent.stop()
            server.stop()


@pytest.fixture(
    scope="session", params=["prometheus", pytest.param("victoriametrics", marks=pytest.mark.slow)]
)
def metrics_history(request: pytest.FixtureRequest) -> PrometheusHistory:
    """The simulated week on each engine in turn: tests that use it run on Prometheus and on
    VictoriaMetrics alike."""
    history: PrometheusHistory = request.getfixturevalue(f"{request.param}_history")
    return history


def pytest_configure(config: pytest.Config) -> None:
    """Tables fit the terminal (gpupilot_common.table): pin the width every test sees to the width of
    a pipe or a log (100 columns), whatever terminal or pytest-xdist worker runs the tests. Tests of
    other widths set ``COLUMNS`` themselves."""
    os.environ["COLUMNS"] = "100"


LONGEST_FIRST = (
    "tests/devkit/test_demo.py",
    "tests/rightsizer/serve/test_serve_failover.py",
    "tests/devkit/test_demo_victoriametrics.py",
    "victoriametrics",
    "tests/rightsizer/analysis/test_bursts.py",
    "tests/deploy/test_helm.py",
    "tests/rightsizer/commands/test_multicluster.py",
    "tests/rightsizer/apply/test_apply_faults.py",
    "tests/rightsizer/commands/test_plan_cli.py",
    "tests/adapter/hpa/recommend/test_cli.py",
    "tests/rightsizer/apply/test_apply_workloads.py",
    "tests/rightsizer/report/test_report.py",
    "tests/deploy/test_helm_install.py",
    "tests/devkit/test_demo_apply.py",
)
"""The groups that take longest (measured: 130 s down to 28 s on 2 cores), handed to workers first
(``make pytest`` passes ``--no-loadscope-reorder``): started last, a two-minute group would run
alone at the end. Then the groups holding a ``slow`` or ``prometheus`` test (mostly waiting on the
servers, deadlines and Leases they exercise: they overlap the long groups' CPU), then the rest (short
and CPU-bound: they keep both cores busy to the end, where waiting groups left one idle for a
minute). Each tier keeps collection order."""


def _group(item: pytest.Item) -> str:
    marker = item.get_closest_marker("xdist_group")
    return str(marker.args[0]) if marker is not None and marker.args else ""


_KUBE_TESTS = Path(__file__).resolve().parent / "kube"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for ``pytest -n N --dist loadgroup`` (``make test``): a module's tests stay on one
    worker, so module fixtures (a Prometheus over a history, a report) are built once; every test
    on VictoriaMetrics runs on one worker, so one VictoriaMetrics history is imported per run.
    ``tryfirst``: pytest-xdist reads the groups in its own hook of the same name (it appends
    ``@group`` to each node id), so they must be marked before it runs. A test that reads one of
    the shared histories is marked ``prometheus`` (``make unit`` leaves it out)."""
    histories = {"prometheus_history", "victoriametrics_history", "metrics_history"}
    for item in items:
        if histories & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.prometheus)
        if _KUBE_TESTS in item.path.parents:
            # every test of tests/kube (its conftest's real_cluster fixture is seen there only): one
            # control plane per run, on one worker; a module with a control plane of its own too
            item.add_marker(pytest.mark.kube)
            item.add_marker(pytest.mark.xdist_group("kube"))
        if item.get_closest_marker("xdist_group"):
            continue
        callspec = getattr(item, "callspec", None)
        engine = callspec.params.get("metrics_history") if callspec else None
        on_vm = "victoriametrics_history" in getattr(item, "fixturenames", ()) or engine == "victoriametrics"
        item.add_marker(pytest.mark.xdist_group("victoriametrics" if on_vm else item.nodeid.split("::")[0]))
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    waiting = {_group(i) for i in items if i.get_closest_marker("slow") or i.get_closest_marker("prometheus")}

    def tier(item: pytest.Item) -> int:
        group = _group(item)
        return rank.get(group, len(rank) + (0 if group in waiting else 1))

    items.sort(key=tier)  # stable: each tier keeps collection order


def pytest_collection_finish(session: pytest.Session) -> None:
    """On a pytest-xdist worker under ``--dist loadgroup``: the groups must have reached the node
    ids (``…@group``), else every module's tests are spread over the workers and each worker
    rebuilds its module fixtures — silently, as with pytest 9.2 and pytest-xdist 3.8
    (pytest-xdist#1386)."""
    config = session.config
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist dropped the test groups ({lost[0]} has none): pytest {pytest.__version__} "
            "and this pytest-xdist do not work together under --dist loadgroup "
            "(pytest-xdist#1386); install the versions pyproject.toml names"
        )
