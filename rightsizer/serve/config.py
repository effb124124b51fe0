"""``serve --config FILE``: the YAML schedule, parsed once into frozen settings; one-line errors.

Example (``examples/rightsizer-serve.yaml``)::

    prometheus_url: http://prometheus.monitoring:9090
    timezone: Europe/Berlin          # required: every time below is in this zone
    listen: 0.0.0.0:9500             # /health and /metrics
    state_dir: /var/lib/gpupilot     # plans, reports, the auto-apply ledger
    report: {schedule: "mon 06:00", window: 7d, price_per_gpu_hour: 2.5}
    plan: {every: 6h, window: 7d}   # also max_nodes, headroom (0.2), idle_threshold (0.05), min_busy (15m)
    auto_apply:
      enabled: false
      maintenance_window: {days: [sat, sun], start: "01:00", end: "05:00"}
      max_nodes_per_day: 2
      min_gpus_freed: 1
      operator_namespace: gpu-operator     # nvidia-gpu-operator on OpenShift
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import time as dtime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from gpupilot_common.timefmt import parse_duration
from rightsizer.errors import InputError
from rightsizer.optimise.proposal import OptimiserSettings
from rightsizer.plan.pipeline import PlanSettings

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


_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _k8s_name(r: _R, key: str, default: str | None) -> str | None:
    value = r.data.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or not _K8S_NAME.match(value):
        raise r.fail(key, f"must be a Kubernetes name (lower-case letters, digits, '-'), got {value!r}")
    return value


class _R:
    def __init__(self, source: str, data: Any, where: str) -> None:
        if not isinstance(data, dict):
            raise ServeConfigError(f"{source}: {where or 'the file'} must be a mapping")
        self.source, self.data, self.where = source, data, where

    def _p(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def fail(self, key: str, what: str) -> ServeConfigError:
        return ServeConfigError(f"{self.source}: {self._p(key)}: {what}")

    def check_keys(self, allowed: tuple[str, ...]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.fail(str(key), f"unknown field (known: {', '.join(allowed)})")

    def s(self, key: str, default: str | None = None) -> str:
        v = self.data.get(key, default)
        if not isinstance(v, str) or not v:
            raise self.fail(
                key, "required, a non-empty string" if v is None else f"must be a string, got {v!r}"
            )
        return v

    def duration(self, key: str, default: float) -> float:
        v = self.data.get(key)
        if v is None:
            return default
        try:
            return parse_duration(str(v))
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None

    def integer(self, key: str, default: int | None, minimum: int = 0) -> int | None:
        v = self.data.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.fail(key, f"must be a whole number >= {minimum}, got {v!r}")
        return v

    def number(self, key: str, default: float, lo: float, hi: float) -> float:
        v = self.data.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= float(v) <= hi:
            raise self.fail(key, f"must be a number from {lo:g} to {hi:g}, got {v!r}")
        return float(v)

    def sub(self, key: str) -> _R | None:
        v = self.data.get(key)
        return None if v is None else _R(self.source, v, self._p(key))


def _schedule(r: _R, key: str) -> Weekly:
    text = r.s(key).strip().lower()
    m = _SCHEDULE.match(text)
    hour, minute = (int(m.group("h")), int(m.group("m"))) if m else (99, 99)
    days = m.group("days") if m else ""
    ok_days = days == "*" or all(d in DAYS for part in days.split(",") for d in part.split("-"))
    if not m or not ok_days or hour > 23 or minute > 59:
        raise r.fail(key, f"{text!r} is not a schedule like 'mon 06:00', 'mon-fri 07:30' or '* 02:00'")
    return Weekly(days, hour, minute)


def _clock(r: _R, key: str) -> dtime:
    text = r.s(key)
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", text.strip())
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise r.fail(key, f"{text!r} is not a time of day like '01:30'")
    return dtime(int(m.group(1)), int(m.group(2)))


def _listen(r: _R) -> tuple[str, int]:
    text = str(r.data.get("listen", "0.0.0.0:9500"))
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise r.fail("listen", f"{text!r} is not HOST:PORT like 0.0.0.0:9500")
    return host or "0.0.0.0", int(port)  # noqa: S104 - a service port, configurable


def parse(data: Any, *, source: str) -> ServeConfig:
    r = _R(source, data, "")
    r.check_keys(("prometheus_url", "timezone", "listen", "state_dir", "report", "plan", "auto_apply"))
    url = r.s("prometheus_url")
    if not re.match(r"^https?://", url):
        raise r.fail("prometheus_url", f"{url!r} must start with http:// or https://")
    tz_name = r.s("timezone") if "timezone" in r.data else ""
    if not tz_name:
        raise r.fail(
            "timezone", "required, an IANA zone such as Europe/Berlin or UTC (schedules are local times)"
        )
    try:
        tz = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise r.fail("timezone", f"{tz_name!r} is not an IANA time zone (e.g. Europe/Berlin, UTC)") from None
    host, port = _listen(r)
    report = plan = None
    if (rr := r.sub("report")) is not None:
        rr.check_keys(("schedule", "window", "price_per_gpu_hour", "out_dir"))
        price = rr.data.get("price_per_gpu_hour")
        if price is not None and (isinstance(price, bool) or not isinstance(price, int | float) or price < 0):
            raise rr.fail("price_per_gpu_hour", f"must be a number >= 0, got {price!r}")
        out = rr.data.get("out_dir")
        report = ReportJob(
            _schedule(rr, "schedule"), rr.duration("window", 7 * 86400.0), price, Path(out) if out else None
        )
    if (pr := r.sub("plan")) is not None:
        pr.check_keys(("every", "window", "max_nodes", "headroom", "idle_threshold", "min_busy"))
        every = pr.duration("every", 6 * 3600.0)
        if every < 60:
            raise pr.fail("every", "must be at least 1m")
        min_busy = pr.duration("min_busy", 900.0)
        if not 300 <= min_busy <= 6 * 3600:
            raise pr.fail("min_busy", "must be between 5m and 6h")
        plan = PlanJob(
            every,
            pr.duration("window", 7 * 86400.0),
            pr.integer("max_nodes", None, 1),
            headroom=pr.number("headroom", 0.2, 0.0, 4.0),
            idle_threshold=pr.number("idle_threshold", 0.05, 0.0, 1.0),
            min_busy_s=min_busy,
        )
    auto = AutoApply()
    if (ar := r.sub("auto_apply")) is not None:
        ar.check_keys(
            (
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
            )
        )
        enabled = ar.data.get("enabled", False)
        if not isinstance(enabled, bool):
            raise ar.fail("enabled", f"must be true or false, got {enabled!r}")
        window = None
        if (wr := ar.sub("maintenance_window")) is not None:
            wr.check_keys(("days", "start", "end"))
            days = wr.data.get("days", list(DAYS))
            if not isinstance(days, list) or not days or any(str(d).lower() not in DAYS for d in days):
                raise wr.fail("days", f"must be a list of {', '.join(DAYS)}")
            window = MaintenanceWindow(
                tuple(str(d).lower() for d in days), _clock(wr, "start"), _clock(wr, "end")
            )
        if enabled and window is None:
            raise ar.fail("maintenance_window", "required when auto_apply.enabled is true (days, start, end)")
        if enabled and plan is None:
            raise ar.fail("enabled", "auto_apply needs a 'plan' job to produce plans")
        kc = ar.data.get("kubeconfig")
        auto = AutoApply(
            enabled=enabled,
            window=window,
            max_nodes_per_day=ar.integer("max_nodes_per_day", 1, 1) or 1,
            min_gpus_freed=ar.integer("min_gpus_freed", 1, 0) or 0,
            check_every_s=ar.duration("check_every", 900.0),
            kubeconfig=Path(kc) if kc else None,
            max_parallel=ar.integer("max_parallel", 1, 1) or 1,
            max_plan_age_s=ar.duration("max_plan_age", 12 * 3600.0),
            operator_namespace=_k8s_name(ar, "operator_namespace", "gpu-operator") or "gpu-operator",
            mig_configmap=_k8s_name(ar, "mig_configmap", None),
        )
    if report is None and plan is None:
        raise r.fail("report", "configure at least one job: 'report' and/or 'plan'")
    state = Path(str(r.data.get("state_dir", "/var/lib/gpupilot")))
    return ServeConfig(source, url, tz, host, port, state, report, plan, auto)


def load(path: Path) -> ServeConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ServeConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise ServeConfigError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from exc
    return parse(data, source=str(path))
