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
(60 s). Every error is one line, ``file:line: field.path: problem`` (``gpupilot_common.checked``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources as importlib_resources
from pathlib import Path

from adapter.config import resources
from adapter.config.resources import Resource
from adapter.errors import ConfigError
from gpupilot_common import checked, timefmt
from gpupilot_common.section import Section

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
_METRIC_KEYS = {"name", "series", "resources", "query", "window", "valueRange"}
_EXTERNAL_KEYS = {"name", "series", "query", "window", "namespaceLabel", "valueRange"}


@dataclass(frozen=True)
class MetricRule:
    """One custom metric: ``name`` served for each resource in ``labels`` (resource → label)."""

    name: str
    series: str
    query: str
    labels: Mapping[Resource, str]
    window_seconds: int
    value_range: tuple[float, float] | None = None
    """``valueRange``: what the metric can mean (0–100 for a utilisation); a value outside it is
    refused for its object, never served."""

    def label_for(self, resource: Resource) -> str | None:
        return self.labels.get(resource)


@dataclass(frozen=True)
class ExternalRule:
    name: str
    series: str
    query: str
    namespace_label: str
    window_seconds: int
    value_range: tuple[float, float] | None = None


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


def parse_duration(text: object, *, at: Section, key: str) -> int:
    """A query window in Prometheus' duration grammar, whole seconds from 1s to 1d."""
    try:
        seconds = timefmt.parse_duration(text, minimum=1.0, maximum=86400.0)
    except ValueError as exc:
        raise at.fail(key, str(exc)) from None
    return int(seconds)


def _string(at: Section, key: str, default: str | None = None) -> str:
    value = at.raw(key, default)
    if value is None:
        raise at.fail(key, "is required")
    if not isinstance(value, str):
        raise at.fail(key, f"must be a string, not {type(value).__name__}")
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


def _check_query(at: Section, query: str) -> str:
    go = _GO_PLACEHOLDER.search(query)
    if go:
        name = go.group(1)
        hint = _GO_EQUIVALENT.get(name)
        raise at.fail(
            "query",
            f"{go.group(0)} is a prometheus-adapter template placeholder; this format writes "
            + (f"{hint} instead" if hint else "<<series>>, <<matchers>> and <<by>>")
            + " (a whole prometheus-adapter config: 'gpupilot-adapter convert-config FILE')",
        )
    for placeholder in _PLACEHOLDER.findall(query):
        if placeholder not in _KNOWN_PLACEHOLDERS:
            raise at.fail(
                "query", f"unknown placeholder <<{placeholder}>> (use <<series>>, <<matchers>>, <<by>>)"
            )
    if query.count("(") != query.count(")") or query.count("{") != query.count("}"):
        raise at.fail("query", "unbalanced brackets in the PromQL template")
    return query


def _check_unknown(at: Section, allowed: set[str]) -> None:
    extra = sorted(str(k) for k in set(at.data) - allowed)
    if extra:
        raise at.fail(extra[0], f"unknown field (allowed: {', '.join(sorted(allowed))})")


def _labels(at: Section) -> dict[Resource, str]:
    raw = at.raw("resources")
    if raw is None:
        raw = DEFAULT_RESOURCES
    if not isinstance(raw, Mapping) or not raw:
        raise at.fail(
            "resources", "must map resources to series labels, e.g. {pods: pod, namespaces: namespace}"
        )
    where = Section(at.doc, dict(raw), (*at.path, "resources"))
    out: dict[Resource, str] = {}
    for key, label in raw.items():
        resource = resources.lookup(str(key))
        if resource is None:
            known = ", ".join(r.qualified for r in resources.KNOWN)
            raise where.fail(str(key), f"unknown resource (known: {known})")
        if not isinstance(label, str) or not _LABEL_NAME.match(label):
            raise where.fail(str(key), f"{label!r} is not a Prometheus label name")
        out[resource] = label
    if resources.NAMESPACES not in out and any(r.namespaced for r in out):
        raise at.fail("resources", "namespaced resources need a 'namespaces' label (usually: namespace)")
    return out


def _name(at: Section) -> str:
    name = _string(at, "name")
    if not _METRIC_NAME.match(name):
        raise at.fail("name", f"{name!r} is not a valid metric name")
    return name


def _metric_rule(at: Section, *, window: int) -> MetricRule:
    _check_unknown(at, _METRIC_KEYS)
    name = _name(at)
    query = _string(at, "query", DEFAULT_QUERY)
    return MetricRule(
        name=name,
        series=_string(at, "series", name),
        query=_check_query(at, query),
        labels=_labels(at),
        window_seconds=_window(at, query, window),
        value_range=_value_range(at),
    )


def _value_range(at: Section) -> tuple[float, float] | None:
    """``valueRange: [low, high]``: two finite numbers, low < high."""
    raw = at.raw("valueRange")
    if raw is None:
        return None
    ok = (
        isinstance(raw, list)
        and len(raw) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in raw)
        and raw[0] < raw[1]
    )
    if not ok:
        raise at.fail(
            "valueRange", f"must be [low, high], two finite numbers with low < high, got {raw!r:.60}"
        )
    return float(raw[0]), float(raw[1])


