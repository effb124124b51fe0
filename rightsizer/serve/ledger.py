"""The auto-apply ledger: which nodes were disrupted each day, handed to an apply, finished.

Two homes: a JSON file in ``state_dir`` (one replica), or a ConfigMap in the cluster
(``auto_apply.leader_election``), so a replica that takes over after the leader died reads what the
dead one did. :class:`Entries` holds three kinds of record (stored as ``YYYY-MM-DD``,
``plan:<id>`` and ``started:<id>`` keys of one JSON object):

- ``days``: day → nodes cordoned for a MIG change that day (the daily budget; the node annotations
  ``gpupilot.io/cordoned-at`` count too, so a node a dead replica touched is never missed);
- ``tried``: plan id → nodes an apply finished with (applied, rolled back, skipped, …);
- ``started``: plan id → nodes handed to an apply that has not reported yet, written *before* the
  apply starts and cleared once the cluster shows the node settled (not in flight).

The ConfigMap is replaced with its ``resourceVersion``; a concurrent writer makes :meth:`save` raise
:class:`LedgerConflict` and the job skips this round.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Protocol

from gpupilot_common import atomicfile, yamlsafe
from rightsizer.clients.kube import ConflictError, Kube
from rightsizer.errors import RightsizerError

log = logging.getLogger(__name__)

DATA_KEY = "ledger.json"
DAMAGED_KEY = "ledger.json.damaged"
"""Where a ledger that could not be read is kept (a ConfigMap key, or a file beside the ledger) when
the next save starts a new one: a damaged ledger is set aside, never silently overwritten."""
CONFIGMAP = "gpupilot-rightsizer-ledger"
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")

NodeLists = dict[str, list[str]]
KEEP_DAYS = 31


@dataclass
class Entries:
    days: NodeLists = field(default_factory=dict)
    tried: NodeLists = field(default_factory=dict)
    started: NodeLists = field(default_factory=dict)

    def day(self, day: str) -> set[str]:
        return set(self.days.get(day, ()))

    def add_day(self, day: str, nodes: set[str]) -> None:
        if nodes - self.day(day):
            self.days[day] = sorted(self.day(day) | nodes)

    def tried_in(self, plan_id: str) -> set[str]:
        return set(self.tried.get(plan_id, ()))

    def add_tried(self, plan_id: str, nodes: set[str]) -> None:
        if nodes:
            self.tried[plan_id] = sorted(self.tried_in(plan_id) | nodes)

    def set_started(self, plan_id: str, nodes: set[str]) -> None:
        if nodes:
            self.started[plan_id] = sorted(nodes)
        else:
            self.started.pop(plan_id, None)

    def clear_settled(
        self, in_flight: set[str], *, disrupted: set[str] | None = None, day: str = ""
    ) -> set[str]:
        """Drop ``started`` nodes the cluster shows settled (no run has them in flight); returns them.

        ``disrupted``: the nodes the cluster shows cordoned on ``day``. A settled node among them was
        finished by a run that never reported (a replica killed between two nodes): it is recorded
        here as that run would have — disrupted on ``day``, tried by the plan that started it — so
        the ledger agrees with the cluster."""
        cleared: set[str] = set()
        for plan_id, nodes in list(self.started.items()):
            settled = set(nodes) - in_flight
            cleared |= settled
            self.set_started(plan_id, set(nodes) - settled)
            finished = settled & (disrupted or set())
            if finished and day:
                self.add_day(day, finished)
                self.add_tried(plan_id, finished)
        return cleared

    def prune(self, *, plan_id: str, today: date, keep_days: int = KEEP_DAYS) -> None:
        """Bound the ledger (a ConfigMap holds at most 1 MiB): days older than ``keep_days``, and what
        older plans tried (a node is tried once per plan; only the current plan is ever applied)."""
        cutoff = (today - timedelta(days=keep_days)).isoformat()
        self.days = {d: nodes for d, nodes in self.days.items() if d >= cutoff}
        self.tried = {p: nodes for p, nodes in self.tried.items() if p == plan_id}

    def to_json(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = dict(self.days)
        out.update({f"plan:{k}": v for k, v in self.tried.items()})
        out.update({f"started:{k}": v for k, v in self.started.items()})
        return out

    @classmethod
    def from_json(cls, data: object) -> Entries:
        """What a file or ConfigMap holds; entries of any other shape are dropped."""
        entries = cls()
        if not isinstance(data, dict):
            return entries
        for key, value in data.items():
            if not isinstance(key, str) or not isinstance(value, list):
                continue
            nodes = [str(x) for x in value]
            kind, _, rest = key.partition(":")
            if kind == "plan" and rest:
                entries.tried[rest] = nodes
            elif kind == "started" and rest:
                entries.started[rest] = nodes
            elif _DAY.match(key):
                entries.days[key] = nodes
        return entries


class LedgerConflict(RightsizerError):
    """Someone else wrote the ledger between our read and our write."""


class Ledger(Protocol):
    def load(self) -> Entries: ...

    def save(self, entries: Entries) -> None:
        """Write ``entries``, which must come from the last :meth:`load` plus changes."""
        ...


def _text(entries: Entries) -> str:
    return json.dumps(entries.to_json(), indent=1, sort_keys=True)


class FileLedger:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Entries:
        self._damaged: str | None = None
        try:
            text = yamlsafe.read_text(self.path)  # a regular file, bounded, UTF-8
        except FileNotFoundError:
            return Entries()
        except (OSError, ValueError) as exc:
            log.error("ledger %s cannot be read (%s); starting a new one", self.path, exc)
            return Entries()
        try:
            return Entries.from_json(json.loads(text))
        except (ValueError, RecursionError) as exc:
            self._damaged = text
            log.error(
                "ledger %s is not valid (%s); starting a new one, the damaged file is kept as %s",
                self.path,
                str(exc)[:200],
                self.path.with_name(f"{self.path.name}.damaged"),
            )
            return Entries()

    def save(self, entries: Entries) -> None:
        """Atomically: a temporary file in the same directory, fsynced, renamed over the ledger. A
        ledger that :meth:`load` could not read is first kept beside it (``<name>.damaged``)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        damaged = getattr(self, "_damaged", None)
        if damaged is not None:
            atomicfile.write_text(self.path.with_name(f"{self.path.name}.damaged"), damaged)
            self._damaged = None
        atomicfile.write_text(self.path, _text(entries))


