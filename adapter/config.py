"""The mapping file: which Prometheus series become which custom/external API metrics.

Much smaller than prometheus-adapter's rules: one entry per API metric, no Go templates::

    metrics:                          # custom.metrics.k8s.io
      - name: DCGM_FI_DEV_GPU_UTIL    # the name the HPA asks for (rename freely)
        series: DCGM_FI_DEV_GPU_UTIL  # series it comes from: discovery lists the metric once it exists
        resources:                    # Kubernetes resource → series label that holds its name
          namespaces: namespace
          pods: pod
          nodes: Hostname
        query: avg by (<<by>>) (<<series>>{<<matchers>>})   # optional; this is the default
        window: 60s                   # windowSeconds in answers (optional; see below)
    external:                         # external.metrics.k8s.io (may be switched off)
      - name: gpupilot_fleet_waste_gpu_equivalents
        series: gpupilot:fleet_waste:gpu_equivalents
        namespaceLabel: ""            # "" = not scoped by namespace
        query: sum(<<series>>{<<matchers>>})

Placeholders: ``<<series>>``; ``<<matchers>>`` (namespace, object name and ``metricLabelSelector``
as PromQL label matchers, comma-separated, possibly empty); ``<<by>>`` (the series label of the
resource being asked about, e.g. ``namespace, pod``). prometheus-adapter's Go-template placeholders
(``<<.Series>>``, ``<<.LabelMatchers>>``, ``<<.GroupBy>>``) are refused at load with the equivalent
(they would otherwise reach Prometheus and fail every request with a PromQL parse error).

``windowSeconds`` in answers: the rule's ``window`` when given; else the longest range selector of
its query (``rate(x[5m])`` → 300: the values average over that window); else ``defaults.window``
(60 s). Every error names the file and the field.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources as importlib_resources
from pathlib import Path
from typing import Any

import yaml

from adapter import resources
from adapter.errors import ConfigError
from adapter.resources import Resource
from checked_input import yamlsafe
from gpupilot_common import timefmt

DEFAULT_QUERY = "avg by (<<by>>) (<<series>>{<<matchers>>})"
DEFAULT_EXTERNAL_QUERY = "sum(<<series>>{<<matchers>>})"
DEFAULT_RESOURCES = {"namespaces": "namespace", "pods": "pod"}
_PLACEHOLDER = re.compile(r"<<(\w*)>>")
_GO_PLACEHOLDER = re.compile(r"<<\s*\.\s*(\w+)\s*>>")
_GO_EQUIVALENT = {"Series": "<<series>>", "LabelMatchers": "<<matchers>>", "GroupBy": "<<by>>"}
_RANGE = re.compile(r"\[\s*((?:\d+(?:ms|s|m|h|d|w|y))+)\s*(?::[^\]]*)?\]")
_KNOWN_PLACEHOLDERS = {"series", "matchers", "by"}
_METRIC_NAME = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:.-]*$")
_LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TOP_KEYS = {"metrics", "external", "defaults"}
_METRIC_KEYS = {"name", "series", "resources", "query", "window"}
_EXTERNAL_KEYS = {"name", "series", "query", "window", "namespaceLabel"}


@dataclass(frozen=True)
class MetricRule:
    """One custom metric: ``name`` served for each resource in ``labels`` (resource → label)."""

    name: str
    series: str
    query: str
    labels: Mapping[Resource, str]
    window_seconds: int

    def label_for(self, resource: Resource) -> str | None:
        return self.labels.get(resource)


@dataclass(frozen=True)
class ExternalRule:
    name: str
    series: str
    query: str
    namespace_label: str
    window_seconds: int


@dataclass(frozen=True)
class AdapterConfig:
    source: str
    metrics: tuple[MetricRule, ...]
    external: tuple[ExternalRule, ...]
    by_name: Mapping[str, MetricRule] = field(default_factory=dict)
    external_by_name: Mapping[str, ExternalRule] = field(default_factory=dict)

    def metric(self, name: str) -> MetricRule | None:
        return self.by_name.get(name)

    def external_metric(self, name: str) -> ExternalRule | None:
        return self.external_by_name.get(name)


def _fail(source: str, where: str, message: str) -> ConfigError:
    return ConfigError(f"adapter config {source}: {where}: {message}")


def parse_duration(text: object, *, source: str, where: str) -> int:
    """A query window in Prometheus' duration grammar, whole seconds from 1s to 1d."""
    try:
        seconds = timefmt.parse_duration(text, minimum=1.0, maximum=86400.0)
    except ValueError as exc:
        raise _fail(source, where, str(exc)) from None
    return int(seconds)


