"""Run blocking backend calls on one worker thread with a deadline.

A hung NVML call cannot be interrupted from Python. So calls go to a single daemon thread; the
caller waits at most ``timeout`` seconds and moves on. While a call is still stuck, later calls are
refused at once (:class:`CallTimeout`) instead of starting another thread: threads never pile up,
and the stuck one does not keep the process from exiting.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from exporter.errors import BackendError

T = TypeVar("T")


class CallTimeout(BackendError):
    """The call did not return in time (or an earlier one is still running)."""


class DeadlineWorker:
    def __init__(self, name: str = "backend-call") -> None:
        self._name = name
        self._cv = threading.Condition()
        self._job: Callable[[], Any] | None = None
        self._generation = 0
        self._finished = 0
        self._outcome: tuple[bool, Any] = (True, None)
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def busy(self) -> bool:
        """True while a call (possibly an abandoned, hung one) is still running."""
        with self._cv:
            return self._finished != self._generation

    def call(self, fn: Callable[[], T], *, timeout: float) -> T:
        """``fn()`` on the worker; its exception is re-raised here. Raises :class:`CallTimeout`."""
        with self._cv:
            if self._closed:
                raise CallTimeout(f"{self._name}: worker closed")
            if self._finished != self._generation:
                raise CallTimeout(f"{self._name}: the previous call is still running")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._generation += 1
            generation = self._generation
            self._job = fn
            self._cv.notify_all()
            if not self._cv.wait_for(lambda: self._finished == generation, timeout):
                raise CallTimeout(f"{self._name}: no answer within {timeout:g}s")
            ok, value = self._outcome
            self._outcome = (True, None)
        if ok:
            return value  # type: ignore[no-any-return]
        raise value

    def close(self) -> None:
        """Stop the worker once its current call (if any) returns."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._job is not None or self._closed)
                if self._job is None:
                    return
                job, self._job = self._job, None
                generation = self._generation
            try:
                outcome: tuple[bool, Any] = (True, job())
            except BaseException as exc:  # handed to the caller, which decides
                outcome = (False, exc)
            with self._cv:
                self._outcome = outcome
                self._finished = generation
                self._cv.notify_all()
