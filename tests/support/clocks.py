"""A clock a test sets by hand: ``clock()`` is ``clock.now`` (Unix seconds), moved with
``clock.now = …`` or :meth:`ManualClock.advance`, so nothing waits on real time."""

from __future__ import annotations


class ManualClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
