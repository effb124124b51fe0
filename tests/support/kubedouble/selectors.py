"""Label selectors (string and ``LabelSelector`` object forms) and the field selectors the double supports."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Predicate = Callable[[Mapping[str, str]], bool]

_SET_EXPR = re.compile(r"^\s*(?P<key>[^\s!=]+)\s+(?P<op>in|notin)\s+\((?P<values>[^)]*)\)\s*$")


class SelectorError(ValueError):
    """An unparseable selector (→ 400 BadRequest)."""


def _split(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def _requirement(expr: str) -> Predicate:
    m = _SET_EXPR.match(expr)
    if m:
        key = m.group("key")
        values = {v.strip() for v in m.group("values").split(",") if v.strip()}
        if m.group("op") == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    for op in ("!=", "==", "="):
        if op in expr:
            key, value = (s.strip() for s in expr.split(op, 1))
            if not key:
                raise SelectorError(f"bad selector term {expr!r}")
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if expr.startswith("!"):
        key = expr[1:].strip()
        return lambda labels: key not in labels
    if re.fullmatch(r"[A-Za-z0-9./_-]+", expr):
        return lambda labels: expr in labels
    raise SelectorError(f"bad selector term {expr!r}")


def parse_label_selector(text: str | None) -> Predicate:
    if not text:
        return lambda labels: True
    preds = [_requirement(p) for p in _split(text)]
    return lambda labels: all(p(labels) for p in preds)


def label_selector_object(selector: Mapping[str, Any] | None) -> Predicate:
    """A ``metav1.LabelSelector`` (``matchLabels`` + ``matchExpressions``). An empty selector matches all."""
    if not selector:
        return lambda labels: True
    match = dict(selector.get("matchLabels") or {})
    exprs = list(selector.get("matchExpressions") or [])

    def pred(labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in match.items()):
            return False
        for e in exprs:
            key, op, values = e["key"], e["operator"], set(e.get("values") or [])
            ok = {
                "In": labels.get(key) in values,
                "NotIn": labels.get(key) not in values,
                "Exists": key in labels,
                "DoesNotExist": key not in labels,
            }.get(op)
            if not ok:
                return False
        return True

    return pred


FIELD_PATHS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "metadata.name": lambda o: o.get("metadata", {}).get("name", ""),
    "metadata.namespace": lambda o: o.get("metadata", {}).get("namespace", ""),
    "spec.nodeName": lambda o: o.get("spec", {}).get("nodeName", "") or "",
    "status.phase": lambda o: o.get("status", {}).get("phase", "") or "",
    "spec.unschedulable": lambda o: str(bool(o.get("spec", {}).get("unschedulable", False))).lower(),
    "involvedObject.name": lambda o: o.get("involvedObject", {}).get("name", ""),
    "involvedObject.kind": lambda o: o.get("involvedObject", {}).get("kind", ""),
    "regarding.name": lambda o: o.get("regarding", {}).get("name", ""),
}


def parse_field_selector(text: str | None) -> Callable[[Mapping[str, Any]], bool]:
    if not text:
        return lambda obj: True
    checks: list[tuple[Callable[[Mapping[str, Any]], str], str, bool]] = []
    for term in _split(text):
        negate = "!=" in term
        op = "!=" if negate else ("==" if "==" in term else "=")
        if op not in term:
            raise SelectorError(f"bad field selector term {term!r}")
        path, value = (s.strip() for s in term.split(op, 1))
        getter = FIELD_PATHS.get(path)
        if getter is None:
            raise SelectorError(f'"{path}" is not a known field selector: only {", ".join(FIELD_PATHS)}')
        checks.append((getter, value, negate))
    return lambda obj: all((g(obj) == v) != neg for g, v, neg in checks)
