"""Encoded answers served from memory, kept until what they were built from changes.

An HPA asks the same question (metric, namespace, selector) every 15 s, and several HPAs or
replicas of the controller may ask it in between; the answer only changes when the values are
re-evaluated or the selector picks other pods. So an answer is stored, encoded, under the request
(API version, metric, resource, namespace, object, selectors) together with what it was built from:
the evaluation's ``generation`` (unique per refresh) and the pod source's list of selected pods (the
same object while the pod source is unchanged). A request whose evaluation and pod list are those
gets the stored bytes; anything else is a miss, and the caller encodes and stores the new answer.

Bounded by entries and by bytes (least recently used out first), so many distinct selectors cannot
grow memory; a selected pod list kept alive by an entry is counted at ``POD_BYTES`` a pod.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

POD_BYTES = 100
"""What a kept list of selected pods costs per pod (the list slot and its ``Pod`` object)."""


class AnswerCache:
    def __init__(self, *, max_entries: int = 1024, max_bytes: int = 8 * 1024 * 1024) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("the answer cache needs room for at least one entry and one byte")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: OrderedDict[Hashable, tuple[int, object, bytes, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable, *, generation: int, pods: object) -> bytes | None:
        """The stored answer if it was built from evaluation ``generation`` and this very ``pods``
        list (identity, not equality: the pod source hands out one list per unchanged selection)."""
        with self._lock:
            hit = self._data.get(key)
            if hit is None or hit[0] != generation or hit[1] is not pods:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return hit[2]

    def put(self, key: Hashable, body: bytes, *, generation: int, pods: object) -> None:
        cost = len(body) + POD_BYTES * (len(pods) if isinstance(pods, list) else 0)
        if cost > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self.bytes -= old[3]
            self._data[key] = (generation, pods, body, cost)
            self.bytes += cost
            while len(self._data) > self.max_entries or self.bytes > self.max_bytes:
                _, dropped = self._data.popitem(last=False)
                self.bytes -= dropped[3]

    def __len__(self) -> int:
        return len(self._data)
