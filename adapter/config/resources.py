"""Kubernetes resources the custom metrics API can describe: plural name, group, kind, scope.

Paths may name a resource plainly (``pods``) or group-qualified (``deployments.apps``); the config may
also use the singular or kind (``pod``, ``Pod``). All of them resolve to one :class:`Resource`.
"""

from __future__ import annotations

from typing import NamedTuple


class Resource(NamedTuple):
    """A named tuple: part of every per-request lookup key, hashed and compared in C."""

    plural: str
    group: str
    kind: str
    namespaced: bool

    @property
    def qualified(self) -> str:
        """``pods`` for the core group, ``deployments.apps`` otherwise (the discovery name)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def api_version(self) -> str:
        """``describedObject.apiVersion`` as the HPA expects it: ``/v1`` for the core group."""
        return f"{self.group}/v1"


KNOWN: tuple[Resource, ...] = (
    Resource("pods", "", "Pod", True),
    Resource("nodes", "", "Node", False),
    Resource("namespaces", "", "Namespace", False),
    Resource("services", "", "Service", True),
    Resource("deployments", "apps", "Deployment", True),
    Resource("statefulsets", "apps", "StatefulSet", True),
    Resource("replicasets", "apps", "ReplicaSet", True),
    Resource("daemonsets", "apps", "DaemonSet", True),
    Resource("jobs", "batch", "Job", True),
)

_ALIASES: dict[str, Resource] = {}
for _r in KNOWN:
    for _alias in (_r.plural, _r.qualified, _r.kind.lower(), _r.plural[:-1]):
        _ALIASES[_alias] = _r


def lookup(name: str) -> Resource | None:
    """The resource for ``pods``, ``pod``, ``Pod``, ``deployments.apps`` …; None when unknown."""
    return _ALIASES.get(name.lower())


PODS = _ALIASES["pods"]
NODES = _ALIASES["nodes"]
NAMESPACES = _ALIASES["namespaces"]
