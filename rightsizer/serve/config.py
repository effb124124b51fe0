"""``serve --config FILE``: the YAML schedule, parsed once into frozen settings; one-line errors.

Example (``examples/rightsizer-serve.yaml``)::

    prometheus_url: http://prometheus.monitoring:9090
    # optional, as the plan/report flags of the same names: prometheus_tenant, prometheus_tenant_header,
    # prometheus_username + prometheus_password_file, prometheus_bearer_token_file, prometheus_ca_file,
    # prometheus_cert_file, prometheus_key_file
    timezone: Europe/Berlin          # required: every time below is in this zone
    listen: 0.0.0.0:9500             # /health and /metrics
    state_dir: /var/lib/gpupilot     # plans, reports, the auto-apply ledger
    report: {schedule: "mon 06:00", window: 7d, price_per_gpu_hour: 2.5,
             retention: {count: 26, max_age: 365d},   # dated report folders kept
             push: {webhook_url_file: /etc/gpupilot-report-webhook/url, format: slack,
                    link: https://gpu-reports.example/report/, copy_to: /mnt/report-archive}}
    # report.hpa_recommendations: [/var/lib/gpupilot/hpa]   # recommend-hpa -o json answers (files or folders)
    plan: {every: 6h, window: 7d}   # also max_nodes, headroom (0.2), idle_threshold (0.05), min_busy (15m)
    auto_apply:
      enabled: false
      maintenance_window: {days: [sat, sun], start: "01:00", end: "05:00"}
      max_nodes_per_day: 2
      min_gpus_freed: 1
      operator_namespace: gpu-operator     # nvidia-gpu-operator on OpenShift
      repoint_cluster_policy: false        # as apply --repoint-cluster-policy (default operator install)
      configmap_sync: 60s                  # as apply --configmap-sync
      lease_duration: 60s                  # the apply Lease, as apply --lease-duration
      leader_election: {namespace: gpupilot, lease_duration: 15s}   # optional: several replicas
      paused: false                        # the emergency stop, kept in the config
      stop_signal: {namespace: gpupilot, configmap: gpupilot-rightsizer}   # annotations read for it
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import time as dtime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpupilot_common import checked, promauth
from gpupilot_common.paths import file_problem, name_problem
from gpupilot_common.section import Section
from gpupilot_common.urls import redact
from rightsizer.errors import InputError
from rightsizer.optimise.proposal import OptimiserSettings
from rightsizer.plan.settings import PlanSettings
from rightsizer.serve.push import FORMATS, ReportPush
from rightsizer.serve.retention import Retention

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_SCHEDULE = re.compile(r"^(?P<days>[a-z,\-*]+)\s+(?P<h>\d{1,2}):(?P<m>\d{2})$")


class ServeConfigError(InputError, ValueError):
    """One line: file, field, what is wrong and what would be right."""


@dataclass(frozen=True)
class Weekly:
    """A cron schedule: ``day_of_week`` in APScheduler's syntax (``mon``, ``mon-fri``, ``*``) at hour:minute."""

    day_of_week: str
    hour: int
    minute: int


@dataclass(frozen=True)
class ReportJob:
    schedule: Weekly
    window_s: float = 7 * 86400.0
    price_per_gpu_hour: float | None = None
    out_dir: Path | None = None
    """Where reports go (one dated folder each); default ``<state_dir>/reports``."""
    retention: Retention = field(default_factory=Retention)
    """Dated report folders kept after each report (default: all)."""
    push: ReportPush | None = None
    """Where each new report is announced or copied (:mod:`rightsizer.serve.push`); None: nowhere."""
    hpa_recommendations: tuple[Path, ...] = ()
    """recommend-hpa answers (files, or folders of ``*.json``) for the report's autoscaling section,
    read at each report (a CronJob or a pipeline refreshes them)."""


@dataclass(frozen=True)
class PlanJob:
    every_s: float = 6 * 3600.0
    window_s: float = 7 * 86400.0
    max_nodes: int | None = None
    headroom: float = 0.2
    idle_threshold: float = 0.05
    min_busy_s: float = 900.0

    def plan_settings(self, *, window_s: float | None = None) -> PlanSettings:
        """The settings ``plan`` would get from the same flags (``window_s`` overrides the window)."""
        return PlanSettings(
            window_s=self.window_s if window_s is None else window_s,
            headroom=self.headroom,
            idle_threshold=self.idle_threshold,
            min_busy_s=self.min_busy_s,
            optimiser=OptimiserSettings(max_nodes=self.max_nodes),
        )


