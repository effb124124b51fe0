"""Failed jobs are failures: counted, logged once per problem, retried with backoff, on ``/health``.

A job that fails (Prometheus unreachable, a configuration the cluster refuses) is retried after 1,
2, 4 … minutes (never more than ``max_s``, nor later than its next period), not at its next period;
the same message again is logged at debug level, so a problem that lasts is one line, not one per
period. A success clears it.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from dataclasses import dataclass

from rightsizer.errors import RightsizerError


class JobFailed(RightsizerError):
    """Raised to APScheduler after a failure was recorded and logged (so it logs no success)."""


@dataclass(frozen=True)
class Failure:
    job: str
    message: str
    since: float
    """Unix time of the first failure in this row."""
    count: int
    """Failures in a row."""
    retry_at: float
    """Unix time of the next try."""

    def as_json(self) -> dict[str, object]:
        return {
            "message": self.message,
            "since": self.since,
            "failures_in_a_row": self.count,
            "retry_at": self.retry_at,
        }


class Failures:
    def __init__(self, *, first_s: float = 60.0, max_s: float = 3600.0) -> None:
        self.first_s, self.max_s = first_s, max_s
        self.total: Counter[str] = Counter()
        self._current: dict[str, Failure] = {}
        self._lock = threading.Lock()

    def failed(
        self,
        job: str,
        message: str,
        *,
        now: float,
        period_s: float | None = None,
        first_s: float | None = None,
        max_s: float | None = None,
    ) -> tuple[Failure, bool]:
        """Record a failure; returns it and whether it is news (a new problem, or a changed message).
        The next try is ``first_s`` × 2ⁿ⁻¹ later (at most ``max_s``, and at most ``period_s``)."""
        first = self.first_s if first_s is None else first_s
        with self._lock:
            self.total[job] += 1
            last = self._current.get(job)
            count = 1 if last is None else last.count + 1
            delay = min(first * 2 ** min(count - 1, 30), self.max_s if max_s is None else max_s)
            if period_s is not None:
                delay = min(delay, max(first, period_s))
            since = now if last is None else last.since
            failure = Failure(job, message, since, count, now + delay)
            self._current[job] = failure
            return failure, last is None or last.message != message

    def succeeded(self, job: str) -> Failure | None:
        """Clear ``job``'s failure; returns what it was (None: it was not failing)."""
        with self._lock:
            return self._current.pop(job, None)

    def current(self, job: str) -> Failure | None:
        with self._lock:
            return self._current.get(job)

    def backing_off(self, job: str, now: float) -> Failure | None:
        """The failure whose retry time has not come yet (None: the job may run)."""
        failure = self.current(job)
        return failure if failure is not None and now < failure.retry_at else None

    def snapshot(self) -> dict[str, Failure]:
        with self._lock:
            return dict(self._current)


class _QuietJobFailures(logging.Filter):
    """APScheduler logs a job that raised with its traceback; a :class:`JobFailed` was already said
    in one line by the job itself, so its record keeps APScheduler's line and loses the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, JobFailed):
            record.msg = f"{record.getMessage()}: {exc}"
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


def quiet_job_failures() -> None:
    """Install the filter on APScheduler's executor loggers (idempotent)."""
    for name in ("apscheduler.executors.default", "apscheduler.executors"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _QuietJobFailures) for f in logger.filters):
            logger.addFilter(_QuietJobFailures())
