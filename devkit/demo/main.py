"""``python -m devkit.demo``: set up, show the four sections, wait, and always clean up."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from devkit import prometheus, victoriametrics
from devkit.demo import applyplan, fleet, history, sections, services, vmstore
from devkit.demo.console import Console, StepFailed
from devkit.demo.procs import Interrupted, Supervisor, raise_on_signals
from devkit.demo.settings import DemoSettings, SettingsError, from_env
from devkit.demo.tls import ensure_tls, write_kubeconfig
from devkit.process import LoopbackServer
from devkit.victoriametrics import VictoriaMetricsServer

SETUP_STEPS = 7
SECTION_STEPS = 8
MARKER = "GPUPILOT_DEMO_DIR"


def preflight_error(settings: DemoSettings) -> str | None:
    """What makes the demo impossible, as one line saying what to do; None when it can run."""
    if settings.backend == "victoriametrics":
        problem = vmstore.preflight_error()
        if problem:
            return problem
    else:
        try:
            prometheus.engine().binaries(build_missing=False)
        except prometheus.PrometheusError as err:
            return str(err)
    if not settings.scenario.is_file():
        return f"{settings.scenario} not found: set DEMO_SCENARIO to a fleet scenario file"
    return None


def check_prerequisites(con: Console, settings: DemoSettings) -> None:
    if not shutil.which("kubectl"):
        con.note("kubectl not found: the raw custom.metrics answer will be skipped")
    shown = settings.scenario
    if shown.is_relative_to(settings.root):
        shown = shown.relative_to(settings.root)
    if settings.backend == "victoriametrics":
        store = (
            f"VictoriaMetrics {victoriametrics.engine()} {victoriametrics.require_binary('victoria-metrics')}"
        )
    else:
        chosen = prometheus.engine()
        store = f"Prometheus {chosen.release} {chosen.binaries()[0]}"
    con.note(f"{store}, scenario {shown} ({prometheus.ENGINE_ENV}, {victoriametrics.ENGINE_ENV} choose)")


def run(settings: DemoSettings, con: Console) -> int:
    sup = Supervisor(settings.logs)
    servers: list[LoopbackServer] = []
    """Stores and agents started here, stopped last-started first."""
    ends = services.Endpoints()
    vm = settings.backend == "victoriametrics"
    kubeconfig = settings.work / "kubeconfig"
    try:
        tools = "victoria-metrics, vmagent, vmalert" if vm else "prometheus, promtool"
        with con.step(f"Checking {tools}, kubectl and the scenario"):
            check_prerequisites(con, settings)
        data = settings.work / "live"
        where = " into VictoriaMetrics" if vm else ""
        with con.step(
            f"History: {settings.days:g} days of {settings.scenario.name} (step {settings.step}){where}"
        ):
            data, how = _history(settings, ends, servers)
            con.note(how)
        with con.step("Starting one simulated exporter per node"):
            cmd = services.start_exporters(sup, settings, ends)
            con.note(f"{len(ends.exporters)} exporters, e.g. {cmd[0]}")
        with con.step("Starting the cluster series (kube-state-metrics names, application series)"):
            con.note(services.start_cluster_series(sup, settings, ends))
        what = (
            "vmagent scraping them into VictoriaMetrics, vmalert with rules/ loaded"
            if vm
            else "Prometheus over the history, scraping them, with rules/ loaded"
        )
        with con.step(f"Starting {what}"):
            con.note(_scrape_and_rules(settings, ends, servers, data))
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
            show_sections(con, settings, ends, kubeconfig, sup)
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
        count = len(sup.pids()) + len(servers)
        sup.stop_all()
        for server in reversed(servers):
            server.stop()
        con.line(f"Stopped {count} processes started by the demo.")


def _history(
    settings: DemoSettings, ends: services.Endpoints, servers: list[LoopbackServer]
) -> tuple[Path, str]:
    """Prometheus: the TSDB directory (built or reused); VictoriaMetrics: the store, started with the
    history imported (its data directory is returned for the note)."""
    if settings.backend != "victoriametrics":
        found = history.ensure_history(settings, log=settings.logs / "backfill.log")
        ends.history_end = history.history_end(settings)
        return found
    store, how = vmstore.start_with_history(settings, ends)
    servers.append(store)
    return store.data_dir, how


def _scrape_and_rules(
    settings: DemoSettings, ends: services.Endpoints, servers: list[LoopbackServer], data: Path
) -> str:
    if settings.backend != "victoriametrics":
        servers.append(services.start_prometheus(settings, data, ends))
        ends.rules = ends.prometheus
        return f"{ends.prometheus}  (data {data})"
    store = next((s for s in servers if isinstance(s, VictoriaMetricsServer)), None)
    if store is None:
        raise StepFailed("VictoriaMetrics is not running")
    agent, alert = vmstore.start_agents(settings, store, ends)
    servers += [agent, alert]
    ends.rules = alert.url
    return f"vmagent {agent.url} → {store.url}, vmalert {alert.url}"


def show_sections(
    con: Console, settings: DemoSettings, ends: services.Endpoints, kubeconfig: Path, sup: Supervisor
) -> None:
    con.section(f"1. The fleet (from {settings.store_name}: exporters' series + recording rules)")
    with con.step("Fleet"):
        if not ends.prometheus:
            raise StepFailed(f"{settings.store_name} is not running")
        for line in fleet.render(ends.prometheus):
            con.line(f"  {line}")
    con.section("2. Autoscaling: the example HPA ai-serving/llm-inference")
    with con.step("explain-hpa on the example HPA"):
        sections.explain_hpa(con, settings, ends)
    with con.step("replay-hpa: the same HPA over the history, as written and with a 60 % GPU target"):
        sections.replay_hpa(con, settings, ends)
    with con.step(
        "recommend-hpa: the chat-inference HPA's cheapest targets and behaviour that hold its wait bound"
    ):
        sections.recommend_hpa(con, settings, ends)
    with con.step("The raw custom.metrics.k8s.io answer, through kubectl"):
        sections.raw_custom_metrics(con, ends, kubeconfig)
    con.section("3. Rightsizing")
    plan = settings.work / "plan.json"
    with con.step("gpupilot-rightsizer plan"):
        plan = sections.plan(con, settings, ends)
    with con.step("gpupilot-rightsizer apply, to a simulated cluster (API double + MIG Manager + scheduler)"):
        applyplan.show(con, settings, sup, plan)
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
  DEMO_BACKEND=NAME      prometheus (default) or victoriametrics (vmagent scrapes, vmalert runs rules/)
  GPUPILOT_PROMETHEUS=V  3.13 (default: the LTS), 3.16 (the newest) or 2.42 (Debian's package);
                         a 3.x is built from its Go module the first time (minutes, a progress line)
  GPUPILOT_VICTORIAMETRICS=V  1.151 (default, built the same way) or 1.79 (Debian's package)
"""


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m devkit.demo",
        description="Simulated GPU fleet + real Prometheus or VictoriaMetrics + adapter + rightsizer on one machine "
        "(what `make demo` runs). Settings come from the environment.",
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    try:
        settings = from_env()
    except SettingsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:  # the releases users run today unless told otherwise; built now when missing
        if settings.backend == "victoriametrics":
            victoriametrics.require_binary("victoria-metrics", victoriametrics.select_default())
        else:
            prometheus.select_default()
    except (prometheus.PrometheusError, victoriametrics.VictoriaMetricsError) as err:
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
