"""ValidatingAdmissionPolicies evaluated as the API server does, with Google's CEL (cel-expr-python).

Follows ``k8s.io/apiserver/pkg/admission/plugin/policy/validating``: a policy applies to a request when
its ``matchConstraints.resourceRules`` name the operation, group, version and resource and every
``matchConditions`` expression is true; then its ``variables`` are evaluated in order (visible to later
ones as ``variables.NAME``) and each ``validations`` expression must be true. ``object`` and
``oldObject`` are dynamic values (the API server's compiled environment declares them ``dyn``), so maps
are iterated as maps; optional field selection (``a.?b``, ``m[?k]``, ``orValue``) is on, as it is in
Kubernetes >= 1.29. An expression that fails to evaluate (a missing field) counts as a refusal, which
is what ``failurePolicy: Fail`` makes of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from cel_expr_python import cel  # type: ignore[import-untyped]  # no stubs
from cel_expr_python.ext import ext_optional  # type: ignore[import-untyped]


@cache
def _env() -> Any:
    names = ("object", "oldObject", "request", "variables")
    return cel.NewEnv(variables=dict.fromkeys(names, cel.Type.DYN), extensions=[ext_optional.ExtOptional()])


@cache
def _compiled(expression: str) -> Any:
    return _env().compile(expression)


def compile_all(policy: Mapping[str, Any]) -> None:
    """Compile (parse and type-check) every expression of ``policy``; raises on the first bad one."""
    spec = policy["spec"]
    for part in ("matchConditions", "variables", "validations"):
        for item in spec.get(part) or []:
            _compiled(item["expression"])


class EvaluationError(Exception):
    """An expression evaluated to a CEL error (a missing field, a type mismatch)."""


def _eval(expression: str, data: Mapping[str, Any]) -> Any:
    value = _compiled(expression).eval(data=dict(data))
    if value.type() == cel.Type.ERROR:
        raise EvaluationError(f"{expression}: {value.value()}")
    return value.plain_value()


@dataclass(frozen=True)
class Request:
    username: str
    operation: str = "UPDATE"
    group: str = ""
    version: str = "v1"
    resource: str = ""


def matches(policy: Mapping[str, Any], req: Request, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    spec = policy["spec"]
    rules = (spec.get("matchConstraints") or {}).get("resourceRules") or []

    def hit(values: list[str], value: str) -> bool:
        return "*" in values or value in values

    if not any(
        hit(r.get("operations") or [], req.operation)
        and hit(r.get("apiGroups") or [], req.group)
        and hit(r.get("apiVersions") or [], req.version)
        and hit(r.get("resources") or [], req.resource)
        for r in rules
    ):
        return False
    data = {"object": new, "oldObject": old, "request": _request(req), "variables": {}}
    # A match condition that errors makes the request refused under failurePolicy Fail: match it.
    return all(_true(c["expression"], data) is not False for c in spec.get("matchConditions") or [])


def _true(expression: str, data: Mapping[str, Any]) -> bool | None:
    """True or False; None when the expression errors."""
    try:
        return _eval(expression, data) is True
    except EvaluationError:
        return None


def _request(req: Request) -> dict[str, Any]:
    return {
        "operation": req.operation,
        "userInfo": {"username": req.username},
        "resource": {"group": req.group, "version": req.version, "resource": req.resource},
    }


def refusals(
    policy: Mapping[str, Any], req: Request, old: Mapping[str, Any], new: Mapping[str, Any]
) -> list[str]:
    """The messages of the validations ``policy`` fails for this UPDATE (empty: admitted or not matched)."""
    if not matches(policy, req, old, new):
        return []
    spec = policy["spec"]
    data: dict[str, Any] = {"object": new, "oldObject": old, "request": _request(req), "variables": {}}
    variables: dict[str, Any] = {}
    failed: list[str] = []
    for var in spec.get("variables") or []:
        try:
            variables[var["name"]] = _eval(var["expression"], {**data, "variables": variables})
        except EvaluationError as exc:
            failed.append(f"variables.{var['name']}: {exc}")
    data["variables"] = variables
    out = []
    for v in spec.get("validations") or []:
        uses_failed = any(f.split(":")[0] in v["expression"] for f in failed)
        # An evaluation error is a refusal under failurePolicy Fail.
        if uses_failed or not _true(v["expression"], data):
            out.append(" ".join(str(v.get("message", v["expression"])).split()))
    return out
