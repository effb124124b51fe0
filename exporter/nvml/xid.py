"""Xid events through an NVML event set: registered once, drained with a zero timeout each collection.

Counts are kept per GPU UUID and per Xid code since the exporter started (a counter per code), with
the last event for ``DCGM_FI_DEV_XID_ERRORS``. The library object is injected; this module never
imports ``pynvml``.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from exporter.nvml.fields import NvmlCalls, text
from exporter.snapshot import XidEvent

MAX_EVENTS_PER_DRAIN = 1024
"""Bound on one drain, so a storm of events cannot hold a collection up."""


class XidWatcher:
    def __init__(self, calls: NvmlCalls, *, wall_clock: Callable[[], float]) -> None:
        self.calls = calls
        self.wall_clock = wall_clock
        self.counts: dict[str, Counter[int]] = {}
        self.last: dict[str, XidEvent] = {}
        self._set: Any = None

    def register(self, devices: Iterable[tuple[str, Any]]) -> None:
        """Create the event set and register each ``(uuid, handle)`` for Xid critical errors."""
        lib = self.calls.lib
        try:
            self._set = lib.nvmlEventSetCreate()
        except lib.NVMLError:
            self.calls.errors["xid"] += 1
            self._set = None
            return
        for _uuid, handle in devices:
            try:
                lib.nvmlDeviceRegisterEvents(handle, lib.nvmlEventTypeXidCriticalError, self._set)
            except lib.NVMLError as exc:
                if getattr(exc, "value", None) != lib.NVML_ERROR_NOT_SUPPORTED:
                    self.calls.errors["xid"] += 1

    def drain(self) -> None:
        lib = self.calls.lib
        if self._set is None:
            return
        for _ in range(MAX_EVENTS_PER_DRAIN):
            try:
                data = lib.nvmlEventSetWait(self._set, 0)
            except lib.NVMLError as exc:
                if getattr(exc, "value", None) != lib.NVML_ERROR_TIMEOUT:
                    self.calls.errors["xid"] += 1
                return
            if not int(data.eventType) & int(lib.nvmlEventTypeXidCriticalError):
                continue
            try:
                uuid = text(lib.nvmlDeviceGetUUID(data.device))
            except lib.NVMLError:
                self.calls.errors["xid"] += 1
                continue
            code = int(data.eventData)
            self.counts.setdefault(uuid, Counter())[code] += 1
            self.last[uuid] = XidEvent(code=code, timestamp=self.wall_clock())

    def close(self) -> None:
        lib = self.calls.lib
        if self._set is not None:
            with contextlib.suppress(lib.NVMLError):
                lib.nvmlEventSetFree(self._set)
        self._set = None
