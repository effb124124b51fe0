"""``gpupilot-rightsizer serve --config FILE``: scheduled report, plan and guarded auto-apply."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpupilot_common import credentials, loops, promauth
from gpupilot_common.httpserve import FileReply, HTTPServer, Limits, Reply
from rightsizer.apply import protocol as proto
from rightsizer.apply.applier import Applier, ApplyReport, ApplySettings
from rightsizer.apply.record import mig_nodes
from rightsizer.clients.kube import Kube, KubeError, KubeSettings
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.errors import RightsizerError
from rightsizer.plan.model import Plan, dump_plan
from rightsizer.serve import config as serve_config
from rightsizer.serve import labelcheck
from rightsizer.serve.config import AutoApply, PlanJob, ReportJob, ServeConfig
from rightsizer.serve.failures import quiet_job_failures
from rightsizer.serve.leader import LeaderElector
from rightsizer.serve.ledger import ConfigMapLedger
from rightsizer.serve.scheduler import Service
from rightsizer.serve.stopsignal import StopSignal
from rightsizer.serve.webfiles import ReportFiles
from rightsizer.serve.wording import in_config_terms

log = logging.getLogger(__name__)


class LiveJobs:
    """The real work: Prometheus → plan, Prometheus → report, plan → Kubernetes."""

    def __init__(self, config: ServeConfig, *, loop_failures: loops.LoopFailures | None = None) -> None:
        self.config = config
        self.loop_failures = loop_failures or loops.LoopFailures()
        self._api_problem = ""
        """Why the last plan could not read the Kubernetes API ("" when it could): said once."""
        self._labels_checked = False

    # The plan pipeline (scipy) and the report (pandas, matplotlib) are imported when a job first
    # runs: `serve --help` and `serve --check` answer in a fraction of a second instead of two.
    def make_plan(self, *, end: float, job: PlanJob) -> Plan:
        from rightsizer.plan.pipeline import make_plan  # noqa: PLC0415

        view = self._cluster()
        with PrometheusClient(self.config.prometheus_url, auth=self.config.prometheus_auth) as client:
            plan = make_plan(
                client,
                end=end,
                settings=job.plan_settings(),
                node_modes=view.modes if view else None,
                node_labels=view.labels if view else None,
            )
            if not self._labels_checked:  # once, after the first plan: Prometheus answers by then
                self._labels_checked = True
                for line in labelcheck.gaps(counter(client)):
                    log.warning("%s", line)
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        dump_plan(plan, self.config.state_dir / "plan.json")
        return plan

    def _cluster(self) -> Any:
        """The nodes as ``plan --kubeconfig`` reads them (their MIG strategy and config labels, the
        nodes NVIDIA's DRA driver manages), wherever serve reaches the Kubernetes API (in its pod, or
        auto_apply.kubeconfig); without it the plan reads ``kube_node_labels`` only, said once."""
        from rightsizer.commands import plan as plan_command  # noqa: PLC0415 (loads the pipeline)

        try:
            view = plan_command.cluster_view(self.config.auto_apply.kubeconfig)
        except KubeError as exc:
            reason = str(exc)
            if reason != self._api_problem:
                level = logging.WARNING if self.config.auto_apply.enabled else logging.INFO
                log.log(level, "node labels and DRA nodes read from Prometheus only: %s", reason)
            self._api_problem = reason
            return None
        if self._api_problem:
            log.info("node labels and DRA nodes read from the Kubernetes API again")
        self._api_problem = ""
        return view

    def write_report(self, *, end: float, job: ReportJob, plan: Plan | None, out_dir: Path) -> Path:
        # Without a plan the report plans with the plan job's settings (the same pipeline as 'plan').
        from rightsizer.report import build as report  # noqa: PLC0415

        settings = (self.config.plan or PlanJob()).plan_settings(window_s=job.window_s)
        with PrometheusClient(self.config.prometheus_url, auth=self.config.prometheus_auth) as client:
            written = report.generate(
                client,
                out=out_dir,
                end=end,
                settings=settings,
                price=job.price_per_gpu_hour,
                plan=plan,
                hpa_recommendations=job.hpa_recommendations,
            )
        return written.html

    def node_marks(self, *, settings: AutoApply) -> Sequence[proto.NodeView]:
        kube = Kube.connect(KubeSettings(kubeconfig=settings.kubeconfig))
        try:
            return mig_nodes(kube, apply_settings(settings).namespace)
        finally:
            kube.close()

    def apply(
        self, plan: Plan, *, settings: AutoApply, nodes: Collection[str], stop: Callable[[], str]
    ) -> ApplyReport:
        kube = Kube.connect(KubeSettings(kubeconfig=settings.kubeconfig))
        try:
            return Applier(
                kube,
                plan,
                apply_settings(settings),
                only=nodes,
                stop=stop,
                on_lease_failure=self.loop_failures.counter("apply-lease"),
            ).run()
        finally:
            kube.close()


def apply_settings(settings: AutoApply) -> ApplySettings:
    """What ``apply`` would get from the flags the serve config's ``auto_apply`` fields stand for."""
    return ApplySettings(
        namespace=settings.operator_namespace,
        configmap=settings.mig_configmap,
        max_parallel=settings.max_parallel,
        repoint_cluster_policy=settings.repoint_cluster_policy,
        configmap_sync_s=settings.configmap_sync_s,
        lease_duration_s=settings.lease_duration_s,
    )


