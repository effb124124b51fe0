"""Long-lived loops (watchers, reloaders, refreshers) that outlive any failure of their body.

Whatever a step raises — the error its author foresaw or one nobody did (a ``UnicodeDecodeError``
from a certificate file, an ``http.client.IncompleteRead`` from a cut chunk, a ``KeyError`` from an
odd answer) — the loop logs one line naming what failed and why, counts the failure (each service
exposes the count as a self-metric), leaves the last good state in place, and tries again after a
pause that doubles from ``initial_s`` to ``max_s`` with jitter, so that many replicas that failed
together do not come back together. A success resets the pause.

:func:`watch_pause` applies the same rule to a watch the server ends: one that ended at once
without an event is not reopened at once.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from gpupilot_common.text import one_line

WATCH_MIN_S = 5.0
"""A watch that lasted less than this without delivering an event counts as a failure."""


@dataclass
class Backoff:
    """Exponential back-off with jitter, capped: pauses in ``[d/2, d]`` for ``d`` doubling from
    ``initial_s`` to ``max_s`` (AWS's "equal jitter")."""

    initial_s: float = 0.5
    max_s: float = 30.0
    rng: Callable[[], float] = field(default=random.random, repr=False)
    failures: int = 0
    """Failures in a row (0 after a success)."""

    def next_delay(self) -> float:
        """The pause after one more failure."""
        base = min(self.max_s, self.initial_s * 2.0 ** min(self.failures, 60))
        self.failures += 1
        return base / 2 + base / 2 * self.rng()

    def reset(self) -> None:
        self.failures = 0


def failure_line(what: str, exc: BaseException) -> str:
    """``what: Type: message`` on one line (never a traceback)."""
    text = one_line(str(exc)) or "(no message)"
    return f"{what}: {type(exc).__name__}: {text}"


def guarded(
    what: str,
    step: Callable[[], object],
    *,
    logger: logging.Logger,
    on_failure: Callable[[BaseException], None] | None = None,
) -> bool:
    """Run ``step``; True when it returned. Any ``Exception`` is logged in one line, handed to
    ``on_failure`` (which counts it; its own failure is logged too, never raised) and False returned."""
    try:
        step()
    except Exception as exc:
        logger.error("%s; keeping the last good state and trying again", failure_line(what, exc))
        if on_failure is not None:
            try:
                on_failure(exc)
            except Exception as inner:
                logger.error("%s", failure_line(f"{what}: counting the failure", inner))
        return False
    return True


def keep_running(
    what: str,
    step: Callable[[], object],
    *,
    stop: threading.Event,
    interval: Callable[[], float],
    logger: logging.Logger,
    on_failure: Callable[[BaseException], None] | None = None,
    backoff: Backoff | None = None,
) -> None:
    """``step`` until ``stop`` is set: ``interval()`` seconds after a step that returned, the next
    back-off pause after one that raised (see :func:`guarded`)."""
    pause = backoff or Backoff()
    while not stop.is_set():
        if guarded(what, step, logger=logger, on_failure=on_failure):
            pause.reset()
            wait = interval()
        else:
            wait = pause.next_delay()
        stop.wait(max(0.0, wait))


def watch_pause(*, lasted_s: float, events: int, backoff: Backoff) -> float:
    """Seconds to wait before reopening a watch the server ended: none after a watch that delivered
    events or lasted :data:`WATCH_MIN_S`, else the next back-off pause (a server that ends every
    watch at once is not asked thousands of times a second)."""
    if events or lasted_s >= WATCH_MIN_S:
        backoff.reset()
        return 0.0
    return backoff.next_delay()


class LoopFailures:
    """Failures of each long-lived loop since start, by loop name (thread-safe): what a service's
    ``…_loop_failures_total{loop=…}`` self-metric shows."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def register(self, *loops: str) -> None:
        """Show ``loops`` at 0 until they fail (a counter that exists before its first increment)."""
        with self._lock:
            for loop in loops:
                self._counts.setdefault(loop, 0)

    def add(self, loop: str) -> None:
        with self._lock:
            self._counts[loop] = self._counts.get(loop, 0) + 1

    def counter(self, loop: str) -> Callable[[BaseException], None]:
        """An ``on_failure`` for :func:`guarded` / :func:`keep_running` counting under ``loop``."""
        return lambda _exc: self.add(loop)

    def get(self, loop: str) -> int:
        with self._lock:
            return self._counts.get(loop, 0)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)
