"""A wall-clock deadline for a whole HTTP exchange, its headers included.

A socket timeout bounds each read, not the exchange: a server that sends its status line and
headers a byte at a time, each byte within the timeout, keeps a request open for ever (urllib3's
``Timeout(total=…)`` is applied when a read starts, not between the reads of one answer). Here a
client states how long an exchange may take (:func:`within`); the connection classes of its HTTP
library hand their socket over when they start reading an answer (:func:`arm_current`), and one
watchdog thread shuts that socket down at the deadline. The blocked read then fails at once and the
client reports its usual "timed out" line. Leaving the ``within`` block disarms everything armed in
it, so a connection returned to a pool is never shut down later.

Standard library only (the exporter's image has no urllib3): :mod:`gpupilot_common.urllib3deadline`
holds the urllib3 connection classes, the exporter's client its ``http.client`` ones.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class _Scope:
    deadline: float
    armed: list[int] = field(default_factory=list)


class _Watchdog:
    """One daemon thread for the process, started on first use: a heap of (deadline, token)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._sockets: dict[int, socket.socket] = {}
        self._ids = itertools.count(1)
        self._thread: threading.Thread | None = None
        self.expired = 0
        """Sockets shut down at their deadline so far (for tests and self-metrics)."""

    def arm(self, sock: socket.socket, deadline: float) -> int:
        token = next(self._ids)
        with self._cond:
            self._sockets[token] = sock
            heapq.heappush(self._heap, (deadline, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="http-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()
        return token

    def disarm(self, token: int) -> None:
        with self._cond:
            self._sockets.pop(token, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][1] not in self._sockets:
                    heapq.heappop(self._heap)  # disarmed
                if not self._heap:
                    self._cond.wait()
                    continue
                when, token = self._heap[0]
                wait = when - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                sock = self._sockets.pop(token, None)
                if sock is not None:
                    self.expired += 1
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


WATCHDOG = _Watchdog()
_local = threading.local()


def _scopes() -> list[_Scope]:
    scopes: list[_Scope] | None = getattr(_local, "scopes", None)
    if scopes is None:
        scopes = []
        _local.scopes = scopes
    return scopes


@contextlib.contextmanager
def within(seconds: float) -> Iterator[float]:
    """Every answer read by this thread inside the block ends by ``seconds`` from now (its socket is
    shut down then); yields the deadline (``time.monotonic()`` value). Nested blocks keep the
    earlier deadline."""
    scopes = _scopes()
    deadline = time.monotonic() + max(0.0, seconds)
    if scopes:
        deadline = min(deadline, scopes[-1].deadline)
    scope = _Scope(deadline)
    scopes.append(scope)
    try:
        yield deadline
    finally:
        scopes.remove(scope)
        for token in scope.armed:
            WATCHDOG.disarm(token)


def arm_current(sock: socket.socket | None) -> None:
    """Called by a connection as it starts reading an answer: ``sock`` is shut down at the
    deadline of the innermost :func:`within` block of this thread (nothing outside one)."""
    scopes = _scopes()
    if sock is None or not scopes:
        return
    scope = scopes[-1]
    scope.armed.append(WATCHDOG.arm(sock, scope.deadline))


def passed() -> bool:
    """Whether the innermost :func:`within` block's deadline has passed (False outside one)."""
    scopes = _scopes()
    return bool(scopes) and time.monotonic() >= scopes[-1].deadline