def http_server(
    service: Service, scheduler: Any, host: str, port: int, *, limits: Limits | None = None
) -> HTTPServer:
    """``/metrics``, ``/health``, the latest report and plan (:mod:`rightsizer.serve.webfiles`) on
    aiohttp (bounded connections and header sizes; see :mod:`gpupilot_common.httpserve`). Listens at
    once; ``start()`` serves."""
    registry = service.registry()
    config = service.config
    report = config.report
    files = ReportFiles(
        reports_dir=(report.out_dir if report and report.out_dir else config.state_dir / "reports"),
        plan_path=config.state_dir / "plan.json",
    )

    def answer(path: str, _query: Mapping[str, str]) -> Reply | FileReply:
        if path == "/metrics":
            return Reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
        if path in ("/health", "/healthz"):
            health = service.health(scheduler)
            code = 503 if health["status"] == "stuck" else 200  # a liveness probe restarts a stuck replica
            return Reply(code, json.dumps(health).encode(), "application/json")
        if files.handles(path):
            return files.answer(path)
        return Reply(404, b"not found: try /health, /metrics, /report/, /reports/ or /plan.json\n")

    return HTTPServer(answer, host=host, port=port, limits=limits, name="serve-http")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the rightsizer as a service: a weekly report (cron, explicit time zone), a plan every N "
        "hours and, if enabled, a guarded auto-apply (maintenance window, max nodes per day, minimum "
        "GPUs freed). Serves /health and /metrics. Stops cleanly on SIGTERM/SIGINT, letting a running "
        "job finish. Serves /report/ (the latest weekly report), /reports/ (every one) and /plan.json "
        "(the latest plan) too. See examples/rightsizer-serve.yaml."
    )
    parser.add_argument(
        "--config",
        type=Path,
        required=True,
        metavar="FILE",
        help="YAML schedule (see examples/rightsizer-serve.yaml)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate the config, check that Prometheus (and, with auto-apply or leader election, the "
        "Kubernetes API) answers, warn about kube-state-metrics series or allow-listed labels that are "
        "missing (docs/deploy.md#kube-state-metrics), print the next run of each job, exit (1 when one "
        "does not answer)",
    )
    parser.add_argument(
        "--offline",
        action="store_true",
        help="with --check: validate the file only, reaching neither Prometheus nor Kubernetes "
        "(a config checked where the cluster is not reachable, as in CI)",
    )