class ConfigMapLedger:
    def __init__(self, kube: Kube, namespace: str, *, name: str = CONFIGMAP) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self._seen: dict[str, object] | None = None

    def load(self) -> Entries:
        cm = self.kube.get_configmap(self.namespace, self.name)
        self._seen = cm
        self._damaged: str | None = None
        if cm is None:
            return Entries()
        data = cm.get("data") or {}
        text = str(data.get(DATA_KEY) or "{}") if isinstance(data, dict) else "{}"
        try:
            return Entries.from_json(json.loads(text))
        except (ValueError, RecursionError) as exc:
            self._damaged = text
            log.error(
                "ledger ConfigMap %s/%s: %s is not valid (%s); starting a new one, the damaged text is "
                "kept under %s",
                self.namespace,
                self.name,
                DATA_KEY,
                str(exc)[:200],
                DAMAGED_KEY,
            )
            return Entries()

    def save(self, entries: Entries) -> None:
        data = {DATA_KEY: _text(entries)}
        damaged = getattr(self, "_damaged", None)
        kept = ((self._seen or {}).get("data") or {}) if isinstance(self._seen, dict) else {}
        if damaged is not None:
            data[DAMAGED_KEY] = damaged
        elif isinstance(kept, dict) and DAMAGED_KEY in kept:
            data[DAMAGED_KEY] = str(kept[DAMAGED_KEY])
        try:
            if self._seen is None:
                self._seen = self.kube.create_configmap(self.namespace, self.name, data)
            else:
                self._seen = self.kube.replace_configmap({**self._seen, "data": data})
        except ConflictError as exc:
            self._seen = None
            raise LedgerConflict(
                f"ConfigMap {self.namespace}/{self.name} changed since it was read ({exc}); skipped this round"
            ) from exc
