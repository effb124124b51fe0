"""An ``autoscaling/v2`` HorizontalPodAutoscaler file → :class:`hpa_controller.decide.HpaModel` plus what the
adapter needs to fetch its metrics. Bad input is one ``ConfigError`` line naming the file and field.

Defaulting follows the API server: ``minReplicas`` 1; ``behavior`` left out stays absent (the
controller then uses its legacy rules); a ``behavior`` with one direction gets the other's defaults.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from adapter.config import resources
from adapter.config.resources import Resource
from adapter.errors import ConfigError
from adapter.provider.selectors import Selector, from_label_selector
from adapter.quantity import parse_quantity
from gpupilot_common import yamlsafe
from hpa_controller import decide as hpa

_TARGET_FIELD = {"AverageValue": "averageValue", "Value": "value", "Utilization": "averageUtilization"}
_SOURCE_FIELD = {
    "Pods": "pods",
    "Object": "object",
    "External": "external",
    "Resource": "resource",
    "ContainerResource": "containerResource",
}


@dataclass(frozen=True)
class MetricSource:
    """One ``spec.metrics[i]``: the model's view plus where the adapter finds the values."""

    spec: hpa.MetricSpec
    metric_selector: Selector
    object_resource: Resource | None = None
    object_name: str = ""


DEFAULT_METRIC = MetricSource(
    hpa.MetricSpec("Resource", "cpu", "Utilization", 80.0, "", "resource/cpu"), Selector()
)
"""The API server's default when ``spec.metrics`` is empty: CPU at 80 % of requests."""


@dataclass(frozen=True)
class HpaSpec:
    path: str
    namespace: str
    name: str
    target_kind: str
    target_name: str
    model: hpa.HpaModel
    sources: tuple[MetricSource, ...]
    selector: Selector | None
    """The scale target's selector when the file also holds the target Deployment/StatefulSet."""

    @property
    def min_replicas(self) -> int:
        return self.model.min_replicas

    @property
    def max_replicas(self) -> int:
        return self.model.max_replicas


def load_hpa(path: Path) -> HpaSpec:
    try:
        docs = [d for d in yamlsafe.safe_load_all(yamlsafe.read_text(path)) if isinstance(d, Mapping)]
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from exc
    hpas = [d for d in docs if d.get("kind") == "HorizontalPodAutoscaler"]
    if not hpas:
        raise ConfigError(f"{path}: no HorizontalPodAutoscaler document found")
    doc = hpas[0]
    if doc.get("apiVersion") != "autoscaling/v2":
        raise ConfigError(f"{path}: apiVersion {doc.get('apiVersion')!r}: only autoscaling/v2 is supported")
    meta, spec = doc.get("metadata") or {}, doc.get("spec") or {}
    if not isinstance(spec, Mapping) or not isinstance(meta, Mapping):
        raise ConfigError(f"{path}: metadata and spec must be mappings")
    ref = spec.get("scaleTargetRef") or {}
    if not isinstance(ref, Mapping) or not ref.get("name"):
        raise ConfigError(f"{path}: spec.scaleTargetRef.name is required")
    namespace = str(meta.get("namespace") or "default")
    selector = None
    for d in docs:
        dmeta = d.get("metadata") or {}
        if (
            d.get("kind") == ref.get("kind")
            and isinstance(dmeta, Mapping)
            and dmeta.get("name") == ref.get("name")
        ):
            raw = (d.get("spec") or {}).get("selector")
            selector = from_label_selector(
                raw, where=f"{path}: {d.get('kind')} {ref.get('name')} spec.selector"
            )
    min_r = _int(spec.get("minReplicas", 1), f"{path}: spec.minReplicas", low=0)
    max_r = _int(spec.get("maxReplicas"), f"{path}: spec.maxReplicas", low=1)
    if min_r > max_r:
        raise ConfigError(
            f"{path}: spec.minReplicas {min_r} is greater than spec.maxReplicas {max_r} "
            "(the API server rejects this HPA; lower minReplicas or raise maxReplicas)"
        )
    raw_metrics = spec.get("metrics") or []
    if not isinstance(raw_metrics, list):
        raise ConfigError(f"{path}: spec.metrics must be a list")
    sources = tuple(_metric(m, where=f"{path}: spec.metrics[{i}]") for i, m in enumerate(raw_metrics)) or (
        DEFAULT_METRIC,
    )
    behavior = _behavior(spec.get("behavior"), where=f"{path}: spec.behavior")
    model = hpa.HpaModel(min_r, max_r, tuple(s.spec for s in sources), behavior)
    return HpaSpec(
        path=str(path),
        namespace=namespace,
        name=str(meta.get("name", "")),
        target_kind=str(ref.get("kind", "")),
        target_name=str(ref["name"]),
        model=model,
        sources=sources,
        selector=selector,
    )


