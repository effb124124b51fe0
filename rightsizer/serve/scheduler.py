"""``serve``: APScheduler jobs (weekly report, periodic plan, guarded auto-apply), ``/health`` and
``/metrics``.

Day one: when the report folder holds no report yet (a fresh install), a first report is written
soon after start, right after the first plan (or at start without a plan job), not at the first
weekly time. With leader election, a replica that does not lead yet tries again as leadership can
change (every ``leader_election.lease_duration``) until it leads or a report exists.

Jobs coalesce missed runs (one run after downtime, not a burst) and run one instance at a time. A
job that fails is a failure (:mod:`rightsizer.serve.failures`): one log line naming the serve config's
fields, ``gpupilot_rightsizer_job_failures_total{job}``, a retry after minutes (not the next period),
``/health``; APScheduler sees it raise (its log line without a traceback), never "executed
successfully". The clock and the work each job does are injected (:class:`Jobs`), so tests drive the
real APScheduler triggers on a fake clock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from apscheduler.jobstores.base import JobLookupError
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger
from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from gpupilot_common import loops
from rightsizer.apply import protocol as proto
from rightsizer.apply.applier import ApplyReport
from rightsizer.errors import RightsizerError
from rightsizer.plan import idle
from rightsizer.plan.model import Plan
from rightsizer.serve import budget, status, webfiles
from rightsizer.serve.config import DAYS, AutoApply, MaintenanceWindow, PlanJob, ReportJob, ServeConfig
from rightsizer.serve.failures import Failures, JobFailed
from rightsizer.serve.ledger import Entries, FileLedger, Ledger, LedgerConflict
from rightsizer.serve.state import State
from rightsizer.serve.wording import in_config_terms

log = logging.getLogger(__name__)

LEDGER_TRIES = 5
FIRST_REPORT = "first_report"
"""The job id of the start-up report, ``first_report-N`` (a date job: it runs once; a replica that
does not lead adds the next try under a fresh id, as APScheduler removes a date job after its run)."""
CONFIG_BACKOFF_MAX_S = 6 * 3600.0
"""A configuration error of the auto-apply is tried again after check_every, then twice as long … up to this."""


class NodeFailed(RightsizerError):
    """An apply ended with a node failed or rolled back (later nodes of the plan were not started)."""


JOB_DEADLINES_S = {"plan": 3600.0, "report": 3600.0, "auto_apply": 6 * 3600.0}
"""How long one run of a job may take before ``/health`` says it is stuck (503). Every read of
Prometheus and of the API is bounded in time, so only a fault nobody foresaw holds a job this long: a
plan or a report of the largest fleets measured takes minutes; a guarded apply is bounded per node
(eviction, MIG Manager and settle timeouts: 32 min at their defaults) and settles a few nodes a run."""


class Jobs(Protocol):
    """The work behind each job (Prometheus, the plan pipeline, the report writer, the Kubernetes API)."""

    def make_plan(self, *, end: float, job: PlanJob) -> Plan: ...

    def write_report(self, *, end: float, job: ReportJob, plan: Plan | None, out_dir: Path) -> Path: ...

    def node_marks(self, *, settings: AutoApply) -> Sequence[proto.NodeView]:
        """The MIG nodes as the protocol sees them (in-flight steps, cordon times)."""
        ...

    def apply(
        self, plan: Plan, *, settings: AutoApply, nodes: Collection[str], stop: Callable[[], str]
    ) -> ApplyReport:
        """Settle every node in flight, then start ``nodes`` of ``plan``; ``stop``: why to stop at
        the next safe step ("" to go on)."""
        ...


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


class Service(Collector):
    def __init__(
        self,
        config: ServeConfig,
        *,
        jobs: Jobs,
        clock: Callable[[], datetime] | None = None,
        ledger: Ledger | None = None,
        leader: Callable[[], bool] | None = None,
        loop_failures: loops.LoopFailures | None = None,
        job_deadlines: dict[str, float] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``ledger``: where auto-apply records its work (default: a file in ``state_dir``);
        ``leader``: whether this replica leads now (None: a single replica, always);
        ``loop_failures``: the long-lived loops' failures (leader election, the apply Lease's
        renewals), shown in ``/metrics``; ``job_deadlines``: how long a run of each job may take
        before ``/health`` calls it stuck (default :data:`JOB_DEADLINES_S`)."""
        self.job_deadlines = {**JOB_DEADLINES_S, **(job_deadlines or {})}
        self._monotonic = monotonic
        self._started: dict[str, float] = {}
        """Job → when its run now going on started (monotonic)."""
        self.loop_failures = loop_failures or loops.LoopFailures()
        self.loop_failures.register("leader-election", "apply-lease")
        self.config = config
        self.jobs = jobs
        self.clock = clock or (lambda: datetime.now(UTC))
        self.state = State()
        self._lock = threading.Lock()
        self.ledger_path = config.state_dir / "auto-apply-ledger.json"
        self.ledger: Ledger = ledger or FileLedger(self.ledger_path)
        self.leader = leader
        self.failures = Failures()
        self._scheduler: Any = None
        self._running = threading.Condition()
        self._in_flight = 0
        self._first_report_due = False
        """Set at start when no report exists; the first plan run (or the start) schedules it."""
        self._first_report_tries = 0

    @property
    def reports_dir(self) -> Path:
        """Where the report job writes its dated folders (and ``/report/`` reads them)."""
        job = self.config.report
        return job.out_dir if job is not None and job.out_dir else self.config.state_dir / "reports"

    @property
    def first_report_pending(self) -> bool:
        """A first report will follow the first plan (none existed when the jobs were added)."""
        return self._first_report_due

    def has_report(self) -> bool:
        """A report (``report.html`` in a dated folder) exists: what ``/report/`` serves."""
        return (
            webfiles.ReportFiles(self.reports_dir, self.config.state_dir / "plan.json").latest() is not None
        )

    def _standby(self, job: str) -> bool:
        if self.leader is None or self.leader():
            return False
        with self._lock:
            self.state.runs[(job, "standby")] += 1
        log.info("%s: not the leader; the leading replica runs it", job)
        return True

    def _leading(self) -> str:
        """Why an apply of this replica must stop now ("" while it leads)."""
        if self.leader is None or self.leader():
            return ""
        return "the loss of leadership (another replica leads)"

    # -- failures ---------------------------------------------------------------------------------
    def _failed(
        self,
        job: str,
        exc: BaseException,
        *,
        period_s: float | None,
        retry: Callable[[], None] | None,
        first_s: float | None = None,
        max_s: float | None = None,
    ) -> None:
        """Count, log (once per new problem) and schedule a retry after the backoff."""
        message = in_config_terms(str(exc) or type(exc).__name__, self.config.source)
        now = self.clock()
        failure, news = self.failures.failed(
            job, message, now=now.timestamp(), period_s=period_s, first_s=first_s, max_s=max_s
        )
        with self._lock:
            self.state.runs[(job, "failed")] += 1
        when = datetime.fromtimestamp(failure.retry_at, UTC).astimezone(self.config.timezone)
        if news:
            log.error("%s job failed: %s (next try %s)", job, message, when.isoformat(timespec="seconds"))
        else:
            log.debug("%s job failed again (%d in a row): %s", job, failure.count, message)
        if retry is not None and self._scheduler is not None:
            # a fresh id each time: APScheduler removes a date job after its run, which is this one
            self._drop_retries(job)
            self._scheduler.add_job(
                retry,
                DateTrigger(run_date=when),
                id=f"{job}-retry-{failure.count}",
                name=f"{job} (retry {failure.count})",
                misfire_grace_time=None,
            )

    def _drop_retries(self, job: str) -> None:
        """Remove ``job``'s retries still to come (not the one running now: APScheduler removes it)."""
        now = self.clock()
        for pending in self._scheduler.get_jobs():
            nxt = getattr(pending, "next_run_time", None)
            if pending.id.startswith(f"{job}-retry-") and nxt is not None and nxt > now:
                with contextlib.suppress(JobLookupError):  # ran meanwhile
                    self._scheduler.remove_job(pending.id)

    def _succeeded(self, job: str) -> None:
        if (was := self.failures.succeeded(job)) is not None:
            log.info("%s job works again after %d failure(s)", job, was.count)
        if self._scheduler is not None:
            self._drop_retries(job)

    def _scheduled(self, job: str, run: Callable[[], bool]) -> Callable[[], None]:
        """What APScheduler runs: ``run`` returns False after recording a failure; APScheduler then
        sees :class:`JobFailed` (logged by it without a traceback, see :func:`quiet_job_failures`)."""

        def scheduled() -> None:
            with self._running:
                self._in_flight += 1
                self._started[job] = self._monotonic()
            try:
                if not run():
                    failure = self.failures.current(job)
                    raise JobFailed(failure.message if failure is not None else f"{job} failed")
            finally:
                with self._running:
                    self._in_flight -= 1
                    self._started.pop(job, None)
                    self._running.notify_all()

        scheduled.__name__ = f"run_{job}"
        return scheduled

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Until no job runs (False when ``timeout_s`` ran out first). For shutting down: APScheduler's
        ``shutdown(wait=True)`` holds its executors' lock while it waits, and a job that then calls
        the scheduler (a success drops its pending retries) waits for the job store's lock, which
        the scheduler's own thread holds while it waits for the executors' lock: the process never
        exits. So the scheduler is shut down without waiting, then this waits for the jobs."""
        with self._running:
            return self._running.wait_for(lambda: self._in_flight == 0, timeout=timeout_s)

    # -- the jobs -------------------------------------------------------------------------------
    def run_plan(self) -> bool:
        """One plan; False when it failed (recorded, retried after a backoff). The first run, failed
        or not, is followed by the first report when none exists yet."""
        try:
            return self._plan_once()
        finally:
            if self._first_report_due:
                self._first_report_due = False
                self._schedule_first_report(delay_s=0.0)

    def _plan_once(self) -> bool:
        job = self.config.plan
        if job is None:
            return True
        now = self.clock().timestamp()
        try:
            plan = self.jobs.make_plan(end=now, job=job)
        except Exception as exc:  # a job must not die: record, and try again after a backoff
            with self._lock:
                self.state.last_plan_at, self.state.last_plan_ok = now, False
            self._failed("plan", exc, period_s=job.every_s, retry=self._scheduled("plan", self.run_plan))
            return False
        with self._lock:
            self.state.last_plan_at, self.state.last_plan_ok = now, True
            self.state.plan, self.state.plan_made_at = plan, now
            self.state.runs[("plan", "ok")] += 1
        self._succeeded("plan")
        log.info(
            "plan %s: %d node(s) to change, %d GPU(s) freeable",
            plan.plan_id,
            len(plan.changed_nodes),
            plan.totals.gpus_freed,
        )
        return True

    def run_report(self) -> bool:
        """The weekly report; False when it failed (recorded, retried after a backoff)."""
        job = self.config.report
        if job is None or self._standby("report"):
            return True
        now = self.clock()
        out = self.reports_dir / now.astimezone(self.config.timezone).strftime("%Y-%m-%d")
        try:
            path = self.jobs.write_report(end=now.timestamp(), job=job, plan=self.state.plan, out_dir=out)
        except Exception as exc:
            self._failed("report", exc, period_s=None, retry=self._scheduled("report", self.run_report))
            return False
        with self._lock:
            self.state.last_report_at = now.timestamp()
            self.state.runs[("report", "ok")] += 1
        self._succeeded("report")
        log.info("report written to %s", path)
        return True

    def run_first_report(self) -> bool:
        """The start-up report (none existed at start): as the weekly one, now. A replica that does not
        lead yet asks again after a lease duration, until it leads or a report exists."""
        if self.has_report():
            return True
        if self.leader is not None and not self.leader():
            election = self.config.auto_apply.leader_election
            self._schedule_first_report(delay_s=election.lease_duration_s if election else 15.0)
            return True
        log.info("no report in %s yet: writing the first one now", self.reports_dir)
        return self.run_report()

    def _schedule_first_report(self, *, delay_s: float) -> None:
        if self._scheduler is None or self.config.report is None:
            return
        self._first_report_tries += 1
        self._scheduler.add_job(
            self._scheduled("report", self.run_first_report),
            DateTrigger(run_date=self.clock() + timedelta(seconds=delay_s)),
            id=f"{FIRST_REPORT}-{self._first_report_tries}",
            name="first report (none yet)",
            misfire_grace_time=None,
        )

    def _skip(self, reason: str) -> bool:
        with self._lock:
            self.state.last_skip = reason
            self.state.runs[("auto_apply", "skipped")] += 1
        log.info("auto-apply skipped: %s", reason)
        return True

    def run_auto_apply(self) -> bool:
        """One guarded round: check the guard, read the ledger and the nodes, choose within the
        day's budget, hand over, apply, record. False when it failed (a configuration the cluster
        refuses, an unreachable API: recorded, tried again after a growing backoff)."""
        guard = self.config.auto_apply
        if not guard.enabled or guard.window is None or self._standby("auto_apply"):
            return True
        now = self.clock().astimezone(self.config.timezone)
        if (waiting := self.failures.backing_off("auto_apply", now.timestamp())) is not None:
            return self._skip(f"backing off after {waiting.count} failure(s) in a row: {waiting.message}")
        with self._lock:  # the plan job may replace the plan meanwhile: check and apply the same one
            plan, made = self.state.plan, self.state.plan_made_at
        if (refusal := self._refusal(now, guard, plan, made)) is not None or plan is None:
            return self._skip(refusal or "no plan yet")
        try:
            entries = self.ledger.load()
            nodes = self.jobs.node_marks(settings=guard)
        except Exception as exc:
            return self._apply_failed(exc)
        day = now.date()
        marks = budget.ClusterMarks.read(nodes, day=day, tz=self.config.timezone)
        cleared = entries.clear_settled(
            set(marks.in_flight), disrupted=set(marks.cordoned_today), day=day.isoformat()
        )
        choice = budget.choose(plan, entries, marks, day=day.isoformat(), per_day=guard.max_nodes_per_day)
        if choice.idle:
            if cleared:  # the ledger is written only when something changed
                self._save_quietly(entries)
            return self._skip(budget.idle_reason(plan, choice, per_day=guard.max_nodes_per_day))
        return self._hand_over_and_apply(plan, entries, choice, day=day.isoformat())

    def _hand_over_and_apply(self, plan: Plan, entries: Entries, choice: budget.Choice, *, day: str) -> bool:
        entries.set_started(plan.plan_id, set(entries.started.get(plan.plan_id, ())) | set(choice.new))
        try:
            self.ledger.save(entries)  # before the apply: a successor knows what was handed over
        except RightsizerError as exc:
            return self._skip(f"cannot write the auto-apply ledger: {exc}")
        if choice.in_flight:
            log.info(
                "auto-apply: settling node(s) another run left in flight: %s",
                ", ".join(sorted(choice.in_flight)),
            )
        try:
            result = self.jobs.apply(
                plan, settings=self.config.auto_apply, nodes=choice.new, stop=self._leading
            )
        except Exception as exc:  # nothing changed on nodes: the hand-over is taken back
            entries.set_started(plan.plan_id, set(entries.started.get(plan.plan_id, ())) - set(choice.new))
            self._save_quietly(entries)
            return self._apply_failed(exc)
        with self._lock:
            for o in result.outcomes:
                self.state.applies[o.result] += 1
            self.state.runs[("auto_apply", "ok" if result.ok else "failed")] += 1
            self.state.last_skip = ""
        self._record(entries, result, plan_id=plan.plan_id, day=day)
        if result.ok:
            self._succeeded("auto_apply")
            return True
        failed = "; ".join(f"node {o.node} {o.result}: {o.reason}" for o in result.failed)
        every = self.config.auto_apply.check_every_s
        self._failed("auto_apply", NodeFailed(failed), period_s=None, retry=None, first_s=every, max_s=every)
        return False

    def _record(self, entries: Entries, result: ApplyReport, *, plan_id: str, day: str) -> None:
        """Fold the outcomes into the ledger; a concurrent write (409) is answered by re-reading the
        ledger and folding them in again, so what the apply did is never lost."""
        for _ in range(LEDGER_TRIES):
            budget.record(entries, result, plan_id=plan_id, day=day)
            try:
                self.ledger.save(entries)
                return
            except LedgerConflict:
                try:
                    entries = self.ledger.load()
                except RightsizerError as exc:
                    log.error("could not re-read the auto-apply ledger: %s", exc)
                    return
            except RightsizerError as exc:
                log.error("could not record the auto-apply results in the ledger: %s", exc)
                return
        log.error(
            "could not record the auto-apply results: the ledger kept changing (%d tries)", LEDGER_TRIES
        )

    def _apply_failed(self, exc: BaseException) -> bool:
        """An apply that could not start: counted, said once, tried again after check_every × 2ⁿ."""
        with self._lock:
            self.state.applies["error"] += 1
        every = self.config.auto_apply.check_every_s
        self._failed(
            "auto_apply",
            exc,
            period_s=None,
            retry=None,
            first_s=every,
            max_s=max(every, CONFIG_BACKOFF_MAX_S),
        )
        return False

    def _save_quietly(self, entries: Entries) -> None:
        try:
            self.ledger.save(entries)
        except RightsizerError as exc:
            log.warning("could not update the auto-apply ledger: %s", exc)

    def _refusal(self, now: datetime, guard: AutoApply, plan: Plan | None, made: float) -> str | None:
        """Why the guard refuses to apply ``plan`` (made at ``made``) now (None: it may)."""
        assert guard.window is not None
        if not in_window(now, guard.window):
            return "outside the maintenance window"
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
        """Add the configured jobs to an APScheduler 3 scheduler (not yet started); failed jobs add
        their retries to it."""
        self._scheduler = scheduler
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
                self._scheduled("report", self.run_report),
                trigger,
                id="report",
                name="weekly report",
                misfire_grace_time=6 * 3600,
                **defaults,
            )
        if self.config.report is not None and not self.has_report():
            if self.config.plan is not None:
                self._first_report_due = True  # right after the first plan (run_plan), which it uses
            else:
                self._schedule_first_report(delay_s=0.0)
        if (pj := self.config.plan) is not None:
            trigger = IntervalTrigger(seconds=pj.every_s, start_date=now, timezone=tz)
            grace = int(max(60, pj.every_s / 2))
            scheduler.add_job(
                self._scheduled("plan", self.run_plan),
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
                self._scheduled("auto_apply", self.run_auto_apply),
                trigger,
                id="auto_apply",
                name="guarded auto-apply",
                misfire_grace_time=int(every),
                **defaults,
            )

    # -- /metrics and /health ---------------------------------------------------------------------
    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from status.metric_families(self.state, self.failures.total)
        yield status.loop_failures(self.loop_failures.snapshot())

    def registry(self) -> CollectorRegistry:
        reg = CollectorRegistry()
        reg.register(self)
        return reg

    def stuck_jobs(self) -> dict[str, dict[str, float]]:
        """Jobs whose run now going on has passed its deadline: ``{job: {running_s, deadline_s}}``."""
        now = self._monotonic()
        with self._running:
            started = dict(self._started)
        return {
            job: {"running_s": round(now - at, 1), "deadline_s": self.job_deadlines.get(job, 3600.0)}
            for job, at in sorted(started.items())
            if now - at > self.job_deadlines.get(job, 3600.0)
        }

    def health(self, scheduler: Any) -> dict[str, Any]:
        jobs = []
        for job in scheduler.get_jobs():
            nxt = getattr(job, "next_run_time", None)
            jobs.append({"id": job.id, "next_run": nxt.isoformat() if nxt else None})
        failing = {job: f.as_json() for job, f in sorted(self.failures.snapshot().items())}
        stuck = self.stuck_jobs()
        with self._lock:
            return {
                "status": "stuck" if stuck else "failing" if failing else "ok",
                "stuck": stuck,
                "jobs": jobs,
                "failing": failing,
                "last_plan_success": self.state.last_plan_ok,
                "last_auto_apply_skip": self.state.last_skip,
            }