@dataclass(frozen=True)
class MaintenanceWindow:
    days: tuple[str, ...]
    start: dtime
    end: dtime
    """May be before ``start``: the window then runs past midnight into the next day."""


@dataclass(frozen=True)
class AutoApply:
    enabled: bool = False
    window: MaintenanceWindow | None = None
    max_nodes_per_day: int = 1
    min_gpus_freed: int = 1
    """Apply only when the plan frees at least this many GPUs in total."""
    check_every_s: float = 900.0
    kubeconfig: Path | None = None
    max_parallel: int = 1
    max_plan_age_s: float = 12 * 3600.0
    """Never apply a plan older than this (the fleet has moved on)."""
    operator_namespace: str = "gpu-operator"
    """Namespace of the NVIDIA GPU Operator (``nvidia-gpu-operator`` when installed from OperatorHub)."""
    mig_configmap: str | None = None
    """The mig-parted ConfigMap to write (its Role names it); default as ``apply --configmap``."""
    repoint_cluster_policy: bool = False
    """As ``apply --repoint-cluster-policy``: point the ClusterPolicy's MIG Manager at the ConfigMap
    apply writes when it points at the operator's ``default-mig-parted-config`` (a default install)."""
    configmap_sync_s: float = 60.0
    """After changing the mig-parted ConfigMap, wait this long before relabelling (kubelet delay)."""
    lease_duration_s: int = 60
    """The apply Lease (one apply at a time) expires this long after its holder stopped renewing."""
    leader_election: LeaderElection | None = None
    """Several replicas: only the one holding the Lease reports and applies; the ledger lives in a
    ConfigMap of this namespace. None: one replica, ledger in ``state_dir``."""
    paused: bool = False
    """The emergency stop, in the config: no node is started; one in flight stops at its next safe
    step (the next unpaused run resumes it from the ledger and the node's recorded step)."""
    stop_signal: StopSignalSource | None = None
    """A ConfigMap whose annotations pause auto-apply at once (``gpupilot.io/auto-apply: paused``)
    or ask it to stop for a ``helm upgrade`` that switches it off (``gpupilot.io/auto-apply-drain``)."""


@dataclass(frozen=True)
class StopSignalSource:
    namespace: str
    configmap: str


@dataclass(frozen=True)
class LeaderElection:
    namespace: str
    lease_duration_s: float = 15.0


@dataclass(frozen=True)
class ServeConfig:
    source: str
    prometheus_url: str
    timezone: ZoneInfo
    listen_host: str
    listen_port: int
    state_dir: Path
    report: ReportJob | None
    plan: PlanJob | None
    auto_apply: AutoApply = field(default_factory=AutoApply)
    prometheus_auth: promauth.PrometheusAuth = field(default_factory=promauth.PrometheusAuth)
    """Tenant, credentials and TLS for ``prometheus_url``, as ``plan``'s flags."""


_AUTH_FIELDS = (
    "prometheus_tenant",
    "prometheus_tenant_header",
    "prometheus_username",
    "prometheus_password_file",
    "prometheus_bearer_token_file",
    "prometheus_ca_file",
    "prometheus_cert_file",
    "prometheus_key_file",
)
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_AUTO_APPLY_FIELDS = (
    "enabled",
    "maintenance_window",
    "max_nodes_per_day",
    "min_gpus_freed",
    "check_every",
    "kubeconfig",
    "max_parallel",
    "max_plan_age",
    "operator_namespace",
    "mig_configmap",
    "repoint_cluster_policy",
    "configmap_sync",
    "lease_duration",
    "leader_election",
    "paused",
    "stop_signal",
)


