"""The auto-apply ledger: which nodes were handed to an apply, which finished, how many per day.

Two homes: a JSON file in ``state_dir`` (one replica), or a ConfigMap in the cluster
(``auto_apply.leader_election``), so a replica that takes over after the leader died reads what the
dead one did. Entries:

- ``YYYY-MM-DD`` → nodes applied that day (the daily budget);
- ``plan:<id>`` → nodes of that plan an apply finished with (applied, rolled back, skipped, …);
- ``started:<id>`` → nodes handed to an apply that has not reported yet. Written *before* the apply
  starts: after a failover they are resumed (the node annotations make apply continue where the dead
  replica stopped, never repeat a step), not started afresh.

The ConfigMap is replaced with its ``resourceVersion``; a concurrent writer makes :meth:`save` raise
:class:`LedgerConflict` and the job skips this round.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from gpupilot_common import atomicfile
from rightsizer.clients.kube import ConflictError, Kube
from rightsizer.errors import RightsizerError

DATA_KEY = "ledger.json"
CONFIGMAP = "gpupilot-rightsizer-ledger"

Entries = dict[str, list[str]]


class LedgerConflict(RightsizerError):
    """Someone else wrote the ledger between our read and our write."""


class Ledger(Protocol):
    def load(self) -> Entries: ...

    def save(self, entries: Entries) -> None:
        """Write ``entries``, which must come from the last :meth:`load` plus changes."""
        ...


def _clean(data: object) -> Entries:
    if not isinstance(data, dict):
        return {}
    return {str(k): [str(x) for x in v] for k, v in data.items() if isinstance(v, list)}


class FileLedger:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> Entries:
        try:
            return _clean(json.loads(self.path.read_text()))
        except (OSError, ValueError):
            return {}

    def save(self, entries: Entries) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomicfile.write_text(self.path, json.dumps(entries, indent=1, sort_keys=True))


class ConfigMapLedger:
    def __init__(self, kube: Kube, namespace: str, *, name: str = CONFIGMAP) -> None:
        self.kube, self.namespace, self.name = kube, namespace, name
        self._seen: dict[str, object] | None = None

    def load(self) -> Entries:
        cm = self.kube.get_configmap(self.namespace, self.name)
        self._seen = cm
        if cm is None:
            return {}
        try:
            return _clean(json.loads((cm.get("data") or {}).get(DATA_KEY) or "{}"))
        except ValueError:
            return {}

    def save(self, entries: Entries) -> None:
        data = {DATA_KEY: json.dumps(entries, indent=1, sort_keys=True)}
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
