"""ValidatingAdmissionPolicies as the double's admission step (``KubeDouble.load_admission_policies``).

Follows ``k8s.io/apiserver/pkg/admission/plugin/policy/validating``: on an UPDATE of a main resource
(a PUT or a PATCH; subresources such as ``pods/eviction`` are not matched by their rules), every
loaded policy bound with ``validationActions: [Deny]`` is evaluated with a real CEL engine
(:mod:`tests.support.admission`) against the stored object and the one about to be stored, after
the registry's own changes (generation). The first refusal answers as the API server does: the
validation's ``reason`` as the status (403 for Forbidden, else 422 Invalid) and
``ValidatingAdmissionPolicy 'P' with binding 'B' denied request: MESSAGE``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.kubedouble.errors import ApiError
from tests.support.kubedouble.store import Kind
from tests.support.yamldocs import load_all

GROUP = "admissionregistration.k8s.io/"


@dataclass(frozen=True)
class Bound:
    policy: dict[str, Any]
    binding: str


def load(paths: Iterable[Path]) -> list[Bound]:
    docs: list[dict[str, Any]] = []
    for path in paths:
        files = sorted(path.rglob("*.yaml")) if path.is_dir() else [path]
        for f in files:
            docs += [d for d in load_all(f.read_text()) if isinstance(d, dict)]
    policies = {
        d["metadata"]["name"]: d
        for d in docs
        if str(d.get("apiVersion", "")).startswith(GROUP) and d.get("kind") == "ValidatingAdmissionPolicy"
    }
    return [
        Bound(policies[d["spec"]["policyName"]], d["metadata"]["name"])
        for d in docs
        if d.get("kind") == "ValidatingAdmissionPolicyBinding"
        and "Deny" in (d["spec"].get("validationActions") or [])
        and d["spec"]["policyName"] in policies
    ]


def admit(bound: list[Bound], kind: Kind, user: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Raise the API server's refusal when a policy denies this UPDATE by ``user``."""
    from tests.support.admission import Request, refusals  # noqa: PLC0415  (CEL only when loaded)

    req = Request(username=user, group=kind.group, version=kind.version, resource=kind.plural)
    for b in bound:
        denied = refusals(b.policy, req, old, new)
        if denied:
            name = b.policy["metadata"]["name"]
            reason = next(
                (
                    str(v.get("reason", "Invalid"))
                    for v in b.policy["spec"]["validations"]
                    if " ".join(str(v.get("message", "")).split()) == denied[0]
                ),
                "Invalid",
            )
            code = 403 if reason == "Forbidden" else 422
            raise ApiError(
                code,
                reason,
                f'{kind.plural}.{kind.group or "core"} "{new["metadata"]["name"]}" is forbidden: '
                f"ValidatingAdmissionPolicy '{name}' with binding '{b.binding}' denied request: {denied[0]}",
            )
