"""One memory budget per process for Prometheus answers being read and parsed.

Each answer is charged as it is read, chunk by chunk, for what it will cost once parsed
(:func:`parse_cost`): not a fixed multiple of its bytes, because what a byte costs depends on the
answer's shape — a compact answer (few, short labels per series) makes more Python objects per byte
than a wide one. Measured as the growth of resident memory while parsing into samples, per byte of
answer: 13.6x for series without labels (44 bytes each), 14.8x with one label, 11.4x with three,
6.8x for dcgm-exporter's series (10 labels, 320 bytes), 4.8x for 20 long labels (880 bytes).
A linear fit over bytes, series and label pairs (which the reader counts as it reads) is within 9 %
of every one of them; the coefficients below are rounded up, so the charge errs high (by up to
18 % on wide answers). The charge is given back when the samples are built (or the read fails). So answers in
flight never hold more than the budget, however many requests arrive at once (the per-answer
limits, ``--max-answer-bytes``/``--max-answer-series``, bound each one; this bounds them all
together).

When a chunk does not fit, whether the read waits follows "wait-die", so that reads holding part of
the budget never wait for each other in a circle: a read that has not started yet (holds nothing)
and the oldest read in flight wait up to ``wait`` seconds for room (a new read also waits while the
oldest does, so room that frees goes to the oldest); any other read in flight stops at once,
giving back what it held. A read stops with :class:`BudgetExceeded`, naming the budget and the
flag, also when its wait ends, and at once when the answer alone is more than the whole budget.

Values kept in memory between refreshes are held against the same budget, at what their samples
take once parsed (:func:`held_cost`, measured the same way: 12.8x the bytes for bare series, 3.1x
for wide ones; the refresher calls :meth:`MemoryBudget.hold`), within half of it, so reads always have the other half: a value that does not fit is served to the
requests waiting for it and not kept (the next request evaluates it again).

The default is half the container's memory limit (cgroup v2 ``memory.max``, v1
``memory.limit_in_bytes``), leaving the other half to the process itself, the values held in
memory and the pod index; without a limit, :data:`DEFAULT_BYTES`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

PARSE_PER_BYTE, PARSE_PER_LABEL, PARSE_PER_SERIES = 2, 130, 640
"""Resident memory while an instant answer is parsed into samples: per byte of JSON text, per label
pair, per series (fitted to the measurements above: 1.62, 112, 580; rounded up)."""
HELD_PER_BYTE, HELD_PER_LABEL, HELD_PER_SERIES = 1, 90, 640
"""What its samples keep afterwards (fitted: 0.64, 79, 591; rounded up)."""


def parse_cost(nbytes: int, series: int, labels: int) -> int:
    """Memory an answer of ``nbytes`` bytes holding ``series`` series and ``labels`` label pairs takes
    while it is parsed (its text included)."""
    return PARSE_PER_BYTE * nbytes + PARSE_PER_LABEL * labels + PARSE_PER_SERIES * series


def held_cost(nbytes: int, series: int, labels: int) -> int:
    """Memory the samples of such an answer keep once parsed."""
    return HELD_PER_BYTE * nbytes + HELD_PER_LABEL * labels + HELD_PER_SERIES * series


DEFAULT_BYTES = 512 << 20
"""Without a container memory limit."""

CGROUP_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
_NO_LIMIT = 1 << 60
"""cgroup v1 writes a huge number (about 2**63) for "no limit"."""

FLAG = "--memory-budget"
_POLL = 0.005


_parsed = threading.local()


def note_parsed(held: int) -> None:
    """Called by the client when an answer became samples that keep ``held`` bytes
    (:func:`held_cost`), in the caller's thread."""
    _parsed.total = getattr(_parsed, "total", 0) + held


def take_parsed() -> int:
    """What the samples of the answers parsed in this thread since the last call keep (the refresher
    asks around one evaluation)."""
    total: int = getattr(_parsed, "total", 0)
    _parsed.total = 0
    return total


def container_limit(files: tuple[Path, ...] = CGROUP_FILES) -> int | None:
    """The container's memory limit in bytes, or None (no cgroup file, ``max``, unreadable)."""
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) < _NO_LIMIT:
            return int(text)
        return None
    return None


def default_budget(files: tuple[Path, ...] = CGROUP_FILES) -> int:
    limit = container_limit(files)
    return DEFAULT_BYTES if limit is None else limit // 2


def mib(n: float) -> str:
    return f"{n / (1 << 20):.0f} MiB"


class BudgetExceeded(Exception):
    """The answer could not be read within the budget; ``str()`` is one line naming it."""


