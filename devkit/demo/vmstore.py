"""The demo on VictoriaMetrics (``DEMO_BACKEND=victoriametrics``): a single-node VictoriaMetrics with
the history imported through its import API, vmagent scraping the simulated exporters and the cluster
series into it, and vmalert evaluating rules/ against it and writing the results back.

The history is imported afresh each run (the import API is the faster of the two ways measured for
the tests, see docs/victoriametrics.md); the recording rules ``plan`` and ``report`` read are then
replayed over the rightsizer's default window by ``vmalert -replay.timeFrom/-replay.timeTo`` (as the
Prometheus demo backfills them with promtool), so both read the rules' history there too.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from devkit import victoriametrics as vm
from devkit.demo import history, services
from devkit.demo.console import StepFailed
from devkit.demo.settings import DemoSettings
from devkit.history import DROP_TARGET_LABELS
from devkit.prometheus import ScrapeJob
from exporter.errors import ScenarioError
from simulator import scenario as scenario_mod


def preflight_error() -> str | None:
    for binary in ("victoria-metrics", "vmagent", "vmalert"):
        try:
            vm.require_binary(binary)
        except vm.VictoriaMetricsError as err:
            return str(err)
    return None


def start_with_history(
    settings: DemoSettings, ends: services.Endpoints
) -> tuple[vm.VictoriaMetricsServer, str]:
    """A fresh VictoriaMetrics under ``work/victoriametrics`` holding ``settings.days`` of history."""
    try:
        scenario = scenario_mod.load(settings.scenario)
    except ScenarioError as err:
        raise StepFailed(f"{settings.scenario}: {err}") from err
    base = settings.work / "victoriametrics"
    shutil.rmtree(base, ignore_errors=True)
    settings.logs.mkdir(parents=True, exist_ok=True)
    server = vm.VictoriaMetricsServer(base / "data", log_file=settings.logs / "victoria-metrics.log")
    end = float(int(time.time()) - history.LIVE_GAP_SECONDS)
    start = end - settings.days * 86400
    ends.history_end = end
    begun = time.monotonic()
    try:
        server.start(timeout=120)
        stats = vm.import_history(
            server, scenario, start=start, end=end, step=settings.step_seconds, progress=sys.stdout
        )
        imported_s = time.monotonic() - begun
        rules_s = _replay_rules(settings, server, start=start, end=end)
    except vm.VictoriaMetricsError as err:
        server.stop()
        raise StepFailed(str(err)) from err
    ends.prometheus = server.url
    return server, (
        f"imported {stats.samples:,} samples ({settings.days:g} days at a {settings.step} step) into "
        f"{server.url} in {imported_s:.0f}s, recording rules for plan/report every "
        f"{settings.rule_step_seconds:.0f}s replayed by vmalert in {rules_s:.0f}s"
    )


def _replay_rules(
    settings: DemoSettings, server: vm.VictoriaMetricsServer, *, start: float, end: float
) -> float:
    """The recording rules plan and report read, over the window they read, level by level (a rule
    reading another rule's results after it)."""
    begun = time.monotonic()
    rule_start, levels = history.rule_levels(
        settings, settings.work / "victoriametrics" / "rules-replay", start=start, end=end
    )
    for path in levels:
        t0 = time.monotonic()
        vm.replay_rules(
            server,
            path,
            start=rule_start,
            end=end,
            eval_interval=settings.rule_step_seconds,
            log_file=settings.logs / "vmalert-replay.log",
        )
        print(
            f"      │ {path.stem}: replayed over the last {(end - rule_start) / 86400:g} days in "
            f"{time.monotonic() - t0:.0f}s",
            flush=True,
        )
    return time.monotonic() - begun


def start_agents(
    settings: DemoSettings, server: vm.VictoriaMetricsServer, ends: services.Endpoints
) -> tuple[vm.VMAgent, vm.VMAlert]:
    """vmagent scraping the exporters and the cluster series (without ``job``/``instance``, so live
    samples continue the imported series), and vmalert over rules/."""
    targets = [u.removeprefix("http://") for u in ends.exporters.values()]
    jobs = [ScrapeJob("gpupilot-exporter", targets, interval="5s", metric_relabel_configs=DROP_TARGET_LABELS)]
    if ends.cluster:
        jobs.append(
            ScrapeJob(
                "kube-state-metrics",
                [ends.cluster.removeprefix("http://")],
                interval="5s",
                metric_relabel_configs=DROP_TARGET_LABELS,
            )
        )
    rules: list[Path] = sorted((settings.root / "rules").glob("*.rules.yaml"))
    agent = vm.VMAgent(server, jobs, log_file=settings.logs / "vmagent.log")
    alert = vm.VMAlert(
        server,
        rules,
        evaluation_interval=f"{services.EVALUATION_SECONDS}s",
        log_file=settings.logs / "vmalert.log",
    )
    try:
        agent.start(timeout=60)
        alert.start(timeout=60)
    except vm.VictoriaMetricsError as err:
        alert.stop()
        agent.stop()
        raise StepFailed(str(err)) from err
    return agent, alert
