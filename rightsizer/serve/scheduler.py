"""``serve``: APScheduler jobs (weekly report, periodic plan, guarded auto-apply), ``/health`` and
``/metrics``.

Jobs coalesce missed runs (one run after downtime, not a burst), run one instance at a time, and never
raise into the scheduler: outcomes go to the service's metrics and log. The clock and the work each
job does are injected (:class:`Jobs`), so tests drive the real APScheduler triggers on a fake clock.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from rightsizer.apply.applier import ApplyReport
from rightsizer.errors import RightsizerError
from rightsizer.plan import idle
from rightsizer.plan.model import Plan
from rightsizer.serve.config import DAYS, AutoApply, MaintenanceWindow, PlanJob, ReportJob, ServeConfig
from rightsizer.serve.ledger import FileLedger, Ledger

log = logging.getLogger(__name__)


class Jobs(Protocol):
    """The work behind each job (Prometheus, the plan pipeline, the report writer, the Kubernetes API)."""

    def make_plan(self, *, end: float, job: PlanJob) -> Plan: ...

    def write_report(self, *, end: float, job: ReportJob, plan: Plan | None, out_dir: Path) -> Path: ...

    def apply(self, plan: Plan, *, settings: AutoApply) -> ApplyReport: ...


def idle_slices(plan: Plan) -> int:
    """Devices idle by the plan's rule (:mod:`rightsizer.plan.idle`, the report uses the same)."""
    return len(idle.idle_devices(plan))


def in_window(now: datetime, window: MaintenanceWindow) -> bool:
    """``now`` (local time) inside the window; a window whose end is before its start runs past midnight."""
    day = DAYS[now.weekday()]
    previous = DAYS[(now.weekday() - 1) % 7]
    t = now.time().replace(tzinfo=None)
    if window.start <= window.end:
        return day in window.days and window.start <= t < window.end
    return (day in window.days and t >= window.start) or (previous in window.days and t < window.end)


@dataclasses.dataclass
class State:
    last_plan_at: float | None = None
    last_plan_ok: bool | None = None
    last_report_at: float | None = None
    plan: Plan | None = None
    plan_made_at: float = 0.0
    applies: Counter[str] = dataclasses.field(default_factory=Counter)
    runs: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)
    last_skip: str = ""


