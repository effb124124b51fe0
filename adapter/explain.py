"""``explain-hpa``: what an ``autoscaling/v2`` HPA would do now, metric by metric.

Values come through :class:`adapter.values.MetricValues` — the code path the server answers the
HPA with — and the arithmetic through :mod:`adapter.hpa`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from adapter import hpa, resources
from adapter.errors import AdapterError, BadRequest, ConfigError
from adapter.podsource import Pod
from adapter.quantity import parse_quantity
from adapter.selectors import Selector, from_label_selector, parse_selector
from adapter.values import MetricValues


@dataclass(frozen=True)
class HpaSpec:
    namespace: str
    name: str
    target_kind: str
    target_name: str
    min_replicas: int
    max_replicas: int
    metrics: list[Mapping[str, Any]]
    behavior: Mapping[str, Any] | None
    selector: Selector | None
    """The scale target's selector when the file also holds the target Deployment/StatefulSet."""


@dataclass
class MetricRow:
    label: str
    kind: str
    target: str
    current: str = "-"
    with_values: str = "-"
    proposal: str = "-"
    note: str = ""
    per_pod: dict[str, float] = field(default_factory=dict)
    replicas: int | None = None


def load_hpa(path: Path) -> HpaSpec:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, Mapping)]
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
    ref = spec.get("scaleTargetRef") or {}
    if not ref.get("name"):
        raise ConfigError(f"{path}: spec.scaleTargetRef.name is required")
    namespace = str(meta.get("namespace") or "default")
    selector = None
    for d in docs:
        dmeta = d.get("metadata") or {}
        if d.get("kind") == ref.get("kind") and dmeta.get("name") == ref.get("name"):
            raw = (d.get("spec") or {}).get("selector")
            selector = from_label_selector(
                raw, where=f"{path}: {d.get('kind')} {ref.get('name')} spec.selector"
            )
    try:
        min_r, max_r = int(spec.get("minReplicas", 1)), int(spec["maxReplicas"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: spec.maxReplicas (and minReplicas if given) must be integers") from exc
    return HpaSpec(
        namespace=namespace,
        name=str(meta.get("name", "")),
        target_kind=str(ref.get("kind", "")),
        target_name=str(ref["name"]),
        min_replicas=min_r,
        max_replicas=max_r,
        metrics=list(spec.get("metrics") or []),
        behavior=spec.get("behavior"),
        selector=selector,
    )


def _rules(raw: Mapping[str, Any] | None, default: hpa.Rules) -> hpa.Rules | None:
    if raw is None:
        return None
    policies = tuple(
        hpa.Policy(str(p.get("type")), int(p.get("value", 0)), int(p.get("periodSeconds", 15)))
        for p in raw.get("policies") or []
    )
    return hpa.Rules(
        int(raw.get("stabilizationWindowSeconds", default.stabilization_seconds)),
        str(raw.get("selectPolicy", "Max")),
        policies or default.policies,
    )


@dataclass
class Explanation:
    spec: HpaSpec
    selector: Selector
    pods: list[Pod]
    current: int
    rows: list[MetricRow]
    decision: hpa.Decision


def explain(
    spec: HpaSpec, *, values: MetricValues, selector: Selector, current_replicas: int | None, pods: list[Pod]
) -> Explanation:
    states = [hpa.PodState(p.name, p.phase, p.ready) for p in pods]
    current = current_replicas if current_replicas is not None else len(pods)
    rows: list[MetricRow] = []
    proposals: list[int] = []
    failed = 0
    for i, metric in enumerate(spec.metrics):
        row = _one_metric(
            i, metric, spec=spec, values=values, selector=selector, current=current, states=states
        )
        rows.append(row)
        if row.replicas is not None:
            proposals.append(row.replicas)
        elif row.kind != "Resource":
            failed += 1
    behavior = spec.behavior or {}
    decision = hpa.decide(
        current=current,
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        proposals=proposals,
        failed_metrics=failed,
        scale_up=_rules(behavior.get("scaleUp"), hpa.DEFAULT_SCALE_UP),
        scale_down=_rules(behavior.get("scaleDown"), hpa.DEFAULT_SCALE_DOWN),
        behavior_given=spec.behavior is not None,
    )
    return Explanation(spec, selector, pods, current, rows, decision)


def _target(target: Mapping[str, Any]) -> tuple[str, float]:
    kind = str(target.get("type", ""))
    key = {"AverageValue": "averageValue", "Value": "value", "Utilization": "averageUtilization"}.get(kind)
    if key is None or key not in target:
        raise BadRequest(f"target type {kind!r} needs field {key or 'averageValue/value'}")
    return kind, parse_quantity(target[key])


def _one_metric(
    i: int,
    metric: Mapping[str, Any],
    *,
    spec: HpaSpec,
    values: MetricValues,
    selector: Selector,
    current: int,
    states: list[hpa.PodState],
) -> MetricRow:
    kind = str(metric.get("type", ""))
    where = f"spec.metrics[{i}]"
    body = metric.get(kind[:1].lower() + kind[1:]) or {}
    if kind in ("Resource", "ContainerResource"):
        name = body.get("name", "?")
        return MetricRow(f"resource/{name}", kind, "-", note="served by metrics-server, not by this adapter")
    m = body.get("metric") or {}
    name = str(m.get("name", ""))
    try:
        target_type, target = _target(body.get("target") or {})
        msel = from_label_selector(m.get("selector"), where=f"{where}.{kind.lower()}.metric.selector")
        if kind == "Pods":
            row = MetricRow(f"pods/{name}", kind, f"avg {target:g}")
            result = values.for_objects(
                metric=name,
                resource=resources.PODS,
                namespace=spec.namespace,
                name="*",
                selector=selector,
                metric_selector=msel,
            )
            per_pod = {v.name: v.value for v in result.values}
            row.per_pod = per_pod
            p = hpa.pods_metric(current_replicas=current, target=target, values=per_pod, pods=states or None)
            row.current = f"{p.usage:.4g}"
            row.with_values = f"{len(per_pod)}/{len(states) or len(per_pod)}"
        elif kind == "Object":
            obj = body.get("describedObject") or {}
            res = resources.lookup(str(obj.get("kind", "")))
            if res is None:
                raise BadRequest(f"{where}.object.describedObject.kind {obj.get('kind')!r} is not supported")
            row = MetricRow(f"{res.qualified}/{obj.get('name')}/{name}", kind, f"{target_type} {target:g}")
            result = values.for_objects(
                metric=name,
                resource=res,
                namespace=spec.namespace if res.namespaced else "",
                name=str(obj.get("name", "")),
                selector=Selector(),
                metric_selector=msel,
            )
            value = result.values[0].value
            p = (
                hpa.value_metric(current_replicas=current, target=target, value=value, pods=states or None)
                if target_type == "Value"
                else hpa.average_value_metric(current_replicas=current, target=target, value=value)
            )
            row.current = f"{value:.4g}"
        elif kind == "External":
            row = MetricRow(f"external/{name}", kind, f"{target_type} {target:g}")
            ext = values.external(metric=name, namespace=spec.namespace, selector=msel)
            if not ext:
                raise hpa.MetricUnavailable("no series matched (the HPA reports FailedGetExternalMetric)")
            total = sum(v.value for v in ext)
            p = (
                hpa.value_metric(current_replicas=current, target=target, value=total, pods=states or None)
                if target_type == "Value"
                else hpa.average_value_metric(current_replicas=current, target=target, value=total)
            )
            row.current = f"{total:.4g}" + (f" (sum of {len(ext)})" if len(ext) > 1 else "")
        else:
            return MetricRow(f"{kind}?", kind, "-", note=f"{where}: unknown metric type {kind!r}")
    except (AdapterError, hpa.MetricUnavailable) as exc:
        return MetricRow(f"{kind.lower()}/{name}", kind, "-", proposal="failed", note=str(exc))
    row.replicas = p.replicas
    row.proposal = f"{p.replicas}  (ratio {p.ratio:.3f})"
    notes = [p.note] if p.note else []
    if p.missing_pods:
        notes.append("missing: " + ", ".join(p.missing_pods[:5]) + (" …" if len(p.missing_pods) > 5 else ""))
    row.note = "; ".join(notes)
    return row


def render(ex: Explanation) -> str:
    s = ex.spec
    ready = sum(1 for p in ex.pods if p.ready)
    lines = [
        f"HPA {s.namespace}/{s.name} → {s.target_kind}/{s.target_name}",
        f"  selector {ex.selector or '(none)'}: {len(ex.pods)} pod(s), {ready} ready; "
        f"current replicas {ex.current}; min {s.min_replicas}, max {s.max_replicas}; tolerance {hpa.TOLERANCE:g}",
        "",
    ]
    header = ("METRIC", "TYPE", "TARGET", "CURRENT", "WITH VALUE", "PROPOSAL")
    table = [header] + [(r.label, r.kind, r.target, r.current, r.with_values, r.proposal) for r in ex.rows]
    widths = [max(len(row[c]) for row in table) for c in range(len(header))]
    for row in table:
        lines.append("  " + "  ".join(cell.ljust(widths[c]) for c, cell in enumerate(row)).rstrip())
    for r in ex.rows:
        if r.note:
            lines.append(f"    {r.label}: {r.note}")
    pod_rows = [r for r in ex.rows if r.per_pod or r.kind == "Pods"]
    if pod_rows and ex.pods:
        lines += ["", "  per pod:"]
        names = sorted({p.name for p in ex.pods})
        width = max(len(n) for n in names)
        state = {p.name: ("ready" if p.ready else p.phase.lower() or "unready") for p in ex.pods}
        for n in names[:50]:
            cells = [f"{r.label.split('/')[-1]}={_fmt(r.per_pod.get(n))}" for r in pod_rows]
            lines.append(f"    {n.ljust(width)}  {state[n]:<8} " + "  ".join(cells))
        if len(names) > 50:
            lines.append(f"    … {len(names) - 50} more")
    d = ex.decision
    lines += ["", "  decision:"] + [f"    - {step}" for step in d.steps]
    verb = "scale up" if d.final > d.current else "scale down" if d.final < d.current else "no change"
    lines.append(f"  FINAL: {d.current} → {d.final} replicas ({verb})")
    return "\n".join(lines)


def _fmt(v: float | None) -> str:
    return "missing" if v is None else f"{v:.4g}"


def target_selector(spec: HpaSpec, flag: str | None) -> tuple[Selector, str]:
    """The selector to use and where it came from."""
    if flag:
        return parse_selector(flag), "--selector"
    if spec.selector is not None:
        return spec.selector, f"{spec.target_kind} {spec.target_name} in the same file"
    return parse_selector(f"app={spec.target_name}"), f"guessed app={spec.target_name} (pass --selector)"
