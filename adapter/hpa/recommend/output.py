"""recommend-hpa's answer: the table (current beside recommended), the recommended HPA as YAML, and
the ``-o json|yaml`` document (schema: :data:`adapter.commands.recommend_hpa.OUTPUT_SCHEMA`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import yaml

from adapter.hpa.recommend.capacity import Curve
from adapter.hpa.recommend.fitting import Fitted
from adapter.hpa.recommend.model import Bound
from adapter.hpa.recommend.search import Days, Outcome, Score, recommended_model
from adapter.hpa.spec import HpaSpec
from adapter.quantity import format_quantity
from gpupilot_common import yamlsafe
from gpupilot_common.table import Column, render
from gpupilot_common.timefmt import format_time
from hpa_controller import decide as hpa

TRUST_LIMIT = 0.10
"""The model's replica-hours error on the training days above which the recommendation says it
cannot be trusted."""


@dataclass(frozen=True)
class Context:
    spec: HpaSpec
    fitted: Fitted
    outcome: Outcome
    days: Days
    times: npt.NDArray[np.float64]
    recorded: npt.NDArray[np.int64]
    signal: npt.NDArray[np.float64]
    bound: Bound
    gpus_per_pod: float
    bridged: int


def _day_label(ctx: Context, day: int) -> str:
    first = ctx.times[ctx.days.index == day]
    return format_time(float(first[0]))[:10] if len(first) else str(day)


def recorded_score(ctx: Context) -> Score:
    ndays = len(ctx.days.steps)
    b = ctx.bound
    broken = (ctx.signal > b.value) if b.upper else (ctx.signal < b.value)
    return Score(
        np.bincount(ctx.days.index, weights=ctx.recorded.astype(np.float64), minlength=ndays).astype(
            np.float64
        ),
        np.bincount(ctx.days.index, weights=broken.astype(np.float64), minlength=ndays).astype(np.float64),
        int(np.sum(np.diff(ctx.recorded) > 0)),
        int(np.sum(np.diff(ctx.recorded) < 0)),
    )


def replay_error(ctx: Context) -> dict[str, Any]:
    """The current configuration replayed by the model against what was recorded, training days."""
    train_steps = ctx.days.training[ctx.days.index]
    replayed = ctx.outcome.current_replicas.astype(np.float64)[train_steps]
    recorded = ctx.recorded[train_steps].astype(np.float64)
    rec_hours = float(recorded.sum())
    error = (float(replayed.sum()) - rec_hours) / rec_hours if rec_hours else 0.0
    rec = recorded_score(ctx)
    cur = ctx.outcome.current
    which = ctx.days.training
    steps = max(1, int(ctx.days.steps[which].sum()))
    return {
        "replica_hours_percent": round(error * 100, 2),
        "mean_abs_replicas": round(float(np.mean(np.abs(replayed - recorded))), 3) if len(recorded) else 0.0,
        "broken_share_predicted": round(float(cur.broken_steps[which].sum()) / steps, 5),
        "broken_share_recorded": round(float(rec.broken_steps[which].sum()) / steps, 5),
        "trusted": abs(error) <= TRUST_LIMIT,
    }


def figures(ctx: Context, score: Score) -> dict[str, Any]:
    step = ctx.fitted.model.step
    d = ctx.days
    share = score.broken_share(d)
    held_days = np.flatnonzero(d.held_out)
    train_days = np.flatnonzero(d.training)
    return {
        "held_out": {
            "replica_hours": round(score.replica_hours(d, d.held_out, step), 2),
            "gpu_hours": round(score.replica_hours(d, d.held_out, step) * ctx.gpus_per_pod, 2),
            "bound_broken_minutes": {
                _day_label(ctx, int(k)): round(float(score.broken_steps[k]) * step / 60, 1) for k in held_days
            },
            "bound_broken_share_worst_day": round(float(share[d.held_out].max()), 5),
            "bound_held": bool(np.all(share[d.held_out] <= ctx.bound.budget + 1e-12)),
        },
        "training": {
            "replica_hours": round(score.replica_hours(d, d.training, step), 2),
            "gpu_hours": round(score.replica_hours(d, d.training, step) * ctx.gpus_per_pod, 2),
            "bound_broken_share_worst_day": round(float(share[train_days].max()), 5)
            if len(train_days)
            else 0.0,
        },
        "scale_ups": score.ups,
        "scale_downs": score.downs,
        "extrapolated_steps": score.extrapolated,
    }


def configuration(model: hpa.HpaModel) -> dict[str, Any]:
    out: dict[str, Any] = {
        "minReplicas": model.min_replicas,
        "maxReplicas": model.max_replicas,
        "targets": {m.name: m.target for m in model.metrics},
    }
    if model.behavior is not None:
        out["behavior"] = _behavior(model.behavior)
    return out


def _behavior(b: hpa.Behavior) -> dict[str, Any]:
    def rules(r: hpa.Rules) -> dict[str, Any]:
        out: dict[str, Any] = {
            "stabilizationWindowSeconds": r.stabilization_seconds,
            "selectPolicy": r.select_policy,
            "policies": [
                {"type": p.kind, "value": p.value, "periodSeconds": p.period_seconds} for p in r.policies
            ],
        }
        if r.tolerance is not None:
            out["tolerance"] = format_quantity(r.tolerance)
        return out

    return {"scaleUp": rules(b.scale_up), "scaleDown": rules(b.scale_down)}


def hpa_document(spec: HpaSpec, model: hpa.HpaModel) -> dict[str, Any]:
    """The HPA file's document with the recommended targets, bounds and behaviour (metrics that
    are not in ``model`` left out)."""
    docs = [d for d in yamlsafe.safe_load_all(yamlsafe.read_text(Path(spec.path))) if isinstance(d, Mapping)]
    doc = copy.deepcopy(dict(next(d for d in docs if d.get("kind") == "HorizontalPodAutoscaler")))
    body = dict(doc.get("spec") or {})
    body["minReplicas"] = model.min_replicas
    body["maxReplicas"] = model.max_replicas
    targets = {(m.kind, m.name, m.container): m for m in model.metrics}
    metrics = []
    for written, source in zip(body.get("metrics") or [], spec.sources, strict=False):
        key = (source.spec.kind, source.spec.name, source.spec.container)
        if key not in targets:
            continue
        m = targets[key]
        raw = copy.deepcopy(written)
        field = {"Pods": "pods", "Object": "object", "External": "external", "Resource": "resource"}.get(
            m.kind, "containerResource"
        )
        target = raw[field]["target"]
        if m.target_type == "Utilization":
            target["averageUtilization"] = int(m.target)
        elif m.target_type == "AverageValue":
            target["averageValue"] = format_quantity(m.target)
        else:
            target["value"] = format_quantity(m.target)
        metrics.append(raw)
    body["metrics"] = metrics
    if model.behavior is not None:
        body["behavior"] = _behavior(model.behavior)
    else:
        body.pop("behavior", None)
    doc["spec"] = body
    return doc


def utilization_notes(spec: HpaSpec, model: hpa.HpaModel, requests: Mapping[str, int]) -> list[str]:
    out = []
    for m in model.metrics:
        if m.target_type != "Utilization":
            continue
        request = requests.get(m.name, 0)
        if request:
            equivalent = format_quantity(request / 1000 * m.target / 100)
            out.append(
                f"{m.name} Utilization {m.target:g} % moves with the pods' requests (now {format_quantity(request / 1000)}): "
                f"the same point as an AverageValue target is {equivalent}"
            )
        else:
            out.append(
                f"{m.name} Utilization {m.target:g} % moves with the pods' requests (not found in history)"
            )
    del spec
    return out


def document(ctx: Context, *, requests: Mapping[str, int], warnings: Sequence[str]) -> dict[str, Any]:
    o, f, spec = ctx.outcome, ctx.fitted, ctx.spec
    error = replay_error(ctx)
    current = {"configuration": configuration(spec.model), **figures(ctx, o.current)}
    recommended: dict[str, Any] | None = None
    if o.recommended is not None and o.recommended_score is not None:
        final = recommended_model(o.recommended)
        rec_fig = figures(ctx, o.recommended_score)
        cur_hours = current["held_out"]["replica_hours"]
        saving = (1 - rec_fig["held_out"]["replica_hours"] / cur_hours) * 100 if cur_hours else 0.0
        recommended = {
            "configuration": configuration(final),
            "dropped_metrics": list(o.recommended.dropped),
            "found_as": o.recommended.label,
            **rec_fig,
            "saving_percent": round(saving, 2),
            "hpa": hpa_document(spec, final),
            "utilization_notes": utilization_notes(spec, final, requests),
        }
    targets_only = None
    if o.targets_only is not None and o.targets_only_score is not None:
        targets_only = {
            "configuration": configuration(o.targets_only.model),
            **figures(ctx, o.targets_only_score),
        }
    model = f.model
    return {
        "hpa": {
            "namespace": spec.namespace,
            "name": spec.name,
            "target": f"{spec.target_kind}/{spec.target_name}",
        },
        "kubernetes": hpa.KUBERNETES_RELEASE,
        "start": format_time(float(ctx.times[0])),
        "end": format_time(float(ctx.times[-1])),
        "step_seconds": model.step,
        "held_out_days": [_day_label(ctx, int(k)) for k in np.flatnonzero(ctx.days.held_out)],
        "bound": {
            "signal": ctx.bound.signal,
            "op": "<=" if ctx.bound.upper else ">=",
            "value": ctx.bound.value,
            "budget_share": ctx.bound.budget,
        },
        "model": {
            "capacity_per_replica": round(model.capacity, 4) if model.capacity is not None else None,
            "startup_seconds": round(model.startup, 1),
            "startup_measured_from": f.startup_events,
            "demand_lower_bound_share": round(f.censored_share, 5),
            "curves": [_curve(c) for c in f.curves],
            "bridged_steps": ctx.bridged,
            "notes": list(model.notes),
        },
        "replay_error": error,
        "recorded": figures(ctx, recorded_score(ctx)),
        "current": current,
        "recommended": recommended,
        "targets_only": targets_only,
        "candidates": o.candidates,
        "warnings": list(warnings),
    }


def _curve(c: Curve) -> dict[str, Any]:
    return {"name": c.name, "model": c.kind, "points": c.points, "median_error": round(c.error, 4)}


def text(doc: Mapping[str, Any], *, wide: bool = False) -> str:
    """The table recommend-hpa prints (the same figures as the document)."""
    h, m, err = doc["hpa"], doc["model"], doc["replay_error"]
    b = doc["bound"]
    out = [
        f"recommend-hpa {h['namespace']}/{h['name']} → {h['target']}: {doc['start'][:16].replace('T', ' ')} → "
        f"{doc['end'][:16].replace('T', ' ')} UTC at {doc['step_seconds']:g}s steps (decision as Kubernetes {doc['kubernetes']}); "
        f"held out: {', '.join(doc['held_out_days'])}",
        f"  bound: {b['signal']} {b['op']} {b['value']:g}, broken at most {b['budget_share'] * 100:g} % of each day",
        "  demand: served + rejected requests + queue growth, over Ready pods; "
        f"{m['demand_lower_bound_share'] * 100:.1f} % of steps are lower bounds (saturated or at maxReplicas)",
        "  model: "
        + (
            f"capacity {m['capacity_per_replica']:g} requests/s per replica"
            if m["capacity_per_replica"] is not None
            else "capacity never reached in history (no backlog modelled)"
        )
        + f"; start-up {m['startup_seconds']:g}s"
        + (f" (median of {m['startup_measured_from']} scale-ups)" if m["startup_measured_from"] else ""),
    ]
    out += [
        f"    {c['name']}: {c['model']}, {c['points']} steps, median error {c['median_error'] * 100:.1f} %"
        for c in m["curves"]
    ]
    out += [f"  note: {n}" for n in m["notes"]]
    trust = "" if err["trusted"] else " — too large: the recommendation cannot be trusted"
    out.append(
        f"  model error, training days (current configuration replayed vs recorded): replica-hours "
        f"{err['replica_hours_percent']:+.1f} %, bound broken {err['broken_share_predicted'] * 100:.2f} % predicted vs "
        f"{err['broken_share_recorded'] * 100:.2f} % recorded{trust}"
    )
    out.append("")
    runs = [("recorded", doc["recorded"]), ("current (replayed)", doc["current"])]
    if doc["recommended"]:
        runs.append(("recommended", doc["recommended"]))
    if doc["targets_only"]:
        runs.append(("targets only", doc["targets_only"]))
    columns = [Column(""), *(Column(name, right=True) for name, _ in runs)]
    body = [
        ["held-out GPU-hours"] + [f"{r['held_out']['gpu_hours']:.1f}" for _, r in runs],
        ["held-out bound broken, worst day"]
        + [f"{r['held_out']['bound_broken_share_worst_day'] * 100:.2f} %" for _, r in runs],
        ["bound held on every held-out day"]
        + ["yes" if r["held_out"]["bound_held"] else "no" for _, r in runs],
        ["training GPU-hours"] + [f"{r['training']['gpu_hours']:.1f}" for _, r in runs],
        ["training bound broken, worst day"]
        + [f"{r['training']['bound_broken_share_worst_day'] * 100:.2f} %" for _, r in runs],
        ["scale events (up/down)"] + [f"{r['scale_ups']}/{r['scale_downs']}" for _, r in runs],
    ]
    out.append("\n".join(f"  {line}".rstrip() for line in render(columns, body, wide=wide).splitlines()))
    out.append("")
    rec = doc["recommended"]
    if rec:
        held = rec["held_out"]
        days = ", ".join(f"{day} {minutes:g} min" for day, minutes in held["bound_broken_minutes"].items())
        out.append(
            f"  recommended: {rec['saving_percent']:.1f} % fewer GPU-hours than the current configuration on the "
            f"held-out days; the bound held on every held-out day (broken: {days})"
        )
        if rec["dropped_metrics"]:
            out.append(f"  left out: {', '.join(rec['dropped_metrics'])} (it never set the replica count)")
        out += [f"  note: {n}" for n in rec["utilization_notes"]]
        out.append("")
        out.append(yaml.safe_dump(rec["hpa"], sort_keys=False).rstrip())
    for w in doc["warnings"]:
        out.append(f"  warning: {w}")
    return "\n".join(out)
