"""Transient API errors during ``apply``: retried with backoff, honouring ``Retry-After``, until a deadline.

Real API servers answer 429 (API Priority and Fairness, with ``Retry-After``) and 5xx (overload, a
restart during an upgrade, an etcd leader change); a connection can drop. None of these says anything
about the request itself, so the same call is made again after a pause: the server's ``Retry-After``
when it sent one, else ``initial_s`` doubling up to ``max_s``. A 409 Conflict is not retried here (the
caller re-reads and rebuilds its patch), nor are permanent errors. Once the next attempt would start
after ``deadline`` the last error is raised as :class:`RetriesExhausted`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from rightsizer.clients.kube import ConflictError, TemporaryKubeError, TooManyRequestsError

T = TypeVar("T")


class Clock(Protocol):
    """Time for the apply loop: the system's in a run, a fake one in tests (no real waits)."""

    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class RetriesExhausted(TemporaryKubeError):
    """A transient error that did not clear before the deadline; the message says how long was tried."""


@dataclass
class Retrier:
    clock: Clock
    deadline: float
    """``clock.monotonic()`` value after which no attempt starts."""
    initial_s: float = 0.5
    max_s: float = 30.0
    notify: Callable[[str], None] = lambda message: None
    """Told about every retry (the progress line)."""

    def call(self, what: str, fn: Callable[[], T], *, retry_throttled: bool = True) -> T:
        """``fn()``, retried on transient errors; ``retry_throttled=False`` passes 429s through (an
        eviction's 429 is a PodDisruptionBudget speaking, which the drain loop waits out itself)."""
        delay = self.initial_s
        started = self.clock.monotonic()
        attempts = 0
        while True:
            attempts += 1
            try:
                return fn()
            except ConflictError:
                raise
            except TooManyRequestsError as exc:
                if not retry_throttled and exc.retry_after_s is None:
                    raise
                error: TemporaryKubeError = exc
            except TemporaryKubeError as exc:
                error = exc
            wait = max(delay, error.retry_after_s or 0.0)
            if self.clock.monotonic() + wait > self.deadline:
                spent = self.clock.monotonic() - started
                raise RetriesExhausted(
                    f"{error} (still failing after {attempts} attempt(s) over {spent:.1f}s)",
                    status=error.status,
                ) from error
            hint = "Retry-After" if error.retry_after_s else "backoff"
            self.notify(f"{what}: {error}; retrying in {wait:.1f}s ({hint})")
            self.clock.sleep(wait)
            delay = min(delay * 2, self.max_s)
