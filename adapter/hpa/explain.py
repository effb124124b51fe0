"""``explain-hpa``: what an ``autoscaling/v2`` HPA would do now, metric by metric.

Values come through :class:`adapter.provider.values.MetricValues` — the code path the server answers the
HPA with — or from a ``--state`` file (:mod:`adapter.hpa.state`); the decision is
:func:`hpa_controller.decide.decide`. The output says where each input came from (pods, values, history).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from adapter.clients.kube import KubeClient
from adapter.clients.prometheus import PrometheusClient
from adapter.config import resources
from adapter.errors import AdapterError
from adapter.hpa import replay
from adapter.hpa.spec import HpaSpec, MetricSource
from adapter.provider import resourcemetrics
from adapter.provider.podsource import Pod
from adapter.provider.selectors import Selector, parse_selector
from adapter.provider.values import MetricValues
from gpupilot_common.table import Column, terminal_width
from gpupilot_common.table import render as render_table
from gpupilot_common.text import plural
from gpupilot_common.timefmt import format_duration, format_time
from hpa_controller import decide as hpa
from hpa_controller.calc import PodState


@dataclass
class Inputs:
    """Everything the decision reads, and where it came from."""

    pods: list[PodState]
    observations: list[hpa.Observation]
    current: int
    status: int
    history: hpa.History
    now: float
    sources: list[str] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)


@dataclass
class Explanation:
    spec: HpaSpec
    inputs: Inputs
    decision: hpa.Decision


def pod_states(pods: Sequence[Pod]) -> list[PodState]:
    """Pods from a pod source: phase and readiness only (start times unknown)."""
    return [PodState(p.name, p.phase or "Running", p.ready) for p in pods]


def cluster_pod_states(kube: KubeClient, namespace: str, selector: Selector) -> list[PodState]:
    """The selected pods as the controller lists them (every phase), with start and Ready times and
    container requests."""
    return [
        PodState(
            d.name,
            d.phase or "Running",
            d.ready,
            d.deleting,
            d.start_time,
            d.ready_transition,
            d.has_ready_condition,
            d.requests,
        )
        for d in kube.pod_details(namespace)
        if selector.matches(d.labels)
    ]


def observe(
    spec: HpaSpec,
    *,
    values: MetricValues,
    prometheus: PrometheusClient | None,
    selector: Selector,
    pods: list[PodState],
    kube: KubeClient | None = None,
) -> tuple[list[hpa.Observation], list[PodState]]:
    """Fetch every metric of ``spec`` now. Resource metrics come from metrics-server when ``kube`` is
    given (requests from the pods' specs), else from Prometheus (requests from kube-state-metrics)."""
    observations: list[hpa.Observation] = []
    requests: dict[str, dict[str, int]] = {p.name: dict(p.requests) for p in pods}
    for source in spec.sources:
        try:
            obs, extra = _observe_one(
                source, spec=spec, values=values, prometheus=prometheus, selector=selector, kube=kube
            )
        except AdapterError as exc:
            obs, extra = hpa.Observation(error=str(exc)), {}
        observations.append(obs)
        if extra:
            key = resourcemetrics.request_key(source.spec.name, source.spec.container)
            requests = resourcemetrics.merge_requests(requests, extra, key)
    filled = [replace(p, requests=requests.get(p.name, {})) for p in pods]
    return observations, filled


def _observe_one(
    source: MetricSource,
    *,
    spec: HpaSpec,
    values: MetricValues,
    prometheus: PrometheusClient | None,
    selector: Selector,
    kube: KubeClient | None = None,
) -> tuple[hpa.Observation, dict[str, int]]:
    m = source.spec
    if m.kind == "Pods":
        result = values.for_objects(
            metric=m.name,
            resource=resources.PODS,
            namespace=spec.namespace,
            name="*",
            selector=selector,
            metric_selector=source.metric_selector,
        )
        per_pod = {v.name: v.value for v in result.values}
        stamp = max((v.timestamp for v in result.values), default=None)
        window = float(result.values[0].window_seconds) if result.values else 60.0
        return hpa.Observation(per_pod=per_pod, timestamp=stamp, window_seconds=window), {}
    if m.kind == "Object":
        assert source.object_resource is not None
        res = source.object_resource
        result = values.for_objects(
            metric=m.name,
            resource=res,
            namespace=spec.namespace if res.namespaced else "",
            name=source.object_name,
            selector=Selector(),
            metric_selector=source.metric_selector,
        )
        return hpa.Observation(values=(result.values[0].value,)), {}
    if m.kind == "External":
        ext = values.external(metric=m.name, namespace=spec.namespace, selector=source.metric_selector)
        if not ext:
            return hpa.Observation(error="no series matched (the HPA reports FailedGetExternalMetric)"), {}
        return hpa.Observation(values=tuple(v.value for v in ext)), {}
    if kube is not None:
        key = resourcemetrics.request_key(m.name, m.container)
        measured = kube.pod_usage(spec.namespace)
        per_pod = {name: u.usage[key] for name, u in measured.items() if key in u.usage}
        if not per_pod:
            return hpa.Observation(error="no metrics returned from resource metrics API"), {}
        stamps = [u.timestamp for u in measured.values() if u.timestamp is not None]
        window = max((u.window_seconds for u in measured.values()), default=60.0)
        return hpa.Observation(
            per_pod=per_pod, timestamp=max(stamps, default=None), window_seconds=window
        ), {}
    if prometheus is None:
        return hpa.Observation(error="resource metrics need Prometheus (or a --state file)"), {}
    usage, requests = resourcemetrics.fetch(
        prometheus, namespace=spec.namespace, resource=m.name, container=m.container
    )
    return hpa.Observation(per_pod=usage, window_seconds=60.0), requests


def explain(spec: HpaSpec, inputs: Inputs) -> Explanation:
    decision = hpa.decide(
        spec.model,
        spec_replicas=inputs.current,
        status_replicas=inputs.status,
        pods=inputs.pods,
        observations=inputs.observations,
        history=inputs.history,
        now=inputs.now,
    )
    return Explanation(spec, inputs, decision)


def no_history_caveat(spec: HpaSpec, inputs: Inputs) -> str | None:
    """What a missing history hides: the decision of a new HPA (memory starting at the current size)."""
    fresh = hpa.decide(
        spec.model,
        spec_replicas=inputs.current,
        status_replicas=inputs.status,
        pods=inputs.pods,
        observations=inputs.observations,
        history=hpa.History(),
        now=inputs.now,
    )
    window = (
        spec.model.behavior.scale_down.stabilization_seconds
        if spec.model.behavior
        else hpa.DOWNSCALE_STABILISATION
    )
    text = (
        f"no history: assumed no other recommendation in the last {window}s and no scale event inside the "
        "policies' periods"
    )
    if fresh.final != explain(spec, inputs).decision.final:
        text += f"; an HPA created just now (its memory starts at {inputs.current}) would go to {fresh.final}"
    return text


def check_hpa_status(spec: HpaSpec, inputs: Inputs, *, kube: KubeClient) -> None:
    """Cross-check with the HPA object in the cluster: its last scale, and whether the rebuilt history
    shows it (scale events drive the policies)."""
    try:
        status = kube.hpa_status(spec.namespace, spec.name)
    except AdapterError as exc:
        inputs.caveats.append(f"the HPA's status could not be read: {exc}")
        return
    if status is None:
        inputs.caveats.append(
            f"HPA {spec.namespace}/{spec.name} is not in the cluster: nothing to cross-check"
        )
        return
    if status.last_scale_time is None:
        inputs.sources.append("the HPA's status: it never scaled")
        return
    ago = inputs.now - status.last_scale_time
    inputs.sources.append(
        f"the HPA's status: last scale {format_duration(max(ago, 0))} ago ({format_time(status.last_scale_time)}), "
        f"now {status.current_replicas} → desired {status.desired_replicas}"
    )
    events = inputs.history.scale_up_events + inputs.history.scale_down_events
    longest = replay.history_window(spec.model)
    if ago <= longest and not any(abs(e.at - status.last_scale_time) <= 60 for e in events):
        inputs.caveats.append(
            f"the HPA scaled {format_duration(max(ago, 0))} ago, inside its {longest}s of policy periods, but the "
            "history used here has no such event: its policies may allow less than shown"
        )


@dataclass(frozen=True)
class MetricLine:
    """One metric of the explanation, as the table and the JSON document show it."""

    label: str
    kind: str
    target_type: str
    target: float
    current: float | None = None
    utilization: int | None = None
    with_value: tuple[int, int] | None = None
    """Pods with a value / pods, for per-pod metrics."""
    proposal: int | None = None
    ratio: float | None = None
    error: str = ""
    notes: tuple[str, ...] = ()
    summed: int = 0
    """External metrics: how many series were summed (more than 1 is shown)."""


def metric_lines(ex: Explanation) -> list[MetricLine]:
    s, inp, d = ex.spec, ex.inputs, ex.decision
    by_spec = {id(o.spec): o for o in d.outcomes}
    names = {pod.name for pod in inp.pods}
    out = []
    for source, obs in zip(s.sources, inp.observations, strict=False):
        m = source.spec
        outcome = by_spec.get(id(m))
        base = MetricLine(m.label, m.kind, m.target_type, m.target)
        if outcome is None:
            out.append(replace(base, error="not read"))
            continue
        with_value = (
            (sum(1 for n in obs.per_pod if n in names), len(inp.pods)) if obs.per_pod is not None else None
        )
        p = outcome.proposal
        if p is None:
            out.append(replace(base, with_value=with_value, error=outcome.error or "failed"))
            continue
        notes = [p.note] if p.note else []
        if p.missing:
            notes.append("missing: " + ", ".join(p.missing[:5]) + (" …" if len(p.missing) > 5 else ""))
        out.append(
            replace(
                base,
                current=p.usage / 1000,
                utilization=p.utilization,
                with_value=with_value,
                proposal=p.replicas,
                ratio=p.ratio,
                notes=tuple(notes),
                summed=len(obs.values) if m.kind == "External" else 0,
            )
        )
    return out


def _pod_state(pod: PodState) -> str:
    if pod.deleting:
        return "deleting"
    if pod.ready and pod.phase == "Running":
        return "ready"
    return pod.phase.lower() if pod.phase != "Running" else "unready"


METRIC_COLUMNS = (
    Column("METRIC"),
    Column("TYPE"),
    Column("TARGET"),
    Column("CURRENT", right=True),
    Column("WITH VALUE", right=True, drop=1),
    Column("PROPOSAL"),
)


def render(ex: Explanation, *, wide: bool = False) -> str:
    s, inp, d = ex.spec, ex.inputs, ex.decision
    ready = sum(1 for p in inp.pods if p.ready and p.phase == "Running")
    tol = s.model.tolerances()
    tolerance = f"{tol.up:g}" if tol.up == tol.down else f"up {tol.up:g} / down {tol.down:g}"
    lines = [
        f"HPA {s.namespace}/{s.name} → {s.target_kind}/{s.target_name}  (decision as Kubernetes {hpa.KUBERNETES_RELEASE})",
        f"  {plural(len(inp.pods), 'pod')}, {ready} ready; current replicas {inp.current}; "
        f"min {s.min_replicas}, max {s.max_replicas}; tolerance {tolerance}; "
        f"behavior {'as written' if s.model.behavior else 'absent (legacy rules)'}",
        "",
    ]
    rows = []
    notes: list[str] = []
    for m in metric_lines(ex):
        target = f"{m.target_type} {m.target:g}" + ("%" if m.target_type == "Utilization" else "")
        with_value = f"{m.with_value[0]}/{m.with_value[1]}" if m.with_value is not None else "-"
        if m.proposal is None:
            rows.append(
                (m.label, m.kind, target, "-", with_value, "failed" if m.error != "not read" else m.error)
            )
            if m.error != "not read":
                notes.append(f"    {m.label}: {m.error}")
            continue
        current = f"{m.utilization}%" if m.utilization is not None else f"{m.current:.6g}"
        if m.summed > 1:
            current += f" (sum of {m.summed})"
        rows.append((m.label, m.kind, target, current, with_value, f"{m.proposal}  (ratio {m.ratio:.3f})"))
        if m.notes:
            notes.append(f"    {m.label}: " + "; ".join(m.notes))
    lines += [
        "  " + line for line in render_table(METRIC_COLUMNS, rows, width=_width(), wide=wide).splitlines()
    ]
    lines += notes
    pod_metrics = [
        (src, obs) for src, obs in zip(s.sources, inp.observations, strict=False) if obs.per_pod is not None
    ]
    if pod_metrics and inp.pods:
        lines += ["", "  per pod:"]
        columns = [Column("POD"), Column("STATE")] + [
            Column(src.spec.name, right=True) for src, _ in pod_metrics
        ]
        pod_rows = [
            [pod.name, _pod_state(pod)] + [_fmt((obs.per_pod or {}).get(pod.name)) for _, obs in pod_metrics]
            for pod in sorted(inp.pods, key=lambda p: p.name)[:50]
        ]
        lines += [
            "    " + line for line in render_table(columns, pod_rows, width=_width(2), wide=wide).splitlines()
        ]
        if len(inp.pods) > 50:
            lines.append(f"    … {len(inp.pods) - 50} more")
    lines += ["", "  decision:"] + [f"    - {step}" for step in d.steps]
    lines.append(f"  FINAL: {d.current} → {d.final} replicas ({_verb(d)})")
    if inp.sources or inp.caveats:
        lines.append("")
    lines += [f"  ({src})" for src in inp.sources]
    lines += [f"  caveat: {c}" for c in inp.caveats]
    return "\n".join(lines)


def _width(indent: int = 1) -> int:
    return max(40, terminal_width() - 2 * indent)


def _verb(d: hpa.Decision) -> str:
    return "scale up" if d.final > d.current else "scale down" if d.final < d.current else "no change"


def document(ex: Explanation) -> dict[str, object]:
    """What ``-o json``/``-o yaml`` print (schema: :data:`adapter.commands.explain_hpa.OUTPUT_SCHEMA`)."""
    s, inp, d = ex.spec, ex.inputs, ex.decision
    tol = s.model.tolerances()
    pod_metrics = [
        (src, obs) for src, obs in zip(s.sources, inp.observations, strict=False) if obs.per_pod is not None
    ]
    return {
        "hpa": {"namespace": s.namespace, "name": s.name, "target": f"{s.target_kind}/{s.target_name}"},
        "kubernetes": hpa.KUBERNETES_RELEASE,
        "at": format_time(inp.now),
        "current_replicas": inp.current,
        "min_replicas": s.min_replicas,
        "max_replicas": s.max_replicas,
        "tolerance": {"up": tol.up, "down": tol.down},
        "behavior": s.model.behavior is not None,
        "pods": {
            "total": len(inp.pods),
            "ready": sum(1 for p in inp.pods if p.ready and p.phase == "Running"),
        },
        "metrics": [
            {
                "metric": m.label,
                "type": m.kind,
                "target": {"type": m.target_type, "value": m.target},
                "current": m.current,
                "utilization": m.utilization,
                "pods_with_value": m.with_value[0] if m.with_value is not None else None,
                "proposal": m.proposal,
                "ratio": m.ratio,
                "error": m.error,
                "notes": list(m.notes),
            }
            for m in metric_lines(ex)
        ],
        "per_pod": [
            {
                "name": pod.name,
                "state": _pod_state(pod),
                "values": {src.spec.name: (obs.per_pod or {}).get(pod.name) for src, obs in pod_metrics},
            }
            for pod in sorted(inp.pods, key=lambda p: p.name)
        ]
        if pod_metrics
        else [],
        "decision": {
            "recommended": d.recommended,
            "final": d.final,
            "change": _verb(d),
            "failed": d.failed,
            "steps": list(d.steps),
        },
        "sources": list(inp.sources),
        "caveats": list(inp.caveats),
    }


def _fmt(v: float | None) -> str:
    return "missing" if v is None else f"{v:.4g}"


def target_selector(spec: HpaSpec, flag: str | None) -> tuple[Selector, str]:
    """The selector to use and where it came from."""
    if flag:
        return parse_selector(flag), "--selector"
    if spec.selector is not None:
        return spec.selector, f"{spec.target_kind} {spec.target_name} in the same file"
    return parse_selector(f"app={spec.target_name}"), f"guessed app={spec.target_name} (pass --selector)"
