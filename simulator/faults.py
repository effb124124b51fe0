"""When faults happen: occurrences, active windows and state-change edges of a fault schedule.

A fault starts at ``epoch + at`` and, with ``every``, again every ``every`` seconds; each occurrence
lasts ``duration`` seconds (0 for an Xid, which is an instant). All functions are pure.
"""

from __future__ import annotations

import math

from simulator.model import Fault


def _first(fault: Fault, epoch: float) -> float:
    return epoch + fault.at


def last_start(fault: Fault, epoch: float, t: float) -> float | None:
    """Start of the latest occurrence at or before ``t``."""
    first = _first(fault, epoch)
    if t < first:
        return None
    if fault.every is None:
        return first
    return first + math.floor((t - first) / fault.every) * fault.every


def count_until(fault: Fault, epoch: float, t: float) -> int:
    """Occurrences that started at or before ``t``."""
    first = _first(fault, epoch)
    if t < first:
        return 0
    if fault.every is None:
        return 1
    return math.floor((t - first) / fault.every) + 1


def active(fault: Fault, epoch: float, t: float) -> bool:
    start = last_start(fault, epoch, t)
    return start is not None and t < start + fault.duration


def remaining(fault: Fault, epoch: float, t: float) -> float:
    """Seconds left in the active window at ``t`` (0 when inactive)."""
    start = last_start(fault, epoch, t)
    if start is None:
        return 0.0
    return max(0.0, start + fault.duration - t)


def edges(fault: Fault, epoch: float, t0: float, t1: float) -> list[float]:
    """Times in ``(t0, t1]`` where what the fault shows changes (starts and ends of windows)."""
    out: list[float] = []
    first = _first(fault, epoch)
    if fault.every is None:
        starts = [first]
    else:
        k0 = max(0, math.floor((t0 - fault.duration - first) / fault.every))
        k1 = math.floor((t1 - first) / fault.every)
        starts = [first + k * fault.every for k in range(k0, k1 + 1)]
    for s in starts:
        for edge in (s, s + fault.duration) if fault.duration else (s,):
            if t0 < edge <= t1:
                out.append(edge)
    return out
