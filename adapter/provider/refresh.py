"""Values served from memory: each query an HPA asked for recently is re-evaluated once per
``interval`` in the background, and requests read the last result.

A *key* is one namespace-wide query (a metric for one resource in one namespace, with its
``metricLabelSelector``), so Prometheus load is (distinct keys asked) ÷ ``interval`` whatever the
request rate. The first request for a key evaluates it synchronously (concurrent first requests
share that one evaluation); a key nobody asked for during ``idle_drop`` seconds is dropped. A failed
refresh keeps the previous result, which is served until it is ``max_age`` seconds old; after that
the request gets the refresh's error (503), never an older value.

With a memory budget (``--memory-budget``), each value kept is held against it for the answers it
was built from (:func:`adapter.clients.membudget.take_parsed`), until it is replaced or dropped;
a value that does not fit in the half of the budget values may hold is served to the requests that
waited for it and not kept, so the next request evaluates it again.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import Gauge

from adapter.clients import membudget
from adapter.errors import UpstreamUnavailable
from adapter.provider import nowait
from gpupilot_common import loops

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    value: T
    fetched: float
    """``time.monotonic()`` when the evaluation that produced ``value`` started."""


class _Slot(Generic[T]):
    __slots__ = ("asked", "attempted", "entry", "error", "failing", "first", "held", "load", "running")

    def __init__(self, load: Callable[[], T]) -> None:
        self.load = load
        self.entry: Entry[T] | None = None
        self.error: UpstreamUnavailable | None = None
        self.asked = 0.0
        self.attempted = -math.inf
        self.running = False
        self.failing = False
        self.first = threading.Event()
        self.held = 0
        """Bytes of the memory budget the kept value holds."""


class RefreshingCache(Generic[T]):
    def __init__(
        self,
        *,
        interval: float,
        idle_drop: float,
        max_age: float,
        workers: int = 4,
        max_keys: int = 2000,
        clock: Callable[[], float] = time.monotonic,
        keys_gauge: Gauge | None = None,
        oldest_gauge: Gauge | None = None,
        budget: membudget.MemoryBudget | None = None,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self._on_failure = on_failure
        for name, value in (("interval", interval), ("idle_drop", idle_drop)):
            if not math.isfinite(value) or value <= 0:
                raise ValueError(f"refresh {name} {value!r}: must be a finite number of seconds > 0")
        self.interval = interval
        self.idle_drop = idle_drop
        self.max_keys = max_keys
        """Queries kept fresh at most; a new one past this is evaluated for its request only."""
        self.max_age = max_age if max_age > 0 else math.inf
        self._clock = clock
        self._budget = budget
        self._unkept_logged = -math.inf
        self._slots: dict[Hashable, _Slot[T]] = {}
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="refresh")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshes = 0
        """Evaluations run (first asks and background refreshes), for tests and the bench."""
        if keys_gauge is not None:
            keys_gauge.set_function(lambda: len(self._slots))
        if oldest_gauge is not None:
            oldest_gauge.set_function(self.oldest_age)

    # -- requests --------------------------------------------------------------------------------
    def get(self, key: Hashable, load: Callable[[], T], *, wait: float) -> Entry[T]:
        """The latest value for ``key``; the first ask evaluates ``load`` (waiting up to ``wait``)."""
        now = self._clock()
        with self._lock:
            slot = self._slots.get(key)
            if slot is None or slot.entry is None:
                nowait.check()  # the first evaluation is a Prometheus query (or a wait for one)
            first = slot is None
            full = first and len(self._slots) >= self.max_keys
            if slot is None:
                slot = _Slot(load)
                slot.running, slot.attempted = True, now
                if not full:
                    self._slots[key] = slot
            slot.asked = now
            entry = slot.entry
        if full:  # past the bound: answered, but not kept (many distinct selectors must not multiply load)
            self._evaluate(key, slot)
            if slot.entry is None:
                assert slot.error is not None
                raise _fresh(slot.error)
            return slot.entry
        if first:
            self._evaluate(key, slot)
        elif entry is None:
            slot.first.wait(wait)
        entry, error = slot.entry, slot.error
        if entry is not None and self._clock() - entry.fetched <= self.max_age:
            return entry
        if error is not None:
            if entry is not None:
                raise type(error)(
                    f"{error} (the last good value is {self._clock() - entry.fetched:.0f}s old)"
                )
            raise _fresh(error)
        if entry is not None:  # no error, yet the value aged past max_age: its refresh hangs
            raise UpstreamUnavailable(
                f"refresh running longer than --max-value-age ({self.max_age:g}s): the last good value "
                f"is {self._clock() - entry.fetched:.0f}s old and not served; Prometheus answers slowly"
            )
        raise UpstreamUnavailable(
            f"the first evaluation of this metric has not finished within {wait:g}s; retry shortly"
        )

    def oldest_age(self) -> float:
        now = self._clock()
        with self._lock:
            ages = [now - s.entry.fetched for s in self._slots.values() if s.entry is not None]
        return max(ages, default=-1.0)

    def __len__(self) -> int:
        return len(self._slots)

    # -- evaluation ------------------------------------------------------------------------------
    def _evaluate(self, key: Hashable, slot: _Slot[T]) -> None:
        started = self._clock()
        membudget.take_parsed()  # from here: the answers this evaluation reads
        try:
            value = slot.load()
        except UpstreamUnavailable as exc:
            # kept until the next refresh: without its traceback, whose frames may hold the answer
            slot.error = exc.with_traceback(None)
            if not slot.failing:
                log.warning(
                    "refreshing %s failed: %s; serving the previous value while it is fresh", key, exc
                )
            slot.failing = True
        except Exception as exc:  # a bug in a loader must not stop the refresher
            log.exception("refreshing %s failed", key)
            slot.error = UpstreamUnavailable(f"evaluating the metric failed: {type(exc).__name__}")
        else:
            slot.entry = Entry(value, started)
            self._hold(key, slot, membudget.take_parsed())
            slot.error = None
            if slot.failing:
                log.info("refreshing %s works again", key)
            slot.failing = False
        finally:
            with self._lock:
                slot.running = False
                self.refreshes += 1
            slot.first.set()

    def _hold(self, key: Hashable, slot: _Slot[T], amount: int) -> None:
        """Hold ``amount`` of the budget for the value just kept (the previous one's released); when
        it does not fit, the slot is dropped: its waiters still read the value from it."""
        if self._budget is None:
            return
        if slot.held:
            self._budget.unhold(slot.held)
            slot.held = 0
        with self._lock:
            kept = self._slots.get(key) is slot
        if not kept or not amount:
            return
        if self._budget.hold(amount):
            slot.held = amount
            return
        with self._lock:
            if self._slots.get(key) is slot:
                del self._slots[key]
        now = self._clock()
        if now - self._unkept_logged >= 60:  # at most one line a minute, whatever the request rate
            self._unkept_logged = now
            log.warning(
                "%s: its value (about %s) is served but not kept in memory: values kept hold half of "
                "--memory-budget %s already; each request evaluates it again. Narrow the query or raise "
                "--memory-budget with the container's memory limit",
                key,
                membudget.mib(amount),
                membudget.mib(self._budget.limit),
            )

    def refresh_due(self) -> int:
        """Start the refreshes that are due and drop idle keys; returns how many were started."""
        now = self._clock()
        due: list[tuple[Hashable, _Slot[T]]] = []
        with self._lock:
            for key, slot in list(self._slots.items()):
                if now - slot.asked > self.idle_drop and not slot.running:
                    del self._slots[key]
                    if slot.held and self._budget is not None:
                        self._budget.unhold(slot.held)
                        slot.held = 0
                    log.debug("dropped %s: not asked for %.0fs", key, now - slot.asked)
                    continue
                # a failed refresh is retried one interval after it started, not at every tick
                if not slot.running and now - slot.attempted >= self.interval:
                    slot.running, slot.attempted = True, now
                    due.append((key, slot))
        for key, slot in due:
            self._pool.submit(self._evaluate, key, slot)
        return len(due)

    def start(self) -> None:
        def run() -> None:
            tick = min(self.interval / 4, 1.0)
            self._stop.wait(tick)
            loops.keep_running(
                "refresher",
                self.refresh_due,
                stop=self._stop,
                interval=lambda: tick,
                logger=log,
                on_failure=self._on_failure,
                backoff=loops.Backoff(initial_s=tick, max_s=max(tick, self.interval)),
            )

        self._thread = threading.Thread(target=run, name="refresher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)


def _fresh(error: UpstreamUnavailable) -> UpstreamUnavailable:
    """A copy of a kept error for one request: raising the kept one would add each request's frames
    to its traceback, kept with it until the next refresh."""
    return type(error)(str(error))
