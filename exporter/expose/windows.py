"""Counts over a sliding window for dcgm-exporter's ``DCGM_EXP_XID_ERRORS_COUNT`` and
``DCGM_EXP_CLOCK_EVENTS_COUNT``, from successive snapshots.

Xid: the snapshot carries each GPU's Xid counts since start, so the count in the window is the
difference with the oldest snapshot inside it. Clock events: each snapshot carries the current
clock-event-reasons bitmask (``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``); a reason's count is the number
of collections in the window that had its bit set, as dcgm-exporter counts samples. Memory is
bounded by the number of collections per window (30 at 10 s over 5 min), and by
:data:`MAX_ENTRIES` whatever the clock does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from exporter.snapshot import NodeSnapshot

CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "clocks_setting"),
    (0x004, "power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal"),
    (0x040, "hw_thermal"),
    (0x080, "hw_power_brake"),
    (0x100, "display_clocks"),
)
"""DCGM's clock event reason bits and dcgm-exporter's ``clock_event`` label values."""
REASONS_FIELD = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"
MAX_ENTRIES = 4096
"""Hard bound on kept collections, should the clock stand still or jump back (a frozen test clock)."""


@dataclass(frozen=True)
class GpuWindow:
    xid: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))
    clock_events: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))


WindowCounts = Mapping[str, GpuWindow]
"""GPU UUID → its counts in the window."""


def reasons(mask: int) -> list[str]:
    return [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]


class EventWindows:
    def __init__(
        self, *, xid_window_s: float, clock_events_window_s: float, max_entries: int = MAX_ENTRIES
    ) -> None:
        self.xid_window_s = xid_window_s
        self.clock_events_window_s = clock_events_window_s
        self._xid: deque[tuple[float, dict[str, dict[int, int]]]] = deque(maxlen=max_entries)
        self._masks: deque[tuple[float, dict[str, int]]] = deque(maxlen=max_entries)

    def update(self, snapshot: NodeSnapshot) -> WindowCounts:
        """Add one snapshot (its ``taken_at`` is the time) and return the counts up to it."""
        now = snapshot.taken_at
        xid_now = {g.info.uuid: dict(g.xid_counts) for g in snapshot.gpus}
        masks = {
            g.info.uuid: int(g.values[REASONS_FIELD]) for g in snapshot.gpus if REASONS_FIELD in g.values
        }
        self._xid.append((now, xid_now))
        self._masks.append((now, masks))
        while len(self._xid) > 1 and self._xid[1][0] <= now - self.xid_window_s:
            self._xid.popleft()
        while self._masks and self._masks[0][0] <= now - self.clock_events_window_s:
            self._masks.popleft()
        start_at, oldest = self._xid[0]
        baseline = oldest if start_at <= now - self.xid_window_s else {}
        out: dict[str, GpuWindow] = {}
        for uuid, counts in xid_now.items():
            before = baseline.get(uuid, {})
            xid = {c: n - before.get(c, 0) for c, n in counts.items() if n - before.get(c, 0) > 0}
            events: dict[str, int] = {}
            for _, seen in self._masks:
                for name in reasons(seen.get(uuid, 0)):
                    events[name] = events.get(name, 0) + 1
            out[uuid] = GpuWindow(MappingProxyType(xid), MappingProxyType(events))
        return MappingProxyType(out)