def _window(at: Section, query: str, default: int) -> int:
    if "window" in at:
        return parse_duration(at.raw("window"), at=at, key="window")
    return query_window(query) or default


def _external_rule(at: Section, *, window: int) -> ExternalRule:
    _check_unknown(at, _EXTERNAL_KEYS)
    name = _name(at)
    ns_label = _string(at, "namespaceLabel", "")
    if ns_label and not _LABEL_NAME.match(ns_label):
        raise at.fail("namespaceLabel", f"{ns_label!r} is not a Prometheus label name")
    query = _string(at, "query", DEFAULT_EXTERNAL_QUERY)
    return ExternalRule(
        name=name,
        series=_string(at, "series", name),
        query=_check_query(at, query),
        namespace_label=ns_label,
        window_seconds=_window(at, query, window),
        value_range=_value_range(at),
    )


_ENTRY = "a mapping with at least 'name'"


def parse_config(data: object, *, source: str) -> AdapterConfig:
    """Validate already-loaded data (no lines known): errors read ``source: field.path: problem``."""
    return parse_document(checked.Document(data, source=source, error=ConfigError))


def parse_document(doc: checked.Document) -> AdapterConfig:
    """Validate a read document; raises ``ConfigError``: ``file:line: field.path: problem``."""
    top = doc.root("an adapter config (a mapping with 'metrics' and/or 'external')")
    _check_unknown(top, _TOP_KEYS)
    defaults = top.section("defaults") or Section(doc, {}, ("defaults",))
    window = parse_duration(defaults.raw("window", "60s"), at=defaults, key="window")
    metrics = tuple(_metric_rule(e, window=window) for e in top.sections("metrics", what=_ENTRY))
    external = tuple(_external_rule(e, window=window) for e in top.sections("external", what=_ENTRY))
    by_name: dict[str, MetricRule] = {}
    for i, rule in enumerate(metrics):
        if rule.name in by_name:
            raise doc.fail(("metrics", i, "name"), f"{rule.name!r} is defined twice")
        by_name[rule.name] = rule
    ext_by_name: dict[str, ExternalRule] = {}
    for i, ext in enumerate(external):
        if ext.name in ext_by_name:
            raise doc.fail(("external", i, "name"), f"{ext.name!r} is defined twice")
        ext_by_name[ext.name] = ext
    if not metrics and not external:
        raise top.fail("metrics", "no metrics defined; nothing would be served")
    return AdapterConfig(doc.source, metrics, external, by_name, ext_by_name)


def load_config(path: Path | None) -> AdapterConfig:
    """Read ``path`` (the packaged default config when None)."""
    if path is None:
        text = importlib_resources.files("adapter").joinpath("default-config.yaml").read_text()
        doc = checked.parse_yaml(text, source="(built-in default-config.yaml)", error=ConfigError)
    else:
        doc = checked.load_yaml(path, error=ConfigError, what="adapter config")
    return parse_document(doc)
