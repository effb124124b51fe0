"""``make compat``: the tests on the Prometheus and VictoriaMetrics releases users run today.

Builds (or finds built) the pinned Prometheus 3 LTS and newest, VictoriaMetrics, Alertmanager and
the prometheus-operator's CRDs (``devkit.gobuild``), then runs, each as one pytest run:

* for each Prometheus 3 line: the rules' promtool tests, the exporter's scrape, and the tests over
  the shared fleet history (adapter, rightsizer, dashboards, rules over history) with
  ``GPUPILOT_PROMETHEUS`` naming it;
* once: the ``compat`` tests, which start 2.42 and the 3.x side by side (query equivalence,
  scrape protocols and escaping, Alertmanager routes) or need a built tool (the CRD schemas);
* on the built VictoriaMetrics (``GPUPILOT_VICTORIAMETRICS=current``): the tests that run on
  VictoriaMetrics.

A tool that cannot be built is one line naming it; the runs that need it are reported as not run,
with the reason, the others still run, and the command exits 1. ``make test`` keeps Debian's
Prometheus 2.42 and VictoriaMetrics 1.79 and leaves the ``compat`` tests out.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from devkit import gobuild

REPO = Path(__file__).resolve().parent.parent

HISTORY_TESTS = (
    "tests/adapter/hpa/test_history.py",
    "tests/dashboards/test_queries.py",
    "tests/rightsizer/clients/test_chunking.py",
    "tests/rightsizer/commands/test_plan_cli.py",
    "tests/rightsizer/commands/test_multicluster.py",
    "tests/rightsizer/report/test_report.py",
    "tests/rules/test_rules_history.py",
    "tests/rules/test_idle_coverage.py",
)
"""Tests over the shared simulated fleet (``metrics_history``: Prometheus and VictoriaMetrics)."""


@dataclass(frozen=True)
class Run:
    title: str
    args: tuple[str, ...]
    needs: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


VM_CURRENT_LEFT_OUT = "series_limit_refuses"
"""``test_victoriametrics_series_limit_refuses_whole_fleet_queries_not_cut_ones``, left out on the
built VictoriaMetrics for a reason of VictoriaMetrics': 1.151 does not refuse a query that selects
more series than ``-search.maxUniqueTimeseries`` (2,000 series came back at a limit of 5), so the
refusal this test provokes never comes; the rightsizer's answer to a refusal is tested on Debian's
1.79 in ``make test``. The summary names it."""


def runs() -> list[Run]:
    out = []
    for engine, tool in (("3.13", "prometheus-lts"), ("3.16", "prometheus-latest")):
        out.append(
            Run(
                f"Prometheus {gobuild.TOOLS[tool].release}: rules, scrape, fleet history",
                (
                    "tests/rules",
                    "tests/exporter/test_prometheus_scrape.py",
                    *HISTORY_TESTS,
                    "-m",
                    "not compat",
                    "-k",
                    "not victoriametrics",
                ),
                (tool,),
                {"GPUPILOT_PROMETHEUS": engine},
            )
        )
    out.append(
        Run(
            "Prometheus 2.42 beside 3.x, Alertmanager, the operator's CRDs",
            ("tests", "-m", "compat"),
            ("prometheus-lts", "prometheus-latest", "alertmanager", "prometheus-operator-crds"),
        )
    )
    out.append(
        Run(
            f"VictoriaMetrics {gobuild.VICTORIAMETRICS_RELEASE} (not run there: the series-limit refusal test, "
            "which 1.151 does not refuse; see devkit/compat.py)",
            (
                "tests/devkit/test_victoriametrics.py",
                "tests/devkit/test_demo_victoriametrics.py",
                *HISTORY_TESTS,
                "-m",
                "not compat",
                "-k",
                f"victoriametrics and not {VM_CURRENT_LEFT_OUT}",
            ),
            ("victoriametrics",),
            {"GPUPILOT_VICTORIAMETRICS": "current"},
        )
    )
    return out


def build_tools(names: Sequence[str]) -> dict[str, str]:
    """Build each tool; the ones that failed → the one line saying why."""
    failed = {}
    for name in names:
        try:
            gobuild.build(name)
        except gobuild.GoToolError as exc:
            failed[name] = str(exc)
            print(f"compat: {exc}", file=sys.stderr, flush=True)
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.compat",
        description="The tests on Prometheus 3 (LTS and newest), the current VictoriaMetrics and Alertmanager.",
    )
    parser.add_argument("--workers", type=int, default=4, help="pytest-xdist workers per run (default 4)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments for every run")
    args = parser.parse_args(argv)
    planned = runs()
    failed_tools = build_tools(sorted({t for r in planned for t in r.needs}))
    results: list[tuple[str, str]] = []
    for run in planned:
        missing = [t for t in run.needs if t in failed_tools]
        if missing:
            results.append((run.title, f"NOT RUN: {', '.join(missing)} could not be built"))
            continue
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            str(args.workers),
            "--dist",
            "loadgroup",
            "-p",
            "no:cacheprovider",
            "-q",
            *run.args,
            *args.pytest_args,
        ]
        print(f"==> {run.title}", flush=True)
        started = time.monotonic()
        code = subprocess.run(cmd, cwd=REPO, env={**os.environ, **run.env}, check=False).returncode
        took = f"{time.monotonic() - started:.0f} s"
        results.append((run.title, f"passed ({took})" if code == 0 else f"FAILED, exit {code} ({took})"))
    print("==> compat summary")
    for title, outcome in results:
        print(f"  {title}: {outcome}")
    ok = all(outcome.startswith("passed") for _, outcome in results)
    return 0 if ok and not failed_tools else 1


if __name__ == "__main__":
    raise SystemExit(main())
