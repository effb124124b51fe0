"""serve on day one: with no report in its folder it writes one right after its first plan (or at
start without a plan job), so /report/ answers minutes after an install, not at the first weekly
time; a restart with a report in place writes none; a replica that does not lead waits for the
lease. The real APScheduler triggers on a hand-set clock, /report/ over the real HTTP server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import yaml
from apscheduler.executors.debug import DebugExecutor

from rightsizer.cli import main
from rightsizer.commands.serve import http_server
from rightsizer.serve.scheduler import FIRST_REPORT, Service
from tests.rightsizer.serve.test_serve_files import fetch
from tests.support.rightsizer.serve_support import (
    BERLIN,
    FakeJobs,
    ManualScheduler,
    config,
    earlier_report,
    start,
    tick,
)

START = datetime(2026, 11, 28, 20, 0, tzinfo=BERLIN)  # the scheduler_clock's Saturday evening


def first_report_jobs(sched) -> list[str]:
    return [j.id for j in sched.get_jobs() if j.id.startswith(FIRST_REPORT)]


class PlanSeeingJobs(FakeJobs):
    """Records the plan each report was given (the first report uses the first plan)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.report_plans: list[object] = []

    def write_report(self, *, end, job, plan, out_dir):
        self.report_plans.append(plan)
        return super().write_report(end=end, job=job, plan=plan, out_dir=out_dir)


def test_a_fresh_install_gets_its_report_right_after_the_first_plan(tmp_path, scheduler_clock):
    jobs = PlanSeeingJobs()
    cfg = config(tmp_path)
    service, sched = start(cfg, jobs, scheduler_clock)
    server = http_server(service, sched, "127.0.0.1", 0).start()
    try:
        assert fetch(server.port, "/report/")[0] == 404
        tick(sched, scheduler_clock, START + timedelta(minutes=1), step=timedelta(seconds=30))
        assert [c[0] for c in jobs.calls] == ["plan", "report"]
        first = jobs.fired("report")[0][1]
        assert START <= first <= START + timedelta(seconds=30)  # at start, not Monday 06:00
        assert jobs.report_plans == [jobs.plan]  # the report shows the plan just made
        status, _, body = fetch(server.port, "/report/")
        assert status == 200 and body == b"<p>report</p>"
        assert not first_report_jobs(sched)  # it ran once
        # then weekly, as configured: Monday 06:00 Berlin
        tick(sched, scheduler_clock, datetime(2026, 11, 30, 7, 0, tzinfo=BERLIN), step=timedelta(hours=1))
        fired = [r[1].astimezone(BERLIN).strftime("%a %H") for r in jobs.fired("report")]
        assert fired == ["Sat 20", "Mon 06"]
    finally:
        server.close()
        sched.shutdown(wait=False)
    # a restart finds the reports: no start-up report again
    again = FakeJobs()
    _, sched = start(cfg, again, scheduler_clock)
    tick(sched, scheduler_clock, scheduler_clock.now + timedelta(hours=1), step=timedelta(minutes=10))
    assert [c[0] for c in again.calls] == ["plan"]
    sched.shutdown(wait=False)


def test_no_start_up_report_when_one_exists(tmp_path, scheduler_clock):
    jobs = FakeJobs()
    cfg = config(tmp_path, report={"schedule": "mon 06:00", "out_dir": str(tmp_path / "out")})
    earlier_report(cfg)  # in report.out_dir, where /report/ looks
    _, sched = start(cfg, jobs, scheduler_clock)
    tick(sched, scheduler_clock, START + timedelta(hours=2), step=timedelta(minutes=10))
    assert jobs.fired("report") == [] and len(jobs.fired("plan")) == 1
    sched.shutdown(wait=False)


def test_without_a_plan_job_the_first_report_runs_at_start(tmp_path, scheduler_clock):
    jobs = FakeJobs()
    _, sched = start(config(tmp_path, plan=None), jobs, scheduler_clock)
    tick(sched, scheduler_clock, START + timedelta(seconds=30), step=timedelta(seconds=30))
    assert [(c[0], c[1]) for c in jobs.calls] == [("report", START.astimezone(UTC))]  # the first tick
    sched.shutdown(wait=False)


def test_a_failed_first_plan_still_leads_to_a_first_report(tmp_path, scheduler_clock):
    jobs = PlanSeeingJobs(fail_plan=True)
    _, sched = start(config(tmp_path), jobs, scheduler_clock)
    tick(sched, scheduler_clock, START + timedelta(seconds=30), step=timedelta(seconds=30))
    assert [c[0] for c in jobs.calls] == ["plan", "report"]
    assert jobs.report_plans == [None]  # it plans for itself, as 'report' does
    sched.shutdown(wait=False)


def test_a_replica_that_does_not_lead_waits_for_the_lease(tmp_path, scheduler_clock):
    leads = [False]
    cfg = config(tmp_path, auto_apply={"leader_election": {"namespace": "gpupilot", "lease_duration": "20s"}})
    jobs = FakeJobs()
    service = Service(cfg, jobs=jobs, clock=scheduler_clock, leader=lambda: leads[0])
    sched = ManualScheduler(timezone=cfg.timezone, executors={"default": DebugExecutor()})
    service.add_jobs(sched)
    sched.start()
    tick(sched, scheduler_clock, START + timedelta(minutes=2), step=timedelta(seconds=10))
    assert jobs.fired("report") == []  # standby: the leader writes it
    assert len(first_report_jobs(sched)) == 1  # and this replica asks again (one pending try)
    leads[0] = True  # the lease came to this replica
    tick(sched, scheduler_clock, scheduler_clock.now + timedelta(seconds=30), step=timedelta(seconds=10))
    assert len(jobs.fired("report")) == 1 and service.has_report()
    assert not first_report_jobs(sched)
    sched.shutdown(wait=False)


def test_check_says_when_the_first_report_comes(tmp_path, capsys):
    cfg = tmp_path / "serve.yaml"
    state = tmp_path / "state"
    doc = {"prometheus_url": "http://127.0.0.1:1", "timezone": "UTC", "state_dir": str(state)}
    cfg.write_text(yaml.safe_dump({**doc, "report": {"schedule": "mon 06:00"}, "plan": {"every": "6h"}}))
    assert main(["serve", "--config", str(cfg), "--check", "--offline"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert f"report: no report in {state / 'reports'} yet: the first one right after the first plan" in said
    (state / "reports" / "2026-11-30").mkdir(parents=True)
    (state / "reports" / "2026-11-30" / "report.html").write_text("<p>old</p>")
    assert main(["serve", "--config", str(cfg), "--check", "--offline"]) == 0
    assert not any("no report" in line for line in capsys.readouterr().out.splitlines())
