"""gzip for large answers, once per answer.

Clients of this API (client-go behind kube-apiserver's aggregation proxy, kubectl, requests) send
``Accept-Encoding: gzip``. A 500-pod MetricValueList is about 120 KB of very regular JSON; gzip
level 1 makes it a few KB in a fraction of a millisecond, which saves more than that in TLS
encryption and socket writes on every request after the first. An answer served from memory is
the same ``bytes`` object until its values or pods change, so the compressed form is kept by that
object's identity (the entry holds the object, so its id cannot be reused) in a small bounded
store; a request for it is then a lookup.
"""

from __future__ import annotations

import functools
import threading
import zlib
from collections import OrderedDict
from collections.abc import Iterable

from gpupilot_common.qvalues import q_values

GZIP_ABOVE = 8 * 1024
"""Bodies shorter than this are sent as they are (a header or two would eat the saving)."""


def accepts_gzip(values: Iterable[str]) -> bool:
    """Whether the ``Accept-Encoding`` header values allow gzip (``gzip``, ``x-gzip`` or ``*``, not
    with ``q=0``)."""
    return _accepts_gzip(",".join(values))


@functools.lru_cache(maxsize=256)
def _accepts_gzip(header: str) -> bool:
    """(memoised: a client sends the same header on every request)"""
    q = q_values(header)
    return max(q.get("gzip", 0.0), q.get("x-gzip", 0.0), q.get("*", 0.0)) > 0


def gzip_bytes(body: bytes) -> bytes:
    """A gzip member of ``body`` (level 1: the bodies are repetitive; speed matters more)."""
    c = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return c.compress(body) + c.flush()


class GzipCache:
    def __init__(self, *, max_entries: int = 256, max_bytes: int = 8 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: OrderedDict[int, tuple[bytes, bytes]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0

    def get(self, body: bytes) -> bytes | None:
        with self._lock:
            hit = self._data.get(id(body))
            if hit is None or hit[0] is not body:
                return None
            self._data.move_to_end(id(body))
            return hit[1]

    def put(self, body: bytes, gz: bytes) -> None:
        """Keep ``gz`` for this very ``body`` object (counted at both sizes, as both stay alive)."""
        cost = len(body) + len(gz)
        if cost > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(id(body), None)
            if old is not None:
                self.bytes -= len(old[0]) + len(old[1])
            self._data[id(body)] = (body, gz)
            self.bytes += cost
            while len(self._data) > self.max_entries or self.bytes > self.max_bytes:
                _, (b, g) = self._data.popitem(last=False)
                self.bytes -= len(b) + len(g)

    def __len__(self) -> int:
        return len(self._data)
