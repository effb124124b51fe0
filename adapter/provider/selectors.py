"""Kubernetes label selectors: parsing the ``labelSelector`` string form, matching label maps, and
turning a selector into PromQL matchers.

Grammar (as ``k8s.io/apimachinery/pkg/labels``): requirements separated by commas, each one of
``key=value``, ``key==value``, ``key!=value``, ``key in (a,b)``, ``key notin (a,b)``, ``key`` (exists)
and ``!key`` (does not exist). An empty string selects everything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import NamedTuple

from adapter.errors import BadRequest

_KEY = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_SET = re.compile(r"^\s*(\S+)\s+(in|notin)\s*\((.*)\)\s*$")


class Requirement(NamedTuple):
    """One requirement of a selector. Named tuples, not dataclasses: a selector is part of several
    lookup keys on every request, and a tuple hashes and compares in C, field by field."""

    key: str
    op: str
    """One of ``=``, ``!=``, ``in``, ``notin``, ``exists``, ``!`` (does not exist)."""
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # != and notin also match objects without the key, as Kubernetes does
        return not present or labels[self.key] not in self.values


class Selector(NamedTuple):
    requirements: tuple[Requirement, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(_render(r) for r in self.requirements)


def _render(r: Requirement) -> str:
    if r.op == "exists":
        return r.key
    if r.op == "!":
        return f"!{r.key}"
    if r.op in ("in", "notin"):
        return f"{r.key} {r.op} ({','.join(r.values)})"
    return f"{r.key}{r.op}{r.values[0]}"


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise BadRequest(f"label selector {text!r}: unbalanced ')'")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise BadRequest(f"label selector {text!r}: unbalanced '('")
    parts.append("".join(current))
    return parts


def _check_key(key: str, whole: str) -> str:
    if not _KEY.match(key):
        raise BadRequest(f"label selector {whole!r}: {key!r} is not a valid label key")
    return key


def _check_value(value: str, whole: str) -> str:
    if len(value) > 63 or not _VALUE.match(value):
        raise BadRequest(f"label selector {whole!r}: {value!r} is not a valid label value")
    return value


def parse_selector(text: str | None) -> Selector:
    """Parse the string form; raises ``BadRequest`` naming the selector and the bad part."""
    if text is None or not text.strip():
        return Selector()
    reqs: list[Requirement] = []
    for part in _split_top_level(text):
        item = part.strip()
        if not item:
            raise BadRequest(f"label selector {text!r}: empty requirement")
        set_match = _SET.match(item)
        if set_match:
            key, op, body = set_match.groups()
            if not body.strip():
                raise BadRequest(f"label selector {text!r}: '{op}' needs at least one value")
            values = tuple(_check_value(v.strip(), text) for v in body.split(","))
            reqs.append(Requirement(_check_key(key, text), op, tuple(sorted(set(values)))))
            continue
        for token, op in (("!=", "!="), ("==", "="), ("=", "=")):
            if token in item:
                key, _, value = item.partition(token)
                reqs.append(
                    Requirement(_check_key(key.strip(), text), op, (_check_value(value.strip(), text),))
                )
                break
        else:
            if item.startswith("!"):
                reqs.append(Requirement(_check_key(item[1:].strip(), text), "!"))
            else:
                reqs.append(Requirement(_check_key(item, text), "exists"))
    return Selector(tuple(reqs))


def promql_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


_REGEX_META = re.compile(r"([\\.+*?()|\[\]{}^$])")


def regex_literal(value: str) -> str:
    """Escape RE2 metacharacters only (not ``-``), so Prometheus sees plain literal alternatives."""
    return _REGEX_META.sub(r"\\\1", value)


def regex_alternatives(values: tuple[str, ...] | list[str]) -> str:
    return "|".join(regex_literal(v) for v in values)


_PROM_LABEL = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_label_name(key: str) -> str:
    """A Kubernetes label key as a Prometheus label name (``app.kubernetes.io/name`` →
    ``app_kubernetes_io_name``), the sanitisation kube-state-metrics applies."""
    name = _PROM_LABEL.sub("_", key)
    return f"_{name}" if name[:1].isdigit() else name


def to_promql_matchers(selector: Selector, *, label_prefix: str = "") -> list[str]:
    """PromQL matchers equivalent to ``selector`` on series whose labels are the object's labels
    (``label_prefix`` = ``label_`` for kube-state-metrics' ``kube_*_labels``)."""
    out = []
    for r in selector.requirements:
        name = label_prefix + prometheus_label_name(r.key)
        if r.op == "=":
            out.append(f'{name}="{promql_escape(r.values[0])}"')
        elif r.op == "!=":
            out.append(f'{name}!="{promql_escape(r.values[0])}"')
        elif r.op == "in":
            out.append(f'{name}=~"{promql_escape(regex_alternatives(r.values))}"')
        elif r.op == "notin":
            out.append(f'{name}!~"{promql_escape(regex_alternatives(r.values))}"')
        elif r.op == "exists":
            out.append(f'{name}=~".+"')
        else:
            out.append(f'{name}=""')
    return out


def from_label_selector(obj: Mapping[str, object] | None, *, where: str) -> Selector:
    """A ``metav1.LabelSelector`` (``matchLabels`` / ``matchExpressions``) as a :class:`Selector`."""
    if not obj:
        return Selector()
    reqs: list[Requirement] = []
    labels = obj.get("matchLabels") or {}
    if not isinstance(labels, Mapping):
        raise BadRequest(f"{where}.matchLabels must be a mapping")
    for key, value in labels.items():
        reqs.append(Requirement(str(key), "=", (str(value),)))
    exprs = obj.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise BadRequest(f"{where}.matchExpressions must be a list")
    ops = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}
    for i, expr in enumerate(exprs):
        if not isinstance(expr, Mapping) or expr.get("operator") not in ops:
            raise BadRequest(f"{where}.matchExpressions[{i}]: operator must be one of {', '.join(ops)}")
        values = tuple(sorted(str(v) for v in expr.get("values") or []))
        reqs.append(Requirement(str(expr.get("key", "")), ops[str(expr["operator"])], values))
    return Selector(tuple(reqs))