def _int(value: object, where: str, *, low: int, high: int = 2**31 - 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ConfigError(f"{where}: {value} is out of range ({low}-{high})")
    return value


def _number(value: object, where: str, *, low: float = 0.0, high: float = math.inf) -> float:
    try:
        out = parse_quantity(value)  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {value!r} is not a quantity (e.g. 75, 500m, 0.1)") from exc
    if not (low <= out <= high):
        raise ConfigError(f"{where}: {value!r} is out of range ({low:g}-{high:g})")
    return out


def _metric(raw: object, *, where: str) -> MetricSource:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping with type and its source")
    kind = str(raw.get("type", ""))
    key = _SOURCE_FIELD.get(kind)
    if key is None:
        raise ConfigError(
            f"{where}.type: {kind!r} is not Pods, Object, External, Resource or ContainerResource"
        )
    body = raw.get(key)
    if not isinstance(body, Mapping):
        raise ConfigError(f"{where}.{key}: required for type {kind}")
    target = body.get("target")
    if not isinstance(target, Mapping):
        raise ConfigError(f"{where}.{key}.target: required")
    ttype = str(target.get("type", ""))
    tfield = _TARGET_FIELD.get(ttype)
    if tfield is None or tfield not in target:
        raise ConfigError(
            f"{where}.{key}.target: type {ttype!r} needs field {tfield or 'averageValue/value'}"
        )
    allowed = {
        "Pods": ("AverageValue",),
        "Object": ("Value", "AverageValue"),
        "External": ("Value", "AverageValue"),
        "Resource": ("Utilization", "AverageValue"),
        "ContainerResource": ("Utilization", "AverageValue"),
    }[kind]
    if ttype not in allowed:
        raise ConfigError(
            f"{where}.{key}.target.type: {kind} metrics take {' or '.join(allowed)}, not {ttype}"
        )
    if ttype == "Utilization":
        value = float(_int(target[tfield], f"{where}.{key}.target.{tfield}", low=1))
    else:
        value = _number(target[tfield], f"{where}.{key}.target.{tfield}")
        if value <= 0:
            raise ConfigError(f"{where}.{key}.target.{tfield}: must be positive")
    if kind in ("Resource", "ContainerResource"):
        name = str(body.get("name", ""))
        if not name:
            raise ConfigError(f"{where}.{key}.name: required (cpu or memory)")
        container = str(body.get("container", "")) if kind == "ContainerResource" else ""
        spec = hpa.MetricSpec(kind, name, ttype, value, container, f"resource/{name}")
        return MetricSource(spec, Selector())
    metric = body.get("metric")
    if not isinstance(metric, Mapping) or not metric.get("name"):
        raise ConfigError(f"{where}.{key}.metric.name: required")
    name = str(metric["name"])
    msel = from_label_selector(metric.get("selector"), where=f"{where}.{key}.metric.selector")
    if kind == "Object":
        obj = body.get("describedObject")
        if not isinstance(obj, Mapping) or not obj.get("name"):
            raise ConfigError(f"{where}.object.describedObject: kind and name are required")
        res = resources.lookup(str(obj.get("kind", "")))
        if res is None:
            raise ConfigError(f"{where}.object.describedObject.kind {obj.get('kind')!r} is not supported")
        label = f"{res.qualified}/{obj['name']}/{name}"
        return MetricSource(hpa.MetricSpec(kind, name, ttype, value, "", label), msel, res, str(obj["name"]))
    return MetricSource(hpa.MetricSpec(kind, name, ttype, value, "", f"{kind.lower()}/{name}"), msel)


def _behavior(raw: object, *, where: str) -> hpa.Behavior | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping")
    up = _rules(raw.get("scaleUp"), where=f"{where}.scaleUp", make=hpa.scale_up_rules)
    down = _rules(raw.get("scaleDown"), where=f"{where}.scaleDown", make=hpa.scale_down_rules)
    return hpa.Behavior(up, down)


def _rules(raw: object, *, where: str, make: Any) -> hpa.Rules:
    if raw is None:
        return make()  # type: ignore[no-any-return]
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping")
    window = raw.get("stabilizationWindowSeconds")
    select = raw.get("selectPolicy")
    if select is not None and select not in ("Max", "Min", "Disabled"):
        raise ConfigError(f"{where}.selectPolicy: {select!r} is not Max, Min or Disabled")
    tolerance = raw.get("tolerance")
    policies = []
    for i, p in enumerate(raw.get("policies") or []):
        pw = f"{where}.policies[{i}]"
        if not isinstance(p, Mapping) or p.get("type") not in ("Pods", "Percent"):
            raise ConfigError(f"{pw}.type: must be Pods or Percent")
        policies.append(
            hpa.Policy(
                str(p["type"]),
                _int(p.get("value"), f"{pw}.value", low=1),
                _int(p.get("periodSeconds"), f"{pw}.periodSeconds", low=1, high=1800),
            )
        )
    return make(  # type: ignore[no-any-return]
        stabilization_seconds=None
        if window is None
        else _int(window, f"{where}.stabilizationWindowSeconds", low=0, high=3600),
        select_policy=None if select is None else str(select),
        policies=tuple(policies) or None,
        tolerance=None if tolerance is None else _number(tolerance, f"{where}.tolerance", high=1e9),
    )
