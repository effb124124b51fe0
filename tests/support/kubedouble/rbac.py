"""RBAC manifests (Role, ClusterRole and their bindings) as the double's authorization rules.

Follows ``plugin/pkg/auth/authorizer/rbac/rbac.go`` and ``pkg/apis/rbac/v1/evaluation_helpers.go``:

- a rule allows a request when verb, API group, resource (``resource/subresource`` as one string, so
  ``pods`` does not grant ``pods/eviction``) and, when listed, ``resourceNames`` all match; ``*``
  matches anything;
- a ClusterRoleBinding grants in every namespace; a RoleBinding only in its own (whether it points at
  a Role or a ClusterRole);
- a ServiceAccount subject is the user ``system:serviceaccount:NS:NAME``; one without a namespace gets
  ``default_namespace`` (what kustomize's ``namespace:`` fills in on install).

Two ClusterRoles every cluster bootstraps are built in (``plugin/pkg/auth/authorizer/rbac/
bootstrappolicy/policy.go``): ``system:auth-delegator`` and the ``kube-system`` Role
``extension-apiserver-authentication-reader``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tests.support.kubedouble.server import Rule
from tests.support.yamldocs import load_all

BUILTIN_ROLES: dict[tuple[str, str, str], list[dict[str, Any]]] = {
    ("ClusterRole", "", "system:auth-delegator"): [
        {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
        {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]},
    ],
    ("Role", "kube-system", "extension-apiserver-authentication-reader"): [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["extension-apiserver-authentication"],
            "verbs": ["get", "list", "watch"],
        }
    ],
}


def _documents(paths: Iterable[Path]) -> Iterator[dict[str, Any]]:
    for path in paths:
        files = sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
        for f in files:
            for doc in load_all(f.read_text()):
                if isinstance(doc, dict) and str(doc.get("apiVersion", "")).startswith(
                    "rbac.authorization.k8s.io/"
                ):
                    yield doc


def _subjects(binding: dict[str, Any], default_namespace: str) -> list[str]:
    out = []
    for s in binding.get("subjects") or []:
        if s.get("kind") == "ServiceAccount":
            ns = s.get("namespace") or binding["metadata"].get("namespace") or default_namespace
            out.append(f"system:serviceaccount:{ns}:{s['name']}")
        else:  # User or Group: the name is the subject
            out.append(str(s["name"]))
    return out


def _expand(subject: str, namespace: str, rule: dict[str, Any]) -> Iterator[Rule]:
    for group in rule.get("apiGroups") or ["*"]:
        for res in rule.get("resources") or []:
            resource, _, sub = str(res).partition("/")
            if res == "*":
                sub = "*"
            for verb in rule.get("verbs") or []:
                for name in rule.get("resourceNames") or ["*"]:
                    yield Rule(subject, verb, resource, group, namespace, sub, name)


def load_rbac_rules(paths: Iterable[Path], *, default_namespace: str) -> list[Rule]:
    """The rules the bindings in ``paths`` grant (roles they reference may be built in)."""
    docs = list(_documents(paths))
    roles = dict(BUILTIN_ROLES)
    for d in docs:
        if d.get("kind") in ("Role", "ClusterRole"):
            ns = (d["metadata"].get("namespace") or default_namespace) if d["kind"] == "Role" else ""
            roles[(d["kind"], ns, d["metadata"]["name"])] = list(d.get("rules") or [])
    rules: list[Rule] = []
    for d in docs:
        if d.get("kind") not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        ref = d["roleRef"]
        binding_ns = (
            (d["metadata"].get("namespace") or default_namespace) if d["kind"] == "RoleBinding" else ""
        )
        role_ns = binding_ns if ref["kind"] == "Role" else ""
        role = roles.get((ref["kind"], role_ns, ref["name"]))
        if role is None:
            raise ValueError(f"{d['kind']} {d['metadata']['name']}: {ref['kind']} {ref['name']} not found")
        scope = binding_ns or "*"
        for subject in _subjects(d, default_namespace):
            for r in role:
                rules.extend(_expand(subject, scope, r))
    return rules
