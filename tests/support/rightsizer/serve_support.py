"""Helpers for the ``serve`` scheduler tests: APScheduler ticked by the test on a hand-set clock, jobs
that record what fired, and a minimal valid serve config."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from apscheduler.executors.debug import DebugExecutor
from apscheduler.schedulers.base import BaseScheduler

from rightsizer.apply.applier import ApplyReport, NodeOutcome
from rightsizer.serve.config import parse
from rightsizer.serve.scheduler import Service
from tests.support.rightsizer.apply_support import Change, make_plan

BERLIN = ZoneInfo("Europe/Berlin")


class ManualScheduler(BaseScheduler):
    """APScheduler's own job processing, ticked by the test instead of a timer thread."""

    def wakeup(self) -> None:
        pass

    def shutdown(self, wait: bool = True) -> None:
        super().shutdown(wait)


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


class FakeJobs:
    def __init__(self, plan=None, *, fail_plan=False, apply_error=None) -> None:
        self.plan = plan or make_plan(
            [
                Change("gpu-a", "all-1g.10gb", {"7g.80gb": 1}, gpus_freed=2),
                Change("gpu-b", "all-1g.10gb", {"7g.80gb": 1}),
            ]
        )
        self.fail_plan = fail_plan
        self.apply_error = apply_error
        self.calls: list[tuple[str, datetime | None, object]] = []
        self.clock: Clock | None = None

    def make_plan(self, *, end, job):
        self.calls.append(("plan", datetime.fromtimestamp(end, UTC), None))
        if self.fail_plan:
            raise RuntimeError("prometheus down")
        return self.plan

    def write_report(self, *, end, job, plan, out_dir):
        self.calls.append(("report", datetime.fromtimestamp(end, UTC), out_dir))
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "report.html").write_text("<p>report</p>")
        return out_dir / "report.html"

    def node_marks(self, *, settings):
        return []

    def apply(self, plan, *, settings, nodes, stop):
        nodes = list(nodes)
        self.calls.append(("apply", self.clock.now if self.clock else None, nodes))
        if self.apply_error is not None:
            raise self.apply_error
        return ApplyReport(plan.plan_id, "cm", False, False, tuple(NodeOutcome(n, "applied") for n in nodes))

    def fired(self, kind):
        return [c for c in self.calls if c[0] == kind]


def config(tmp_path, **extra):
    doc = {
        "prometheus_url": "http://prometheus:9090",
        "timezone": "Europe/Berlin",
        "state_dir": str(tmp_path / "state"),
        "report": {"schedule": "mon 06:00", "price_per_gpu_hour": 2.5},
        "plan": {"every": "6h"},
        **extra,
    }
    return parse(doc, source="serve.yaml")


def earlier_report(cfg, day="2026-11-23"):
    """A report an earlier run left in the report folder (serve then writes none at start)."""
    folder = (cfg.report.out_dir or cfg.state_dir / "reports") / day
    folder.mkdir(parents=True)
    (folder / "report.html").write_text("<p>last week</p>")
    return folder


def start(cfg, jobs, clock):
    jobs.clock = clock
    service = Service(cfg, jobs=jobs, clock=clock)
    sched = ManualScheduler(timezone=cfg.timezone, executors={"default": DebugExecutor()})
    service.add_jobs(sched)
    sched.start()
    return service, sched


def tick(sched, clock, until, step=timedelta(minutes=30)):
    sched._process_jobs()
    while clock.now < until:
        clock.now = min(until, clock.now + step)
        sched._process_jobs()