def _k8s_name(r: Section, key: str, default: str | None) -> str | None:
    value = r.raw(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or not _K8S_NAME.fullmatch(value):
        raise r.fail(key, f"must be a Kubernetes name (lower-case letters, digits, '-'), got {value!r}")
    return value


def _namespace(r: Section, key: str) -> str:
    """A namespace name: an RFC 1123 DNS label (what the Kubernetes API accepts in a URL path)."""
    value = r.text(key)
    if not _K8S_NAME.fullmatch(value):
        shown = value if len(value) <= 70 else f"{value[:67]}..."
        raise r.fail(
            key,
            f"{shown!r} is not a namespace name: an RFC 1123 DNS label of at most 63 lower-case "
            "letters, digits and '-', starting and ending with a letter or digit",
        )
    return value


def _schedule(r: Section, key: str) -> Weekly:
    text = r.text(key).strip().lower()
    m = _SCHEDULE.match(text)
    hour, minute = (int(m.group("h")), int(m.group("m"))) if m else (99, 99)
    days = m.group("days") if m else ""
    ok_days = days == "*" or all(d in DAYS for part in days.split(",") for d in part.split("-"))
    if not m or not ok_days or hour > 23 or minute > 59:
        raise r.fail(key, f"{text!r} is not a schedule like 'mon 06:00', 'mon-fri 07:30' or '* 02:00'")
    return Weekly(days, hour, minute)


def _clock(r: Section, key: str) -> dtime:
    text = r.text(key)
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", text.strip())
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise r.fail(key, f"{text!r} is not a time of day like '01:30'")
    return dtime(int(m.group(1)), int(m.group(2)))


def _listen(r: Section) -> tuple[str, int]:
    text = str(r.raw("listen", "0.0.0.0:9500"))
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise r.fail("listen", f"{text!r} is not HOST:PORT like 0.0.0.0:9500")
    return host or "0.0.0.0", int(port)  # noqa: S104 - a service port, configurable


def _timezone(r: Section) -> ZoneInfo:
    tz_name = r.text("timezone") if "timezone" in r else ""
    if not tz_name:
        raise r.fail(
            "timezone", "required, an IANA zone such as Europe/Berlin or UTC (schedules are local times)"
        )
    try:
        return ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a file name
        shown = tz_name if len(tz_name) <= 60 else f"{tz_name[:57]}..."
        raise r.fail("timezone", f"{shown!r} is not an IANA time zone (e.g. Europe/Berlin, UTC)") from None


def _report(rr: Section) -> ReportJob:
    rr.keys(
        ("schedule", "window", "price_per_gpu_hour", "out_dir", "retention", "push", "hpa_recommendations")
    )
    price = rr.number("price_per_gpu_hour", None)
    out = rr.optional_text("out_dir")
    keep = Retention()
    if (kr := rr.section("retention")) is not None:
        kr.keys(("count", "max_age"))
        max_age = None
        if kr.raw("max_age") not in (None, ""):
            max_age = kr.duration("max_age", 0.0)
            if max_age < 86400:
                raise kr.fail("max_age", "must be at least 1d (report folders are dated by day)")
        keep = Retention(count=kr.integer("count", None, minimum=1), max_age_s=max_age)
    hpas = []
    for i, item in enumerate(rr.sequence("hpa_recommendations")):
        if not isinstance(item, str) or not item:
            raise rr.doc.fail((*rr.path, "hpa_recommendations", i), "must be a file or folder path")
        if problem := name_problem(Path(item)):
            raise rr.doc.fail(
                (*rr.path, "hpa_recommendations", i), f"{item!r} {problem}; give a path without it"
            )
        hpas.append(Path(item))
    return ReportJob(
        _schedule(rr, "schedule"),
        rr.duration("window", 7 * 86400.0),
        price,
        _directory(rr, "out_dir", out) if out else None,
        keep,
        _push(pr) if (pr := rr.section("push")) is not None else None,
        tuple(hpas),
    )


def _push(pr: Section) -> ReportPush:
    pr.keys(("webhook_url_file", "format", "link", "copy_to", "timeout"))
    url_file = pr.optional_text("webhook_url_file")
    if url_file is not None and (problem := file_problem(Path(url_file))):
        raise pr.fail("webhook_url_file", f"{problem} (mount the Secret holding the URL)")
    fmt = pr.text("format", "slack")
    if fmt not in FORMATS:
        raise pr.fail("format", f"{fmt!r}: one of {', '.join(FORMATS)}")
    link = pr.optional_text("link") or ""
    if link and not re.match(r"^https?://\S+$", link):
        raise pr.fail("link", f"{link[:60]!r} is not an http(s) URL")
    copy_to = pr.optional_text("copy_to")
    if copy_to is not None and not Path(copy_to).is_absolute():
        raise pr.fail("copy_to", f"{copy_to!r}: an absolute path (a mounted volume)")
    if url_file is None and copy_to is None:
        raise pr.fail("webhook_url_file", "report.push needs webhook_url_file and/or copy_to")
    timeout = pr.duration("timeout", 10.0)
    if not 1 <= timeout <= 120:
        raise pr.fail("timeout", "must be between 1s and 2m")
    return ReportPush(
        webhook_url_file=Path(url_file) if url_file else None,
        format=fmt,
        link=link,
        copy_to=Path(copy_to) if copy_to else None,
        timeout_s=timeout,
    )


def _directory(r: Section, key: str, text: str) -> Path:
    """A directory name as given, refused in one line when no file system can hold it (a NUL)."""
    path = Path(text)
    if problem := name_problem(path):
        raise r.fail(key, f"{text!r} {problem}; give a directory name without it")
    return path


def _fraction(r: Section, key: str, default: float, *, maximum: float) -> float:
    value = r.number(key, default, maximum=maximum)
    return default if value is None else value


def _plan(pr: Section) -> PlanJob:
    pr.keys(("every", "window", "max_nodes", "headroom", "idle_threshold", "min_busy"))
    every = pr.duration("every", 6 * 3600.0, minimum=60)
    min_busy = pr.duration("min_busy", 900.0)
    if not 300 <= min_busy <= 6 * 3600:
        raise pr.fail("min_busy", "must be between 5m and 6h")
    return PlanJob(
        every,
        pr.duration("window", 7 * 86400.0),
        pr.integer("max_nodes", None, minimum=1),
        headroom=_fraction(pr, "headroom", 0.2, maximum=4.0),
        idle_threshold=_fraction(pr, "idle_threshold", 0.05, maximum=1.0),
        min_busy_s=min_busy,
    )


def _window(wr: Section) -> MaintenanceWindow:
    wr.keys(("days", "start", "end"))
    days = wr.raw("days", list(DAYS))
    if not isinstance(days, list) or not days or any(str(d).lower() not in DAYS for d in days):
        raise wr.fail("days", f"must be a list of {', '.join(DAYS)}")
    return MaintenanceWindow(tuple(str(d).lower() for d in days), _clock(wr, "start"), _clock(wr, "end"))


def _auto_apply(ar: Section, *, has_plan: bool) -> AutoApply:
    ar.keys(_AUTO_APPLY_FIELDS)
    enabled = ar.boolean("enabled", False)
    wr = ar.section("maintenance_window")
    window = _window(wr) if wr is not None else None
    if enabled and window is None:
        raise ar.fail("maintenance_window", "required when auto_apply.enabled is true (days, start, end)")
    if enabled and not has_plan:
        raise ar.fail("enabled", "auto_apply needs a 'plan' job to produce plans")
    kc = ar.optional_text("kubeconfig")
    election = None
    if (lr := ar.section("leader_election")) is not None:
        lr.keys(("namespace", "lease_duration"))
        duration = lr.duration("lease_duration", 15.0)
        if not 3 <= duration <= 600:
            raise lr.fail("lease_duration", "must be between 3s and 10m")
        election = LeaderElection(_namespace(lr, "namespace"), duration)
    signal = None
    if (sr := ar.section("stop_signal")) is not None:
        sr.keys(("namespace", "configmap"))
        signal = StopSignalSource(_namespace(sr, "namespace"), _k8s_name(sr, "configmap", None) or "")
        if not signal.configmap:
            raise sr.fail("configmap", "required: the ConfigMap whose annotations stop auto-apply")
    return AutoApply(
        enabled=enabled,
        window=window,
        max_nodes_per_day=ar.integer("max_nodes_per_day", 1, minimum=1) or 1,
        min_gpus_freed=ar.integer("min_gpus_freed", 1, minimum=0) or 0,
        check_every_s=ar.duration("check_every", 900.0),
        kubeconfig=Path(kc) if kc else None,
        max_parallel=ar.integer("max_parallel", 1, minimum=1) or 1,
        max_plan_age_s=ar.duration("max_plan_age", 12 * 3600.0),
        operator_namespace=_k8s_name(ar, "operator_namespace", "gpu-operator") or "gpu-operator",
        mig_configmap=_k8s_name(ar, "mig_configmap", None),
        repoint_cluster_policy=ar.boolean("repoint_cluster_policy", False),
        configmap_sync_s=_seconds(ar, "configmap_sync", 60.0, maximum=3600.0),
        lease_duration_s=int(_seconds(ar, "lease_duration", 60.0, minimum=1.0, maximum=3600.0)),
        leader_election=election,
        paused=ar.boolean("paused", False),
        stop_signal=signal,
    )


def _seconds(r: Section, key: str, default: float, *, minimum: float = 0.0, maximum: float) -> float:
    """A duration from ``minimum`` to ``maximum``; ``0``/``0s`` allowed when ``minimum`` is 0."""
    if minimum == 0 and r.raw(key) in (0, "0", "0s"):
        return 0.0
    value = r.duration(key, default)
    if not minimum <= value <= maximum:
        raise r.fail(key, f"must be between {minimum:g}s and {maximum:g}s, got {value:g}s")
    return value


def parse(data: Any, *, source: str) -> ServeConfig:
    """Check ``data`` (a parsed document; no line numbers in its messages)."""
    return parse_document(checked.Document(data, source=source, error=ServeConfigError))


def parse_document(doc: checked.Document) -> ServeConfig:
    r = doc.root()
    r.keys(
        ("prometheus_url", *_AUTH_FIELDS, "timezone", "listen", "state_dir", "report", "plan", "auto_apply")
    )
    url = r.text("prometheus_url")
    if not re.match(r"^https?://", url):
        raise r.fail("prometheus_url", f"{redact(url)!r} must start with http:// or https://")
    tz = _timezone(r)
    host, port = _listen(r)
    rr, pr, ar = r.section("report"), r.section("plan"), r.section("auto_apply")
    report = _report(rr) if rr is not None else None
    plan = _plan(pr) if pr is not None else None
    auto = _auto_apply(ar, has_plan=plan is not None) if ar is not None else AutoApply()
    if report is None and plan is None:
        raise r.fail("report", "configure at least one job: 'report' and/or 'plan'")
    state = _directory(r, "state_dir", r.text("state_dir", "/var/lib/gpupilot"))
    auth = _prometheus_auth(r)
    return ServeConfig(doc.source, url, tz, host, port, state, report, plan, auto, auth)


def _prometheus_auth(r: Section) -> promauth.PrometheusAuth:
    """The ``prometheus_*`` credential fields; files must exist now, and are read at start."""

    def file(key: str) -> Path | None:
        text = r.optional_text(key)
        if text is None:
            return None
        if problem := file_problem(Path(text)):
            raise r.fail(key, f"{text!r}: {problem}")
        return Path(text)

    auth = promauth.PrometheusAuth(
        tenant=r.optional_text("prometheus_tenant") or "",
        tenant_header=r.optional_text("prometheus_tenant_header") or promauth.DEFAULT_TENANT_HEADER,
        username=r.optional_text("prometheus_username") or "",
        password_file=file("prometheus_password_file"),
        bearer_token_file=file("prometheus_bearer_token_file"),
        ca_file=file("prometheus_ca_file"),
        cert_file=file("prometheus_cert_file"),
        key_file=file("prometheus_key_file"),
    )
    try:
        auth.check(field="prometheus_")
    except promauth.CredentialError as exc:
        key = str(exc).split(" ", 1)[0].rstrip(":")
        raise r.fail(
            key if key in _AUTH_FIELDS else "prometheus_url", str(exc).removeprefix(key).lstrip(": ")
        ) from None
    return auth


def load(path: Path) -> ServeConfig:
    """Read and check a serve config file; errors are ``file:line: field: problem``."""
    return parse_document(checked.load_yaml(path, error=ServeConfigError, what="serve config"))
