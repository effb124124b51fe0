"""Legacy API discovery documents, so that ``kubectl`` (which asks before every verb) works against the double."""

from __future__ import annotations

from typing import Any

from tests.support.kubedouble.store import KINDS, Kind

_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def discovery(path: str) -> dict[str, Any] | None:
    """Legacy discovery documents (``/api``, ``/apis``, ``/api/v1``, ``/apis/{group}/{version}``) for kubectl."""
    path = path.rstrip("/")
    groups: dict[str, list[Kind]] = {}
    for k in KINDS:
        groups.setdefault(k.api_version, []).append(k)
    if path == "/api":
        return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
    if path == "/apis":
        return {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {
                    "name": gv.split("/")[0],
                    "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                    "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]},
                }
                for gv in groups
                if "/" in gv
            ],
        }
    gv = "v1" if path == "/api/v1" else path.removeprefix("/apis/") if path.startswith("/apis/") else None
    if gv is None or gv not in groups:
        return None
    resources = []
    for k in groups[gv]:
        verbs = ["create"] if not k.storable else _VERBS
        resources.append(
            {
                "name": k.plural,
                "singularName": k.kind.lower(),
                "namespaced": k.namespaced,
                "kind": k.kind,
                "verbs": verbs,
            }
        )
        if k.plural == "pods":
            resources.append(
                {
                    "name": "pods/eviction",
                    "singularName": "",
                    "namespaced": True,
                    "kind": "Eviction",
                    "group": "policy",
                    "version": "v1",
                    "verbs": ["create"],
                }
            )
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}