def _string(
    entry: Mapping[str, Any], key: str, *, source: str, where: str, default: str | None = None
) -> str:
    value = entry.get(key, default)
    if value is None:
        raise _fail(source, f"{where}.{key}", "is required")
    if not isinstance(value, str):
        raise _fail(source, f"{where}.{key}", f"must be a string, not {type(value).__name__}")
    return value


def query_window(query: str) -> int | None:
    """The longest range selector (or subquery range) in a PromQL template, in whole seconds."""
    longest = 0.0
    for match in _RANGE.finditer(query):
        try:
            longest = max(longest, timefmt.parse_duration(match.group(1)))
        except ValueError:  # not a Prometheus duration (e.g. units out of order): no window from it
            continue
    return max(1, int(longest)) if longest else None


def _check_query(query: str, *, source: str, where: str) -> str:
    go = _GO_PLACEHOLDER.search(query)
    if go:
        name = go.group(1)
        hint = _GO_EQUIVALENT.get(name)
        raise _fail(
            source,
            where,
            f"{go.group(0)} is a prometheus-adapter template placeholder; this format writes "
            + (f"{hint} instead" if hint else "<<series>>, <<matchers>> and <<by>>")
            + " (a whole prometheus-adapter config: 'gpupilot-adapter convert-config FILE')",
        )
    for placeholder in _PLACEHOLDER.findall(query):
        if placeholder not in _KNOWN_PLACEHOLDERS:
            raise _fail(
                source, where, f"unknown placeholder <<{placeholder}>> (use <<series>>, <<matchers>>, <<by>>)"
            )
    if query.count("(") != query.count(")") or query.count("{") != query.count("}"):
        raise _fail(source, where, "unbalanced brackets in the PromQL template")
    return query


def _check_unknown(entry: Mapping[str, Any], allowed: set[str], *, source: str, where: str) -> None:
    extra = sorted(set(entry) - allowed)
    if extra:
        raise _fail(source, f"{where}.{extra[0]}", f"unknown field (allowed: {', '.join(sorted(allowed))})")


def _labels(raw: object, *, source: str, where: str) -> dict[Resource, str]:
    if raw is None:
        raw = DEFAULT_RESOURCES
    if not isinstance(raw, Mapping) or not raw:
        raise _fail(
            source, where, "must map resources to series labels, e.g. {pods: pod, namespaces: namespace}"
        )
    out: dict[Resource, str] = {}
    for key, label in raw.items():
        resource = resources.lookup(str(key))
        if resource is None:
            known = ", ".join(r.qualified for r in resources.KNOWN)
            raise _fail(source, f"{where}.{key}", f"unknown resource (known: {known})")
        if not isinstance(label, str) or not _LABEL_NAME.match(label):
            raise _fail(source, f"{where}.{key}", f"{label!r} is not a Prometheus label name")
        out[resource] = label
    if resources.NAMESPACES not in out and any(r.namespaced for r in out):
        raise _fail(source, where, "namespaced resources need a 'namespaces' label (usually: namespace)")
    return out


def _metric_rule(entry: object, *, source: str, where: str, window: int) -> MetricRule:
    if not isinstance(entry, Mapping):
        raise _fail(source, where, "must be a mapping with at least 'name'")
    _check_unknown(entry, _METRIC_KEYS, source=source, where=where)
    name = _string(entry, "name", source=source, where=where)
    if not _METRIC_NAME.match(name):
        raise _fail(source, f"{where}.name", f"{name!r} is not a valid metric name")
    series = _string(entry, "series", source=source, where=where, default=name)
    query = _string(entry, "query", source=source, where=where, default=DEFAULT_QUERY)
    return MetricRule(
        name=name,
        series=series,
        query=_check_query(query, source=source, where=f"{where}.query"),
        labels=_labels(entry.get("resources"), source=source, where=f"{where}.resources"),
        window_seconds=_window(entry, query, window, source=source, where=where),
    )