class Lease:
    """What one answer holds of the budget; :meth:`release` gives it back (safe to call twice)."""

    __slots__ = ("_budget", "held", "query", "read", "seq")

    def __init__(self, budget: MemoryBudget, query: str, seq: int) -> None:
        self._budget = budget
        self.query = query
        self.held = 0
        self.read = 0
        """Bytes of the answer read so far (for messages)."""
        self.seq = seq
        """Order of the first charge (smaller = older); 0 before it."""

    async def charge_to(self, cost: int, *, read: int) -> None:
        """Hold ``cost`` in all (:func:`parse_cost` of what was read so far: ``read`` bytes), waiting
        for room for what it adds."""
        self.read = read
        if cost > self.held:
            await self._budget.take(self, cost - self.held)

    def release(self) -> None:
        self._budget.give_back(self)


class MemoryBudget:
    """Thread-safe; the waits run on the caller's event loop."""

    def __init__(self, limit: int, *, wait: float = 1.0) -> None:
        if limit < 1 << 20:
            raise ValueError(f"{FLAG} {limit}: at least 1 MiB")
        self.limit = limit
        self.wait = wait
        """Seconds a chunk waits for room before the read fails."""
        self._lock = threading.Lock()
        self.used = 0
        self.peak = 0
        """Highest charge seen (tests, the bench)."""
        self.refused = 0
        self.held = 0
        """Part of ``used`` held by values kept in memory (at most half the limit)."""
        self._active: dict[int, Lease] = {}
        """Reads holding part of the budget, by ``seq`` (insertion order = age)."""
        self._seq = 0
        self._oldest_waiting = False

    def lease(self, query: str) -> Lease:
        return Lease(self, query, 0)

    def _try(self, lease: Lease, amount: int) -> str:
        """``taken``; ``alone`` (it can never fit); ``wait`` or ``die`` (see the module's docstring)."""
        with self._lock:
            started = lease.held > 0
            oldest = started and next(iter(self._active)) == lease.seq
            gate = not started and self._oldest_waiting  # the oldest gets the room that frees first
            if self.used + amount <= self.limit and not gate:
                if not started:
                    self._seq += 1
                    lease.seq = self._seq
                    self._active[lease.seq] = lease
                self.used += amount
                lease.held += amount
                self.peak = max(self.peak, self.used)
                if oldest:
                    self._oldest_waiting = False
                return "taken"
            if self.used - self.held - lease.held == 0 and not gate:
                return "alone"  # no other read to wait for (values kept change only at refreshes)
            if not started or oldest:
                self._oldest_waiting = self._oldest_waiting or oldest
                return "wait"
            return "die"

    async def take(self, lease: Lease, amount: int) -> None:
        deadline = time.monotonic() + self.wait
        while True:
            got = self._try(lease, amount)
            if got == "taken":
                return
            if got != "wait" or time.monotonic() >= deadline:
                self._refuse(lease, amount, alone=got == "alone")
            await asyncio.sleep(_POLL)

    def _refuse(self, lease: Lease, amount: int, *, alone: bool) -> None:
        read, parsed = lease.read, lease.held + amount
        whole = alone and parsed > self.limit
        with self._lock:
            self.refused += 1
        self.give_back(lease)
        if whole:
            raise BudgetExceeded(
                f"the answer to {lease.query} is over {mib(read)} and would take more than the adapter's "
                f"whole memory budget for Prometheus answers ({FLAG} {mib(self.limit)}; parsed, it "
                f"would take about {mib(parsed)} or more); narrow the query or raise {FLAG} with "
                "the container's memory limit"
            )
        raise BudgetExceeded(
            f"the adapter's memory budget for Prometheus answers ({FLAG} {mib(self.limit)}) is taken "
            f"by other answers being read or kept; the answer to {lease.query} was stopped after {mib(read)}; "
            f"retry shortly, or raise {FLAG} with the container's memory limit"
        )

    def hold(self, amount: int) -> bool:
        """Hold ``amount`` for a value kept in memory; False (nothing held) when it does not fit in
        the half of the budget values may hold, or in what reads leave free."""
        with self._lock:
            if self.held + amount > self.limit // 2 or self.used + amount > self.limit:
                return False
            self.held += amount
            self.used += amount
            self.peak = max(self.peak, self.used)
            return True

    def unhold(self, amount: int) -> None:
        with self._lock:
            self.held -= amount
            self.used -= amount

    def give_back(self, lease: Lease) -> None:
        with self._lock:
            self.used -= lease.held
            lease.held = 0
            if self._active and next(iter(self._active)) == lease.seq:
                self._oldest_waiting = False  # the oldest left: the next oldest asks again
            self._active.pop(lease.seq, None)
