"""``gpupilot-adapter convert-config``: a prometheus-adapter config file → this adapter's format.

prometheus-adapter's rules (``rules``, ``externalRules``) discover series with ``seriesQuery``,
keep or drop them with ``seriesFilters`` (``is``/``isNot`` regexes on the name), map series labels
to Kubernetes resources with ``resources.overrides`` or ``resources.template``, rename with
``name.matches``/``name.as`` and query with ``metricsQuery``, a Go template over ``<<.Series>>``,
``<<.LabelMatchers>>`` and ``<<.GroupBy>>``. Each rule whose ``seriesQuery`` names its series
becomes one entry here; what cannot be expressed is reported in one line per item and left out:
series chosen by a name regex (this adapter lists series by name; no Prometheus is asked here),
other Go template constructs, resources this adapter does not serve, and ``resourceRules`` (the
resource metrics API: keep metrics-server for CPU/memory).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from adapter.config import resources
from adapter.errors import ConfigError
from gpupilot_common import yamlsafe
from gpupilot_common.text import one_line

MAX_BYTES = 4 << 20
_SERIES_QUERY = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{.*\})?\s*$", re.S)
_GO_TEMPLATE = {"<<.Series>>": "<<series>>", "<<.LabelMatchers>>": "<<matchers>>", "<<.GroupBy>>": "<<by>>"}
_GO_ANY = re.compile(r"<<[^>]*>>|\{\{")
_GO_GROUP_REF = re.compile(r"\$\{(\d+)\}|\$(\d+)")
_TOP = {"rules", "externalRules", "resourceRules", "seriesQuery"}
_RULE_KEYS = {"seriesQuery", "seriesFilters", "resources", "name", "metricsQuery"}


class Conversion:
    """The converted document and one line per thing left out."""

    def __init__(self) -> None:
        self.metrics: list[dict[str, Any]] = []
        self.external: list[dict[str, Any]] = []
        self.notes: list[str] = []

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        if self.metrics:
            doc["metrics"] = self.metrics
        if self.external:
            doc["external"] = self.external
        return doc


def _go_replacement(template: str) -> str:
    """``${1}_per_second`` / ``$1`` (Go regexp) → Python's ``\\g<1>_per_second``."""
    return _GO_GROUP_REF.sub(lambda m: f"\\g<{m.group(1) or m.group(2)}>", template)


def _rename(series: str, spec: object, where: str) -> str:
    if spec is None:
        return series
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}.name must be a mapping with 'matches' and 'as'")
    pattern = str(spec.get("matches") or "")
    target = str(spec.get("as") or "")
    if not pattern:
        return target or series
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{where}.name.matches {pattern!r} is not a regex ({exc})") from None
    m = rx.search(series)
    if not m:
        raise ValueError(f"{where}.name.matches {pattern!r} does not match the series {series}")
    if not target:
        target = "${1}" if rx.groups else "$0"
    try:
        return m.expand(_go_replacement(target))
    except (re.error, IndexError) as exc:
        raise ValueError(f"{where}.name.as {target!r}: {exc}") from None


def _filters_keep(series: str, filters: object, where: str) -> bool:
    if not filters:
        return True
    if not isinstance(filters, list):
        raise ValueError(f"{where}.seriesFilters must be a list of {{is: regex}} / {{isNot: regex}}")
    for f in filters:
        if not isinstance(f, Mapping):
            raise ValueError(f"{where}.seriesFilters entries must be mappings")
        for key, keep_if_match in (("is", True), ("isNot", False)):
            if key in f:
                try:
                    matched = re.search(str(f[key]), series) is not None
                except re.error as exc:
                    raise ValueError(f"{where}.seriesFilters.{key} is not a regex ({exc})") from None
                if matched != keep_if_match:
                    return False
    return True


def _resources(spec: object, where: str, notes: list[str]) -> dict[str, str]:
    """prometheus-adapter ``resources`` → ours (plural resource → label)."""
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}.resources must be a mapping with 'overrides' and/or 'template'")
    out: dict[str, str] = {}
    template = spec.get("template")
    if template:
        text = str(template)
        if text.strip() != "<<.Resource>>":
            notes.append(
                f"{where}.resources.template {text!r}: only '<<.Resource>>' (label named as the "
                "resource) can be expressed; write resources explicitly"
            )
        else:
            for r in (resources.NAMESPACES, resources.PODS, resources.NODES):
                out[r.plural] = r.kind.lower()
    overrides = spec.get("overrides") or {}
    if not isinstance(overrides, Mapping):
        raise ValueError(f"{where}.resources.overrides must map label → {{resource: name}}")
    for label, target in overrides.items():
        if not isinstance(target, Mapping) or "resource" not in target:
            raise ValueError(f"{where}.resources.overrides.{label} must be {{resource: name}}")
        name = str(target["resource"])
        group = str(target.get("group") or "")
        resource = resources.lookup(name)
        if resource is not None and resource.group != group:
            resource = None
        if resource is None:
            notes.append(
                f"{where}.resources.overrides.{label}: resource {name!r} is not one this adapter serves"
            )
            continue
        out[resource.qualified] = str(label)
    return out


