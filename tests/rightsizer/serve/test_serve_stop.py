"""`serve` stops on SIGTERM after its running jobs finish, even when a job calls the scheduler as it
ends (a success drops the job's pending retries): APScheduler's ``shutdown(wait=True)`` deadlocks
then (found by the two-replica failover test: the survivor never exited)."""

from __future__ import annotations

import threading
import time

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from rightsizer.commands.serve import stop_jobs
from rightsizer.serve.scheduler import Service
from tests.support.rightsizer.serve_support import FakeJobs, config


class SlowPlan(FakeJobs):
    """A plan that is still running when the stop comes."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()

    def make_plan(self, *, end, job):
        self.started.set()
        time.sleep(0.5)
        return super().make_plan(end=end, job=job)


def test_stop_waits_for_a_running_job_that_calls_the_scheduler_and_returns(tmp_path) -> None:
    jobs = SlowPlan()
    service = Service(config(tmp_path), jobs=jobs)
    scheduler = BackgroundScheduler(timezone="UTC", executors={"default": ThreadPoolExecutor(2)})
    service.add_jobs(scheduler)
    # a job due every 20 ms keeps the scheduler's thread in its job-store lock, as serve's 1 s
    # auto-apply check does now and then
    scheduler.add_job(lambda: None, "interval", seconds=0.02, id="tick")
    scheduler.start()
    try:
        scheduler.get_job("plan").modify(next_run_time=scheduler.get_job("tick").next_run_time)
        assert jobs.started.wait(5), "the plan job did not start"
        stopping = threading.Thread(target=stop_jobs, args=(scheduler, service), daemon=True)
        stopping.start()
        stopping.join(10)
        assert not stopping.is_alive(), "serve's stop hangs with a job running"
        # the plan records its call only after its half second: the stop waited for it to finish
        assert [c[0] for c in jobs.calls] == ["plan"]
        assert service.wait_idle(0)
    finally:
        if scheduler.running:
            scheduler.shutdown(wait=False)
