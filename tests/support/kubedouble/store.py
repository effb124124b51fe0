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
    Kind("apps", "v1", "replicasets", "ReplicaSet", namespaced=True),
    Kind("apps", "v1", "deployments", "Deployment", namespaced=True),
    Kind("apps", "v1", "statefulsets", "StatefulSet", namespaced=True),
    Kind("batch", "v1", "jobs", "Job", namespaced=True),
    Kind("batch", "v1", "cronjobs", "CronJob", namespaced=True),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
    Kind("nvidia.com", "v1", "clusterpolicies", "ClusterPolicy", namespaced=False),
    Kind("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler", namespaced=True),
    Kind("metrics.k8s.io", "v1beta1", "pods", "PodMetrics", namespaced=True),
    Kind("apps", "v1", "daemonsets", "DaemonSet", namespaced=True),
    Kind("apiregistration.k8s.io", "v1", "apiservices", "APIService", namespaced=False),
    # What a chart installs besides (Helm's lookup and --dry-run=server map every rendered kind).
    Kind("", "v1", "secrets", "Secret", namespaced=True),
    Kind("", "v1", "serviceaccounts", "ServiceAccount", namespaced=True),
    Kind("", "v1", "services", "Service", namespaced=True),
    Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", namespaced=True),
    Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False),
    Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
    Kind("rbac.authorization.k8s.io", "v1", "roles", "Role", namespaced=True),
    Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", namespaced=True),
    Kind("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", namespaced=True),
    Kind("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", namespaced=False),
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


Hook = Callable[[str], None]
"""``hook(skey)``: a controller of the double reacting to a write of kind ``skey`` (under the lock)."""


class Store:
    def __init__(self, *, history_limit: int = 5000) -> None:
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._kinds: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        """The same objects by kind (``skey`` → (namespace, name) → object): lists read one kind."""
        self._rv = 100
        self.history: list[WatchEvent] = []
        self.history_limit = history_limit
        """Watch events kept (the watch cache's window); a watch from before it gets 410 Expired."""
        self.compacted_rv = self._rv
        """Oldest resourceVersion a watch may still start from (events after it are in ``history``)."""
        self.journal: list[Action] = []
        self.closed = False
        self.hooks: list[Hook] = []
        self._in_hooks = False
        self._dirty: list[str] = []

    # -- reading -------------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        return self._rv

    def get(self, skey: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self._objects.get((skey, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def view(self, skey: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """The stored objects themselves, read-only, as :meth:`list` orders them: for the double's
        controllers, which read on every write and change objects only through :meth:`update` /
        :meth:`put` (a stored object is replaced on each write, never changed in place, so a view
        is a snapshot)."""
        with self.lock:
            kind = self._kinds.get(skey) or {}
            return [o for (ns, _), o in sorted(kind.items()) if namespace is None or ns == namespace]

    def list(self, skey: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Copies of the objects of one kind (of ``namespace``), by namespace and name."""
        return [copy.deepcopy(o) for o in self.view(skey, namespace)]

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
            self._objects[key] = self._kinds.setdefault(skey, {})[key[1:]] = copy.deepcopy(obj)
            self._append(WatchEvent(self._rv, event, skey, copy.deepcopy(obj)))
            out = copy.deepcopy(obj)
            self._run_hooks(skey)
            return out

    def remove(self, skey: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            stored = self._objects.pop((skey, namespace, name), None)
            if stored is None:
                return None
            del self._kinds[skey][(namespace, name)]
            obj = copy.deepcopy(stored)  # a view taken before keeps the object as it was
            self._bump(obj)
            self._append(WatchEvent(self._rv, "DELETED", skey, copy.deepcopy(obj)))
            self._run_hooks(skey)
            return obj

    def _append(self, event: WatchEvent) -> None:
        self.history.append(event)
        if len(self.history) > self.history_limit:
            drop = len(self.history) - self.history_limit
            self.compacted_rv = self.history[drop - 1].rv
            del self.history[:drop]
        self.changed.notify_all()

    def compact(self, up_to: int | None = None) -> None:
        """Forget the watch history up to ``up_to`` (default: now), as etcd compaction and the watch
        cache's window do: a watch from an older resourceVersion gets ``410 Expired``."""
        with self.lock:
            rv = self._rv if up_to is None else min(up_to, self._rv)
            self.history = [e for e in self.history if e.rv > rv]
            self.compacted_rv = max(self.compacted_rv, rv)

    def _run_hooks(self, skey: str) -> None:
        """Let the double's controllers react; their own writes queue instead of recursing."""
        self._dirty.append(skey)
        if self._in_hooks:
            return
        self._in_hooks = True
        try:
            for _ in range(50):  # controllers converge in a few passes; a bound stops a ping-pong
                if not self._dirty:
                    break
                batch, self._dirty = self._dirty, []
                for key in dict.fromkeys(batch):
                    for hook in self.hooks:
                        hook(key)
        finally:
            self._dirty.clear()
            self._in_hooks = False

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
            if obj == before:  # no change, no write: as the generic registry store (see ``unchanged``)
                return obj
            return self.put(skey, obj, event="MODIFIED")

    def unchanged(self, skey: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The stored object when ``obj`` equals it but for ``resourceVersion``, else None.

        k8s.io/apiserver ``storage/etcd3/store.go`` ``GuaranteedUpdate``: when the encoded new object is
        byte-equal to the stored one (``!origState.stale && bytes.Equal(data, origState.data)``) the
        write is skipped, so the resourceVersion stays and no watch event is sent.
        """
        meta = obj.get("metadata") or {}
        with self.lock:
            current = self._objects.get((skey, meta.get("namespace", "") or "", meta.get("name", "")))
            if current is None:
                return None
            a, b = copy.deepcopy(current), copy.deepcopy(obj)
            a["metadata"].pop("resourceVersion", None)
            b.setdefault("metadata", {}).pop("resourceVersion", None)
            return copy.deepcopy(current) if a == b else None

    def events_after(self, rv: int) -> Iterator[WatchEvent]:
        with self.lock:
            items = [e for e in self.history if e.rv > rv]
        yield from items

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.changed.notify_all()