def _window(entry: Mapping[str, Any], query: str, default: int, *, source: str, where: str) -> int:
    if "window" in entry:
        return parse_duration(entry["window"], source=source, where=f"{where}.window")
    return query_window(query) or default


def _external_rule(entry: object, *, source: str, where: str, window: int) -> ExternalRule:
    if not isinstance(entry, Mapping):
        raise _fail(source, where, "must be a mapping with at least 'name'")
    _check_unknown(entry, _EXTERNAL_KEYS, source=source, where=where)
    name = _string(entry, "name", source=source, where=where)
    if not _METRIC_NAME.match(name):
        raise _fail(source, f"{where}.name", f"{name!r} is not a valid metric name")
    ns_label = _string(entry, "namespaceLabel", source=source, where=where, default="")
    if ns_label and not _LABEL_NAME.match(ns_label):
        raise _fail(source, f"{where}.namespaceLabel", f"{ns_label!r} is not a Prometheus label name")
    query = _string(entry, "query", source=source, where=where, default=DEFAULT_EXTERNAL_QUERY)
    return ExternalRule(
        name=name,
        series=_string(entry, "series", source=source, where=where, default=name),
        query=_check_query(query, source=source, where=f"{where}.query"),
        namespace_label=ns_label,
        window_seconds=_window(entry, query, window, source=source, where=where),
    )


def parse_config(data: object, *, source: str) -> AdapterConfig:
    """Validate a loaded YAML document; raises ``ConfigError`` naming ``source`` and the field."""
    if not isinstance(data, Mapping):
        raise _fail(source, "top level", "must be a mapping with 'metrics' and/or 'external'")
    _check_unknown(data, _TOP_KEYS, source=source, where="top level")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, Mapping):
        raise _fail(source, "defaults", "must be a mapping")
    window = parse_duration(defaults.get("window", "60s"), source=source, where="defaults.window")
    raw_metrics = data.get("metrics") or []
    raw_external = data.get("external") or []
    for key, value in (("metrics", raw_metrics), ("external", raw_external)):
        if not isinstance(value, list):
            raise _fail(source, key, "must be a list")
    metrics = tuple(
        _metric_rule(e, source=source, where=f"metrics[{i}]", window=window)
        for i, e in enumerate(raw_metrics)
    )
    external = tuple(
        _external_rule(e, source=source, where=f"external[{i}]", window=window)
        for i, e in enumerate(raw_external)
    )
    by_name: dict[str, MetricRule] = {}
    for i, rule in enumerate(metrics):
        if rule.name in by_name:
            raise _fail(source, f"metrics[{i}].name", f"{rule.name!r} is defined twice")
        by_name[rule.name] = rule
    ext_by_name: dict[str, ExternalRule] = {}
    for i, ext in enumerate(external):
        if ext.name in ext_by_name:
            raise _fail(source, f"external[{i}].name", f"{ext.name!r} is defined twice")
        ext_by_name[ext.name] = ext
    if not metrics and not external:
        raise _fail(source, "metrics", "no metrics defined; nothing would be served")
    return AdapterConfig(source, metrics, external, by_name, ext_by_name)


def load_config(path: Path | None) -> AdapterConfig:
    """Read ``path`` (the packaged default config when None)."""
    if path is None:
        text = importlib_resources.files("adapter").joinpath("default-config.yaml").read_text()
        source = "(built-in default-config.yaml)"
    else:
        source = str(path)
        try:
            text = yamlsafe.read_text(path)
        except OSError as exc:
            raise ConfigError(f"adapter config {source}: cannot read: {exc.strerror or exc}") from exc
    try:
        data = yamlsafe.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "YAML"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"adapter config {source}: {where}: invalid YAML: {problem}") from exc
    return parse_config(data, source=source)