def _query(text: object, where: str) -> str:
    query = str(text or "")
    if not query:
        raise ValueError(f"{where}.metricsQuery is missing")
    for go, ours in _GO_TEMPLATE.items():
        query = query.replace(go, ours)
    left = _GO_ANY.findall(query.replace("<<series>>", "").replace("<<matchers>>", "").replace("<<by>>", ""))
    if left:
        raise ValueError(
            f"{where}.metricsQuery uses {left[0]!r}: only <<.Series>>, <<.LabelMatchers>> and <<.GroupBy>> "
            "can be expressed"
        )
    return query


def _series(rule: Mapping[str, Any], where: str) -> str:
    text = str(rule.get("seriesQuery") or "")
    m = _SERIES_QUERY.match(text)
    if not m:
        raise ValueError(
            f"{where}.seriesQuery {text.strip()!r} selects series by a name pattern; this adapter lists "
            "series by name: write one rule per series"
        )
    return m.group(1)


def _rule(rule: object, where: str, conv: Conversion, *, external: bool) -> None:
    if not isinstance(rule, Mapping):
        raise ValueError(f"{where} must be a mapping")
    for key in sorted(set(rule) - _RULE_KEYS):
        conv.notes.append(f"{where}.{key}: not a prometheus-adapter rule field; ignored")
    series = _series(rule, where)
    if not _filters_keep(series, rule.get("seriesFilters"), where):
        conv.notes.append(f"{where}: seriesFilters exclude {series}; nothing to convert")
        return
    name = _rename(series, rule.get("name"), where)
    notes: list[str] = []
    labels = _resources(rule.get("resources"), where, notes)
    conv.notes += notes
    query = _query(rule.get("metricsQuery"), where).replace("<<series>>", series)
    if external:
        entry: dict[str, Any] = {"name": name, "series": series, "query": query}
        ns = labels.get("namespaces")
        if ns:
            entry["namespaceLabel"] = ns
        if set(labels) - {"namespaces"}:
            conv.notes.append(
                f"{where}: external metrics are scoped by namespace only; "
                f"{', '.join(sorted(set(labels) - {'namespaces'}))} left out"
            )
        conv.external.append(entry)
    else:
        if not labels:
            raise ValueError(f"{where}: no resources: a custom metric must describe at least one resource")
        conv.metrics.append({"name": name, "series": series, "resources": labels, "query": query})


def convert(doc: object, *, source: str) -> Conversion:
    """Convert a loaded prometheus-adapter config; every problem goes to ``notes`` with its path."""
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{source}: top level must be a mapping with 'rules' and/or 'externalRules'")
    conv = Conversion()
    for key in sorted(set(doc) - _TOP):
        conv.notes.append(f"{key}: not a prometheus-adapter config section; ignored")
    for section, external in (("rules", False), ("externalRules", True)):
        items = doc.get(section) or []
        if not isinstance(items, list):
            conv.notes.append(f"{section}: must be a list; ignored")
            continue
        for i, rule in enumerate(items):
            where = f"{section}[{i}]"
            try:
                _rule(rule, where, conv, external=external)
            except ValueError as exc:
                conv.notes.append(str(exc))
    if doc.get("resourceRules"):
        conv.notes.append(
            "resourceRules: the resource metrics API (kubectl top, CPU/memory HPAs) is not served by "
            "gpupilot-adapter; keep metrics-server for it"
        )
    _dedupe(conv)
    return conv


def _dedupe(conv: Conversion) -> None:
    for kind in ("metrics", "external"):
        seen: set[str] = set()
        kept = []
        for entry in getattr(conv, kind):
            if entry["name"] in seen:
                conv.notes.append(
                    f"{kind} {entry['name']}: a second rule gives the same name; the first is kept"
                )
                continue
            seen.add(entry["name"])
            kept.append(entry)
        setattr(conv, kind, kept)


def load(path: Path) -> object:
    """The file through the project's bounded reader: a regular file of at most ``MAX_BYTES``, UTF-8,
    its aliases, nesting and tags within the shared limits (a 464-byte alias bomb took seconds and
    400 MB, 510 bytes 69 s and 3.1 GB, ending in tracebacks)."""
    try:
        return yamlsafe.safe_load(yamlsafe.read_text(path, max_bytes=MAX_BYTES))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        why = f" ({one_line(str(problem))})" if problem else ""
        raise ConfigError(f"{path}: not valid YAML{at}{why}") from None
