"""Identical calls in flight made once: while a call for a key runs, callers asking for the same key
wait for its result instead of making their own (an HPA and a KEDA trigger asking the same query,
or many first requests for a metric not yet in memory, read one Prometheus answer).

Errors reach every waiter as a fresh copy made by ``copy``: one exception object raised in several
threads would collect each thread's frames in its traceback.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")


class InFlight(Generic[T]):
    """Thread-safe."""

    def __init__(self, *, copy: Callable[[BaseException], BaseException | None]) -> None:
        self._copy = copy
        """A waiter's own copy of the error (None: the error is passed on as is)."""
        self._running: dict[Hashable, concurrent.futures.Future[T]] = {}
        self._lock = threading.Lock()
        self.joined = 0
        """Calls answered by another caller's call (tests, the bench)."""

    def run(
        self, key: Hashable, call: Callable[[], T], *, wait: float, late: Callable[[], BaseException]
    ) -> T:
        """``call()``, or the result of the same key's call already running (waiting at most
        ``wait`` seconds for it, then raising ``late()``)."""
        with self._lock:
            running = self._running.get(key)
            if running is None:
                mine: concurrent.futures.Future[T] = concurrent.futures.Future()
                self._running[key] = mine
            else:
                self.joined += 1
        if running is not None:
            return self._join(running, wait=wait, late=late)
        try:
            result = call()
        except BaseException as exc:
            mine.set_exception(self._copy(exc) or exc)
            raise
        else:
            mine.set_result(result)
            return result
        finally:
            with self._lock:
                del self._running[key]

    def _join(
        self, running: concurrent.futures.Future[T], *, wait: float, late: Callable[[], BaseException]
    ) -> T:
        failure: BaseException
        try:
            return running.result(wait)
        except concurrent.futures.TimeoutError:
            failure = late()
        except BaseException as exc:
            failure = self._copy(exc) or exc
        raise failure  # outside the except block: no chained exception
