"""What ``serve`` shows about itself: the ``/metrics`` families of its state and its failures."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rightsizer.plan import idle
from rightsizer.serve.state import State

APPLY_RESULTS = (
    "applied",
    "already-applied",
    "skipped",
    "failed",
    "rolled-back",
    "rollback-failed",
    "not-started",
    "stopped",
    "orphan-rolled-back",
    "error",
)
JOBS = ("plan", "report", "auto_apply")


def loop_failures(counts: Mapping[str, int]) -> Metric:
    """``gpupilot_rightsizer_loop_failures_total{loop}``."""
    family = CounterMetricFamily(
        "gpupilot_rightsizer_loop_failures",
        "Failures a long-lived loop survived since start (leader-election, apply-lease): each logged "
        "in one line, the loop carrying on.",
        labels=["loop"],
    )
    for loop, count in sorted(counts.items()):
        family.add_metric([loop], float(count))
    return family


def metric_families(s: State, failures: Counter[str]) -> Iterator[Metric]:
    """The service's metrics from a consistent ``s`` (read under the service's lock)."""
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
        idle_gauge.add_metric([], float(len(idle.idle_devices(plan))))
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
    for result in APPLY_RESULTS:
        applies.add_metric([result], float(s.applies.get(result, 0)))
    yield applies
    failed = CounterMetricFamily(
        "gpupilot_rightsizer_job_failures",
        "Failed runs of each job (Prometheus unreachable, a configuration the cluster refuses, a "
        "node rolled back); a failed job is retried after a backoff.",
        labels=["job"],
    )
    for job in JOBS:
        failed.add_metric([job], float(failures.get(job, 0)))
    yield failed
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
