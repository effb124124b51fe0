"""Starting the demo's services: one simulated exporter per node, the cluster series, Prometheus,
and the adapter over TLS."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from devkit import prometheus
from devkit.demo import commands, promql
from devkit.demo.console import StepFailed
from devkit.demo.procs import ServiceError, Supervisor
from devkit.demo.settings import DemoSettings
from devkit.demo.tls import DemoTls

EVALUATION_SECONDS = 5
"""Scrape and rule interval of the demo's Prometheus: live values show up within seconds."""


@dataclass
class Endpoints:
    exporters: dict[str, str] = field(default_factory=dict)
    """node → http://127.0.0.1:PORT of its simulated exporter."""
    cluster: str = ""
    prometheus: str = ""
    """The Prometheus API every command queries: Prometheus, or VictoriaMetrics (DEMO_BACKEND)."""
    rules: str = ""
    """Where rules are evaluated: Prometheus itself, or vmalert."""
    adapter: str = ""
    history_end: float = 0.0
    """The last backfilled sample (Unix seconds); live scrapes start minutes later."""


def scenario_nodes(path: Path) -> list[str]:
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise StepFailed(f"{path}: cannot read the scenario ({err})") from err
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    names = [n.get("name") for n in nodes or [] if isinstance(n, dict)]
    if not names or not all(isinstance(n, str) for n in names):
        raise StepFailed(f"{path}: expected a 'nodes' list whose entries have a 'name'")
    return [str(n) for n in names]


def start_exporters(sup: Supervisor, settings: DemoSettings, ends: Endpoints) -> list[str]:
    nodes = scenario_nodes(settings.scenario)
    started = []
    for node in nodes:
        port = prometheus.free_port()
        args = ["--backend", "sim", "--scenario", str(settings.scenario), "--node", node,
                "--node-name", node, "--listen", f"127.0.0.1:{port}", "--interval", "5"]  # fmt: skip
        svc = sup.start(f"exporter-{node}", commands.argv("gpupilot-exporter", *args))
        started.append((node, port, svc))
    for node, port, svc in started:
        try:
            sup.wait_http(svc, f"http://127.0.0.1:{port}/ready", timeout=60)
        except ServiceError as err:
            raise StepFailed(str(err)) from err
        ends.exporters[node] = f"http://127.0.0.1:{port}"
    return [commands.shown("gpupilot-exporter", ["--backend", "sim", "--scenario", str(settings.scenario),
                                                  "--node", nodes[0], "--listen", "127.0.0.1:PORT"],
                           root=settings.root)]  # fmt: skip


def start_cluster_series(sup: Supervisor, settings: DemoSettings, ends: Endpoints) -> str:
    port = prometheus.free_port()
    args = ["cluster", "--scenario", str(settings.scenario), "--listen", f"127.0.0.1:{port}"]
    svc = sup.start("cluster-series", commands.argv("gpupilot-exporter", *args))
    try:
        sup.wait_http(svc, f"http://127.0.0.1:{port}/metrics", timeout=60)
    except ServiceError as err:
        raise StepFailed(str(err)) from err
    ends.cluster = f"http://127.0.0.1:{port}"
    return commands.shown("gpupilot-exporter", args, root=settings.root)


class DemoPrometheus(prometheus.PrometheusServer):
    """Scraped series without ``job``/``instance``, exactly as the backfill writes them.

    Live samples then extend the backfilled series instead of starting new ones (whose
    ``instance`` would also change with every run's free ports), so history and live data are one
    series per device and nothing downstream sees duplicates.
    """

    def config(self) -> dict[str, object]:
        cfg = super().config()
        jobs = cfg.get("scrape_configs")
        if isinstance(jobs, list):
            for job in jobs:
                job["metric_relabel_configs"] = [{"action": "labeldrop", "regex": "job|instance"}]
        return cfg


def start_prometheus(settings: DemoSettings, data: Path, ends: Endpoints) -> prometheus.PrometheusServer:
    rules = sorted((settings.root / "rules").glob("*.rules.yaml"))
    jobs = []
    if ends.exporters:
        targets = [u.removeprefix("http://") for u in ends.exporters.values()]
        jobs.append(prometheus.ScrapeJob("gpupilot-exporter", targets, interval="5s"))
    if ends.cluster:
        jobs.append(
            prometheus.ScrapeJob("kube-state-metrics", [ends.cluster.removeprefix("http://")], interval="5s")
        )
    server = DemoPrometheus(
        data,
        rule_files=rules,
        scrape_jobs=jobs,
        scrape_interval="5s",
        evaluation_interval=f"{EVALUATION_SECONDS}s",
        log_file=settings.logs / "prometheus.log",
    )
    settings.logs.mkdir(parents=True, exist_ok=True)
    try:
        server.start(timeout=120)
    except prometheus.PrometheusError as err:
        raise StepFailed(str(err)) from err
    ends.prometheus = server.url
    return server


def wait_for_live_data(url: str, *, targets: int, timeout: float = 60.0) -> str:
    """Wait until every target is up and the recording rules have produced a first result."""
    deadline = time.monotonic() + timeout
    up = rules = 0
    while time.monotonic() < deadline:
        up = int(sum(s.value for s in promql.query(url, "up == 1")))
        rules = len(promql.query(url, "gpupilot:slice_activity:avg5m"))
        if up >= targets and rules and promql.query(url, "gpupilot:device_idle:bool"):
            # Rule groups are evaluated independently and the 5-minute means fill up with live
            # scrapes: wait until the fleet-level result holds still for one evaluation.
            settled = _wait_settled(url, "sum(gpupilot:fleet_waste:gpu_equivalents)", deadline=deadline)
            return f"{up}/{targets} targets up, {rules} slices in gpupilot:slice_activity:avg5m{settled}"
        time.sleep(1)
    return f"{up}/{targets} targets up, {rules} slices with rule results after {timeout:.0f}s (continuing)"


def _wait_settled(url: str, expr: str, *, deadline: float) -> str:
    previous: list[float] | None = None
    while time.monotonic() < deadline:
        time.sleep(EVALUATION_SECONDS + 1)
        current = [round(s.value, 6) for s in promql.query(url, expr)]
        if current == previous:
            return ""
        previous = current
    return f" ({expr} still changing)"


def start_adapter(sup: Supervisor, settings: DemoSettings, tls: DemoTls, ends: Endpoints) -> str:
    port = prometheus.free_port()
    args = [
        "serve",
        "--prometheus-url", ends.prometheus,
        "--secure-port", str(port),
        "--bind-address", "127.0.0.1",
        "--tls-cert-file", str(tls.server_cert),
        "--tls-private-key-file", str(tls.server_key),
        "--client-ca-file", str(tls.ca_cert),
        "--authentication-skip-lookup",
        "--authorization-mode", "none",
        "--pod-source", "prometheus",
    ]  # fmt: skip
    svc = sup.start("adapter", commands.argv("gpupilot-adapter", *args))
    try:
        sup.wait_http(svc, f"https://127.0.0.1:{port}/readyz", timeout=60, insecure=True)
    except ServiceError as err:
        raise StepFailed(str(err)) from err
    ends.adapter = f"https://127.0.0.1:{port}"
    return commands.shown("gpupilot-adapter", args, root=settings.root)