def serve(config: ServeConfig, *, stop: threading.Event, jobs: Any = None) -> int:
    election = config.auto_apply.leader_election
    elector: LeaderElector | None = None
    failures = loops.LoopFailures()
    if election is not None:
        kube = Kube.connect(KubeSettings(kubeconfig=config.auto_apply.kubeconfig))
        identity = os.environ.get("POD_NAME") or socket.gethostname()
        elector = LeaderElector(
            kube,
            election.namespace,
            identity=identity,
            duration_s=election.lease_duration_s,
            on_failure=failures.counter("leader-election"),
        )
        elector.start()
        service = Service(
            config,
            jobs=jobs or LiveJobs(config, loop_failures=failures),
            ledger=ConfigMapLedger(kube, election.namespace),
            leader=elector.is_leader,
            loop_failures=failures,
        )
    else:
        service = Service(
            config, jobs=jobs or LiveJobs(config, loop_failures=failures), loop_failures=failures
        )
    if config.auto_apply.enabled and (source := config.auto_apply.stop_signal) is not None:
        try:
            service.stop_signal = stop_signal(config, source)
        except KubeError as exc:  # auto-apply itself will say it cannot reach the API
            log.warning("the emergency stop cannot be read (only auto_apply.paused works): %s", exc)
    scheduler = BackgroundScheduler(timezone=config.timezone, executors={"default": ThreadPoolExecutor(2)})
    service.add_jobs(scheduler)
    try:
        server = http_server(service, scheduler, config.listen_host, config.listen_port)
    except OSError as exc:
        print(
            f"error: cannot listen on {config.listen_host}:{config.listen_port}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    server.start()
    scheduler.start()
    log.info("serving /health, /metrics, /report/ and /plan.json on %s:%d", *server.address)
    for job in scheduler.get_jobs():
        log.info("job %s: next run %s", job.id, job.next_run_time)
    stop.wait()
    service.stopping.set()  # an apply in progress stops at its next safe step
    log.info("stopping: waiting for running jobs to finish")
    stop_jobs(scheduler, service)
    if elector is not None:
        elector.stop(release=True)
    server.close()
    return 0


def stop_signal(config: ServeConfig, source: serve_config.StopSignalSource) -> StopSignal:
    """The emergency stop's and drain requests' annotations on ``source``, read through the API."""
    kube = Kube.connect(KubeSettings(kubeconfig=config.auto_apply.kubeconfig))

    def read() -> dict[str, str] | None:
        found = kube.get_configmap(source.namespace, source.configmap)
        if found is None:
            return None
        return {str(k): str(v) for k, v in ((found.get("metadata") or {}).get("annotations") or {}).items()}

    return StopSignal(read, where=f"ConfigMap {source.namespace}/{source.configmap}", started_at=time.time())


def stop_jobs(scheduler: Any, service: Service) -> None:
    """No new runs, then wait for the running ones to finish. Not ``shutdown(wait=True)``: that can
    deadlock with a job that calls the scheduler as it ends (see :meth:`Service.wait_idle`)."""
    scheduler.shutdown(wait=False)
    service.wait_idle()


def counter(client: PrometheusClient) -> labelcheck.Count:
    """A PromQL ``count(...)`` expression → its value (0 when the answer is empty)."""

    def count(expr: str) -> float:
        samples = client.instant(expr)
        return float(samples[0].value) if samples else 0.0

    return count


def label_gaps(config: ServeConfig, *, timeout_s: float = 10.0) -> list[str]:
    """``serve --check``: kube-state-metrics series or allow-listed labels that are missing."""
    try:
        with PrometheusClient(
            config.prometheus_url, auth=config.prometheus_auth, timeout=timeout_s
        ) as client:
            return labelcheck.gaps(counter(client))
    except RightsizerError as exc:
        return [f"kube-state-metrics series not checked: {in_config_terms(str(exc), config.source)}"]


def reachability(config: ServeConfig, *, timeout_s: float = 10.0) -> str:
    """``serve --check``: Prometheus answers a query, and with auto-apply the Kubernetes API lists
    the MIG nodes ("" when both do; else one line in the config's terms)."""
    try:
        with PrometheusClient(
            config.prometheus_url, auth=config.prometheus_auth, timeout=timeout_s
        ) as client:
            client.instant("1")
    except RightsizerError as exc:
        return in_config_terms(str(exc), config.source)
    if config.auto_apply.enabled or config.auto_apply.leader_election is not None:
        try:
            kube = Kube.connect(
                KubeSettings(kubeconfig=config.auto_apply.kubeconfig, request_timeout_s=timeout_s)
            )
            try:
                kube.list_nodes(label_selector=proto.CONFIG_LABEL)
            finally:
                kube.close()
        except KubeError as exc:
            return f"the Kubernetes API for auto_apply: {in_config_terms(str(exc), config.source)}"
    return ""


def run(args: argparse.Namespace) -> int:
    try:
        config = serve_config.load(args.config)
    except serve_config.ServeConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # read the secret and TLS files once now: a bad one stops the start, not the first job
        credentials.Credentials(config.prometheus_auth, field="prometheus_")
    except promauth.CredentialError as exc:
        print(f"error: {args.config}: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if not args.offline and (problem := reachability(config)):
            print(f"error: {problem}", file=sys.stderr)
            return 1
        if not args.offline:
            for line in label_gaps(config):
                print(f"warning: {line}", file=sys.stderr)
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
        service = Service(config, jobs=LiveJobs(config))
        scheduler = BackgroundScheduler(timezone=config.timezone)
        service.add_jobs(scheduler)
        scheduler.start(paused=True)
        for job in scheduler.get_jobs():
            print(
                f"{job.id}: next run {job.next_run_time.isoformat(timespec='minutes') if job.next_run_time else 'never'}"
            )
        if service.first_report_pending:
            print(f"report: no report in {service.reports_dir} yet: the first one right after the first plan")
        scheduler.shutdown(wait=False)
        return 0
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s", signal.Signals(signum).name)
        stop.set()

    quiet_job_failures()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return serve(config, stop=stop)
