"""The double's object store: one lock, a global resourceVersion, a watch history and a journal.

Every write bumps the global resourceVersion, stamps it on the object, appends a watch event to the
history (so ``?watch=true&resourceVersion=N`` replays what happened after N) and appends a
:class:`Action` to the journal (so tests can check the *order* of what clients did).
"""

from __future__ import annotations

import copy
import datetime as dt
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Kind:
    """One REST resource the double serves."""

    group: str  # "" for core
    version: str
    plural: str
    kind: str
    namespaced: bool
    storable: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS: tuple[Kind, ...] = (
    Kind("", "v1", "nodes", "Node", namespaced=False),
    Kind("", "v1", "pods", "Pod", namespaced=True),
    Kind("", "v1", "configmaps", "ConfigMap", namespaced=True),
    Kind("", "v1", "events", "Event", namespaced=True),
    Kind("", "v1", "namespaces", "Namespace", namespaced=False),
    Kind("events.k8s.io", "v1", "events", "Event", namespaced=True),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", namespaced=True),
    Kind("nvidia.com", "v1", "clusterpolicies", "ClusterPolicy", namespaced=False),
    Kind("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", namespaced=True),
    Kind("metrics.k8s.io", "v1beta1", "pods", "PodMetrics", namespaced=True),
    Kind("apps", "v1", "daemonsets", "DaemonSet", namespaced=True),
    Kind("apiregistration.k8s.io", "v1", "apiservices", "APIService", namespaced=False),
    Kind("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False, storable=False),
    Kind(
        "authorization.k8s.io",
        "v1",
        "subjectaccessreviews",
        "SubjectAccessReview",
        namespaced=False,
        storable=False,
    ),
)


def find_kind(group: str, version: str, plural: str) -> Kind | None:
    for k in KINDS:
        if (k.group, k.version, k.plural) == (group, version, plural):
            return k
    return None


def storage_key(kind: Kind) -> str:
    """core/v1 events and events.k8s.io/v1 events are one store (as on a real cluster)."""
    return "events" if kind.plural == "events" else f"{kind.group}/{kind.plural}"


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Action:
    """One thing that happened, in order: a client write or a MIG Manager step."""

    seq: int
    verb: str  # create, update, patch, delete, evict, mig-manager
    resource: str  # plural (nodes, pods, configmaps, ...)
    namespace: str
    name: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class WatchEvent:
    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    skey: str
    obj: dict[str, Any]


class Store:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._rv = 100
        self.history: list[WatchEvent] = []
        self.journal: list[Action] = []
        self.closed = False

    # -- reading -------------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

    def get(self, skey: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self._objects.get((skey, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def list(self, skey: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            out = [
                copy.deepcopy(o)
                for (k, ns, _), o in sorted(self._objects.items())
                if k == skey and (namespace is None or ns == namespace)
            ]
        return out

    # -- writing -------------------------------------------------------------------------------
    def _bump(self, obj: dict[str, Any]) -> None:
        self._rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self._rv)

    def put(self, skey: str, obj: dict[str, Any], *, event: str) -> dict[str, Any]:
        """Store ``obj`` (ADDED or MODIFIED), bumping its resourceVersion; returns a copy."""
        with self.lock:
            meta = obj.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now_rfc3339())
            self._bump(obj)
            key = (skey, meta.get("namespace", ""), meta["name"])
            self._objects[key] = copy.deepcopy(obj)
            self.history.append(WatchEvent(self._rv, event, skey, copy.deepcopy(obj)))
            self.changed.notify_all()
            return copy.deepcopy(obj)

    def remove(self, skey: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self._objects.pop((skey, namespace, name), None)
            if obj is None:
                return None
            self._bump(obj)
            self.history.append(WatchEvent(self._rv, "DELETED", skey, copy.deepcopy(obj)))
            self.changed.notify_all()
            return obj

    def record(self, verb: str, resource: str, namespace: str, name: str, **detail: Any) -> None:
        with self.lock:
            self.journal.append(Action(len(self.journal), verb, resource, namespace, name, detail))

    def update(
        self, skey: str, namespace: str, name: str, change: Callable[[dict[str, Any]], None]
    ) -> dict[str, Any] | None:
        """Read-modify-write under the lock (used by the double's own controllers)."""
        with self.lock:
            obj = self.get(skey, namespace, name)
            if obj is None:
                return None
            before = copy.deepcopy(obj)
            change(obj)
            if obj == before:
                return obj
            return self.put(skey, obj, event="MODIFIED")

    def events_after(self, rv: int) -> Iterator[WatchEvent]:
        with self.lock:
            items = [e for e in self.history if e.rv > rv]
        yield from items

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.changed.notify_all()