class Service(Collector):
    def __init__(
        self,
        config: ServeConfig,
        *,
        jobs: Jobs,
        clock: Callable[[], datetime] | None = None,
        ledger: Ledger | None = None,
        leader: Callable[[], bool] | None = None,
    ) -> None:
        """``ledger``: where auto-apply records its work (default: a file in ``state_dir``);
        ``leader``: whether this replica leads now (None: a single replica, always)."""
        self.config = config
        self.jobs = jobs
        self.clock = clock or (lambda: datetime.now(UTC))
        self.state = State()
        self._lock = threading.Lock()
        self.ledger_path = config.state_dir / "auto-apply-ledger.json"
        self.ledger: Ledger = ledger or FileLedger(self.ledger_path)
        self.leader = leader

    def _standby(self, job: str) -> bool:
        if self.leader is None or self.leader():
            return False
        with self._lock:
            self.state.runs[(job, "standby")] += 1
        log.info("%s: not the leader; the leading replica runs it", job)
        return True

    # -- the jobs -------------------------------------------------------------------------------
    def run_plan(self) -> None:
        job = self.config.plan
        if job is None:
            return
        now = self.clock().timestamp()
        try:
            plan = self.jobs.make_plan(end=now, job=job)
        except Exception as exc:  # a job must not die: record and try again next time
            log.error("plan job failed: %s", exc)
            with self._lock:
                self.state.last_plan_at, self.state.last_plan_ok = now, False
                self.state.runs[("plan", "error")] += 1
            return
        self.config.state_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self.state.last_plan_at, self.state.last_plan_ok = now, True
            self.state.plan, self.state.plan_made_at = plan, now
            self.state.runs[("plan", "ok")] += 1
        log.info(
            "plan %s: %d node(s) to change, %d GPU(s) freeable",
            plan.plan_id,
            len(plan.changed_nodes),
            plan.totals.gpus_freed,
        )

    def run_report(self) -> None:
        job = self.config.report
        if job is None or self._standby("report"):
            return
        now = self.clock()
        out = (job.out_dir or self.config.state_dir / "reports") / now.astimezone(
            self.config.timezone
        ).strftime("%Y-%m-%d")
        try:
            path = self.jobs.write_report(end=now.timestamp(), job=job, plan=self.state.plan, out_dir=out)
        except Exception as exc:
            log.error("report job failed: %s", exc)
            with self._lock:
                self.state.runs[("report", "error")] += 1
            return
        with self._lock:
            self.state.last_report_at = now.timestamp()
            self.state.runs[("report", "ok")] += 1
        log.info("weekly report written to %s", path)

    def _skip(self, reason: str) -> None:
        with self._lock:
            self.state.last_skip = reason
            self.state.runs[("auto_apply", "skipped")] += 1
        log.info("auto-apply skipped: %s", reason)

    def run_auto_apply(self) -> None:
        guard = self.config.auto_apply
        if not guard.enabled or guard.window is None or self._standby("auto_apply"):
            return
        now = self.clock().astimezone(self.config.timezone)
        plan = self.state.plan
        refusal = self._refusal(now, guard)
        if refusal is not None or plan is None:
            return self._skip(refusal or "no plan yet")
        try:
            ledger = self.ledger.load()
        except RightsizerError as exc:
            return self._skip(f"cannot read the auto-apply ledger: {exc}")
        today = now.date().isoformat()
        done_today = ledger.get(today, [])
        tried_key, started_key = f"plan:{plan.plan_id}", f"started:{plan.plan_id}"
        tried = set(ledger.get(tried_key, []))
        started = set(ledger.get(started_key, [])) - tried
        budget = guard.max_nodes_per_day - len(done_today)
        order = sorted(plan.changed_nodes, key=lambda n: (-n.gpus_freed, n.name))
        # nodes a previous leader handed to an apply that never reported: resumed first (the node
        # annotations make apply continue, not repeat); they were counted in that round's budget
        resume = [n.name for n in order if n.name in started]
        fresh = [n.name for n in order if n.name not in tried and n.name not in started]
        chosen = set(resume) | set(fresh[: max(0, budget - len(resume))])
        if not chosen:
            if budget <= 0:
                return self._skip(f"max_nodes_per_day={guard.max_nodes_per_day} reached")
            return self._skip(f"every node of plan {plan.plan_id} was already tried")
        ledger[started_key] = sorted(started | chosen)
        try:
            self.ledger.save(ledger)  # before the apply: a successor knows what was handed over
        except RightsizerError as exc:
            return self._skip(f"cannot write the auto-apply ledger: {exc}")
        subset = dataclasses.replace(
            plan,
            nodes=tuple(n if n.name in chosen else dataclasses.replace(n, changed=False) for n in plan.nodes),
        )
        try:
            result = self.jobs.apply(subset, settings=guard)
        except Exception as exc:
            log.error("auto-apply failed before touching nodes: %s", exc)
            with self._lock:
                self.state.applies["error"] += 1
            return None
        with self._lock:
            for o in result.outcomes:
                self.state.applies[o.result] += 1
            self.state.runs[("auto_apply", "ok" if result.ok else "failed")] += 1
        reported = {o.node for o in result.outcomes}
        ledger[today] = [*done_today, *(o.node for o in result.applied if o.node not in done_today)]
        ledger[tried_key] = sorted(tried | reported)
        left = sorted((started | chosen) - reported)
        if left:
            ledger[started_key] = left
        else:
            ledger.pop(started_key, None)
        try:
            self.ledger.save(ledger)
        except RightsizerError as exc:
            log.error("could not record the auto-apply results in the ledger: %s", exc)
        return None

    def _refusal(self, now: datetime, guard: AutoApply) -> str | None:
        """Why the guard refuses to apply the current plan now (None: it may)."""
        assert guard.window is not None
        if not in_window(now, guard.window):
            return "outside the maintenance window"
        plan, made = self.state.plan, self.state.plan_made_at
        if plan is None:
            return "no plan yet"
        if now.timestamp() - made > guard.max_plan_age_s:
            return f"plan {plan.plan_id} is older than {guard.max_plan_age_s / 3600:g}h"
        if plan.multi_cluster:
            return f"plan {plan.plan_id} covers {len(plan.cluster_names)} clusters; auto-apply acts on one cluster"
        if plan.totals.gpus_freed < guard.min_gpus_freed:
            return f"plan frees {plan.totals.gpus_freed} GPU(s), below min_gpus_freed={guard.min_gpus_freed}"
        return None

    # -- scheduling -------------------------------------------------------------------------------
    def add_jobs(self, scheduler: Any) -> None:
        """Add the configured jobs to an APScheduler 3 scheduler (not yet started)."""
        tz = self.config.timezone
        now = self.clock().astimezone(tz)
        defaults: dict[str, Any] = {"coalesce": True, "max_instances": 1, "replace_existing": True}
        if (rj := self.config.report) is not None:
            trigger = CronTrigger(
                day_of_week=rj.schedule.day_of_week,
                hour=rj.schedule.hour,
                minute=rj.schedule.minute,
                timezone=tz,
            )
            scheduler.add_job(
                self.run_report,
                trigger,
                id="report",
                name="weekly report",
                misfire_grace_time=6 * 3600,
                **defaults,
            )
        if (pj := self.config.plan) is not None:
            trigger = IntervalTrigger(seconds=pj.every_s, start_date=now, timezone=tz)
            grace = int(max(60, pj.every_s / 2))
            scheduler.add_job(
                self.run_plan,
                trigger,
                id="plan",
                name="plan",
                next_run_time=now,
                misfire_grace_time=grace,
                **defaults,
            )
        if self.config.auto_apply.enabled:
            every = self.config.auto_apply.check_every_s
            trigger = IntervalTrigger(seconds=every, start_date=now + timedelta(seconds=every), timezone=tz)
            scheduler.add_job(
                self.run_auto_apply,
                trigger,
                id="auto_apply",
                name="guarded auto-apply",
                misfire_grace_time=int(every),
                **defaults,
            )

    # -- /metrics and /health ---------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        with self._lock:
            s = self.state
            plan = s.plan
            ts = GaugeMetricFamily(
                "gpupilot_rightsizer_last_plan_timestamp_seconds",
                "Unix time of the last plan attempt (0: none yet).",
            )
            ts.add_metric([], s.last_plan_at or 0.0)
            yield ts
            if s.last_plan_ok is not None:
                ok = GaugeMetricFamily(
                    "gpupilot_rightsizer_last_plan_success", "1 if the last plan attempt succeeded, else 0."
                )
                ok.add_metric([], 1.0 if s.last_plan_ok else 0.0)
                yield ok
            if plan is not None:
                idle_gauge = GaugeMetricFamily(
                    "gpupilot_rightsizer_idle_slices",
                    "MIG slices and whole GPUs whose busiest min_busy rolling mean (15 min by default) stayed "
                    "below the idle threshold in the latest plan's window: a slice with a daily burst is not "
                    "idle (cached from the last successful plan; see last_plan_timestamp_seconds).",
                )
                idle_gauge.add_metric([], float(idle_slices(plan)))
                yield idle_gauge
                freeable = GaugeMetricFamily(
                    "gpupilot_rightsizer_freeable_gpus",
                    "Whole GPUs the latest plan frees (cached from the last successful plan).",
                )
                freeable.add_metric([], float(plan.totals.gpus_freed))
                yield freeable
            applies = CounterMetricFamily(
                "gpupilot_rightsizer_applies",
                "Node applies by the guarded auto-apply, by result.",
                labels=["result"],
            )
            for result in (
                "applied",
                "already-applied",
                "skipped",
                "failed",
                "rolled-back",
                "rollback-failed",
                "not-started",
                "error",
            ):
                applies.add_metric([result], float(s.applies.get(result, 0)))
            yield applies
            runs = CounterMetricFamily(
                "gpupilot_rightsizer_job_runs",
                "Scheduled job runs by job and result.",
                labels=["job", "result"],
            )
            for (job, result), count in sorted(s.runs.items()):
                runs.add_metric([job, result], float(count))
            yield runs
            if s.last_report_at is not None:
                rep = GaugeMetricFamily(
                    "gpupilot_rightsizer_last_report_timestamp_seconds",
                    "Unix time of the last weekly report.",
                )
                rep.add_metric([], s.last_report_at)
                yield rep

    def registry(self) -> CollectorRegistry:
        reg = CollectorRegistry()
        reg.register(self)
        return reg

    def health(self, scheduler: Any) -> dict[str, Any]:
        jobs = []
        for job in scheduler.get_jobs():
            nxt = getattr(job, "next_run_time", None)
            jobs.append({"id": job.id, "next_run": nxt.isoformat() if nxt else None})
        with self._lock:
            return {
                "status": "ok",
                "jobs": jobs,
                "last_plan_success": self.state.last_plan_ok,
                "last_auto_apply_skip": self.state.last_skip,
            }
