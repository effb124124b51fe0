"""``python -m devkit.demo``: set up, show the four sections, wait, and always clean up."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from devkit import prometheus
from devkit.demo import fleet, history, sections, services
from devkit.demo.console import Console, StepFailed
from devkit.demo.procs import Interrupted, Supervisor, raise_on_signals
from devkit.demo.settings import DemoSettings, SettingsError, from_env
from devkit.demo.tls import ensure_tls, write_kubeconfig

SETUP_STEPS = 7
SECTION_STEPS = 6
MARKER = "GPUPILOT_DEMO_DIR"


def preflight_error(settings: DemoSettings) -> str | None:
    """What makes the demo impossible, as one line saying what to do; None when it can run."""
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        return "prometheus/promtool not found: run 'make demo' (installs Debian's prometheus as root)"
    if not settings.scenario.is_file():
        return f"{settings.scenario} not found: set DEMO_SCENARIO to a fleet scenario file"
    return None


def check_prerequisites(con: Console, settings: DemoSettings) -> None:
    if not shutil.which("kubectl"):
        con.note("kubectl not found: the raw custom.metrics answer will be skipped")
    shown = settings.scenario
    if shown.is_relative_to(settings.root):
        shown = shown.relative_to(settings.root)
    con.note(f"prometheus {shutil.which('prometheus')}, scenario {shown}")


def run(settings: DemoSettings, con: Console) -> int:
    sup = Supervisor(settings.logs)
    server: prometheus.PrometheusServer | None = None
    ends = services.Endpoints()
    kubeconfig = settings.work / "kubeconfig"
    try:
        with con.step("Checking prometheus, promtool, kubectl and the scenario"):
            check_prerequisites(con, settings)
        data = settings.work / "live"
        with con.step(f"History: {settings.days:g} days of {settings.scenario.name} (step {settings.step})"):
            data, how = history.ensure_history(settings, log=settings.logs / "backfill.log")
            con.note(how)
        with con.step("Starting one simulated exporter per node"):
            cmd = services.start_exporters(sup, settings, ends)
            con.note(f"{len(ends.exporters)} exporters, e.g. {cmd[0]}")
        with con.step("Starting the cluster series (kube-state-metrics names, application series)"):
            con.note(services.start_cluster_series(sup, settings, ends))
        with con.step("Starting Prometheus over the history, scraping them, with rules/ loaded"):
            server = services.start_prometheus(settings, data, ends)
            con.note(f"{ends.prometheus}  (data {data})")
            con.note(
                services.wait_for_live_data(ends.prometheus, targets=len(ends.exporters) + bool(ends.cluster))
            )
        with con.step("Starting the adapter (TLS with a local self-signed CA, --pod-source prometheus)"):
            if not ends.prometheus:
                raise StepFailed("Prometheus is not running")
            tls = ensure_tls(settings.work / "tls")
            con.note(services.start_adapter(sup, settings, tls, ends))
            write_kubeconfig(kubeconfig, server=ends.adapter, tls=tls)
            con.note(f"kubeconfig for kubectl: {kubeconfig}")
        with con.step("Set-up complete"):
            con.note(f"set-up took {con.elapsed():.0f}s")

        if not settings.services_only:
            show_sections(con, settings, ends, kubeconfig)
        con.section("4. Where everything is")
        sections.urls(con, settings, ends, kubeconfig, exit_when_done=settings.exit_when_done)
        if con.degraded:
            con.line("")
            con.line(f"{len(con.degraded)} step(s) could not run:")
            for item in con.degraded:
                con.line(f"  ✗ {item}")
        con.line(f"Demo shown in {con.elapsed():.0f}s.")
        if not settings.exit_when_done:
            wait_forever(con, sup)
        return 1 if con.degraded else 0
    except Interrupted as stop:
        con.line(f"\n{stop} received: stopping.")
        return 0 if stop.signum == 2 else 128 + stop.signum
    finally:
        count = len(sup.pids()) + (1 if server is not None else 0)
        sup.stop_all()
        if server is not None:
            server.stop()
        con.line(f"Stopped {count} processes started by the demo.")


def show_sections(con: Console, settings: DemoSettings, ends: services.Endpoints, kubeconfig: Path) -> None:
    con.section("1. The fleet (from Prometheus: exporters' series + recording rules)")
    with con.step("Fleet"):
        if not ends.prometheus:
            raise StepFailed("Prometheus is not running")
        for line in fleet.render(ends.prometheus):
            con.line(f"  {line}")
    con.section("2. Autoscaling: the seed's ai-serving/llm-inference HPA")
    with con.step("explain-hpa on the seed's HPA"):
        sections.explain_hpa(con, settings, ends)
    with con.step("replay-hpa: the same HPA over the history, as written and with a 60 % GPU target"):
        sections.replay_hpa(con, settings, ends)
    with con.step("The raw custom.metrics.k8s.io answer, through kubectl"):
        sections.raw_custom_metrics(con, ends, kubeconfig)
    con.section("3. Rightsizing")
    with con.step("gpupilot-rightsizer plan"):
        sections.plan(con, settings, ends)
    with con.step("gpupilot-rightsizer report"):
        sections.report(con, settings, ends)


def wait_forever(con: Console, sup: Supervisor) -> None:
    while True:
        time.sleep(1)
        for svc in sup.services:
            if svc.proc.poll() is not None:
                con.line(f"{svc.name} exited with {svc.proc.returncode}: {svc.log_tail()} (log {svc.log})")
                sup.services.remove(svc)
                break


HELP_EPILOG = """environment:
  DEMO_EXIT=1            show everything once, then stop (default: run until Ctrl-C)
  DEMO_DAYS=N            days of history to backfill (default 14)
  DEMO_STEP=120s         backfill sample spacing, seconds or minutes (default 120s)
  DEMO_SCENARIO=FILE     fleet scenario (default examples/fleet-demo.yaml)
  DEMO_SKIP_SECTIONS=1   start everything and print the URLs only
  DEMO_DIR=DIR           working files (default .demo/ in the checkout)
"""


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m devkit.demo",
        description="Simulated GPU fleet + real Prometheus + adapter + rightsizer on one machine "
        "(what `make demo` runs). Settings come from the environment.",
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    try:
        settings = from_env()
    except SettingsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    problem = preflight_error(settings)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    raise_on_signals()
    settings.work.mkdir(parents=True, exist_ok=True)
    # Every process the demo starts inherits this marker, so whatever is left can be found.
    os.environ[MARKER] = str(settings.work)
    con = Console(total_steps=SETUP_STEPS + (0 if settings.services_only else SECTION_STEPS))
    con.line(f"gpupilot demo — working files in {settings.work}")
    try:
        return run(settings, con)
    except Interrupted:
        return 130


if __name__ == "__main__":
    sys.exit(main())
