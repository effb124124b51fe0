"""``replay-hpa``: the decision function (:func:`hpa_controller.decide.decide`) run over a past time range, with
the HPA as written or with other targets, and what it would have cost.

The replay is one loop (:func:`replay`), shared with ``recommend-hpa``: every step, the pods that are
Ready (created at least ``startup`` seconds before) get values from a **load model**, the controller
decides, and pods are created (ready after ``startup``) or removed (the newest first, as the
ReplicaSet controller removes unready pods before ready ones). Pods not yet Ready publish no value:
the controller counts them as it counts pods without a metric.

``replay-hpa``'s load model (:class:`Proportional`), when the replayed replica count differs from the
recorded one: a Pods or Resource metric is taken as a per-pod average of a total load, so each
replayed pod sees ``mean(recorded per-pod values) × recorded replicas ÷ replayed replicas``; Object
and External values are totals and stay as recorded (AverageValue targets divide them by the
replayed count). Limits: new pods are ready at once (no start-up or image pull time), load splits
evenly, and metrics that do not scale inversely with replicas (latency, queue time, utilisation
capped at 100 %) are only approximated; a replay shows the controller's arithmetic on the recorded
demand, not a simulation of the application. ``recommend-hpa`` replaces it with a model of demand and
per-replica capacity fitted from the history (:mod:`adapter.hpa.recommend`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Protocol

from adapter.hpa.spec import HpaSpec
from adapter.hpa.timeline import Timeline, scale_events
from gpupilot_common.table import Column, render
from gpupilot_common.timefmt import format_time
from hpa_controller import decide as hpa
from hpa_controller.calc import PodState


@dataclass
class ReplayStep:
    at: float
    recorded: int | None
    replicas: int
    recommended: int
    above_target: bool
    """Some metric's replayed per-pod value (or total) was above target + tolerance after scaling."""
    ready: int = 0
    """Pods Ready during the step (the others were starting)."""
    broken: float = 0.0
    """Share of the step the load model expects a service bound broken (recommend-hpa), 0-1."""


@dataclass
class ReplayResult:
    label: str
    steps: list[ReplayStep] = field(default_factory=list)

    def summary(self, *, max_replicas: int, step: float, gpus_per_pod: float) -> dict[str, float]:
        n = len(self.steps)
        if not n:
            return {
                "scale_ups": 0,
                "scale_downs": 0,
                "at_max": 0.0,
                "mean": 0.0,
                "gpu_hours": 0.0,
                "above": 0.0,
            }
        ups = sum(1 for a, b in zip(self.steps, self.steps[1:], strict=False) if b.replicas > a.replicas)
        downs = sum(1 for a, b in zip(self.steps, self.steps[1:], strict=False) if b.replicas < a.replicas)
        mean = sum(s.replicas for s in self.steps) / n
        return {
            "scale_ups": ups,
            "scale_downs": downs,
            "at_max": sum(1 for s in self.steps if s.replicas >= max_replicas) / n,
            "mean": mean,
            "gpu_hours": sum(s.replicas for s in self.steps) * step / 3600 * gpus_per_pod,
            "above": sum(1 for s in self.steps if s.above_target) / n,
        }


def with_targets(model: hpa.HpaModel, targets: Mapping[str, float]) -> hpa.HpaModel:
    """``model`` with the named metrics' targets replaced (``--set NAME=TARGET``)."""
    metrics = tuple(replace(m, target=targets[m.name]) if m.name in targets else m for m in model.metrics)
    return replace(model, metrics=metrics)


def rescale(
    obs: hpa.Observation, *, recorded: int | None, replicas: int
) -> tuple[hpa.Observation, float | None]:
    """The observation as ``replicas`` pods would see it (see the module's load model), and the
    per-pod mean used (None for totals)."""
    if obs.error or obs.per_pod is None:
        return obs, None
    if not obs.per_pod:
        return replace(obs, error="no values"), None
    mean = sum(obs.per_pod.values()) / len(obs.per_pod)
    base = recorded if recorded else len(obs.per_pod)
    scaled = mean * base / replicas if replicas else mean
    names = _names(replicas)
    return hpa.Observation(dict.fromkeys(names, scaled), (), "", obs.timestamp, obs.window_seconds), scaled


_NAMES: dict[int, tuple[str, ...]] = {}


def _names(replicas: int) -> tuple[str, ...]:
    """Replayed pod names, built once per count (a replay asks for the same few counts ~40,000 times)."""
    names = _NAMES.get(replicas)
    if names is None:
        names = _NAMES[replicas] = tuple(f"replay-{i}" for i in range(replicas))
    return names


class LoadModel(Protocol):
    """What the replayed pods publish: called once per step, in order (a model may keep state)."""

    def observe(
        self, i: int, *, replicas: int, ready: Sequence[str]
    ) -> tuple[list[hpa.Observation], bool, float]:
        """Step ``i`` with ``replicas`` pods of which ``ready`` (names) are Ready: one observation per
        metric of the model, whether a metric is above its target, and the share of the step a
        service bound is broken (0 when the model has none)."""
        ...


class Proportional:
    """``replay-hpa``'s load model: the recorded per-pod mean × recorded replicas ÷ Ready replicas."""

    def __init__(self, model: hpa.HpaModel, timeline: Timeline, requests: Mapping[str, int] | None) -> None:
        self.model, self.timeline, self.requests = model, timeline, requests
        self.tol_up = model.tolerances().up

    def observe(
        self, i: int, *, replicas: int, ready: Sequence[str]
    ) -> tuple[list[hpa.Observation], bool, float]:
        recorded = self.timeline.recorded[i]
        scaled = [rescale(o, recorded=recorded, replicas=len(ready)) for o in self.timeline.observations[i]]
        observations = [_named(o, ready) for o, _ in scaled]
        above = _above(
            self.model,
            [o for o, _ in scaled],
            [m for _, m in scaled],
            replicas=replicas,
            tol_up=self.tol_up,
            requests=self.requests,
        )
        return observations, above, 0.0


def _named(obs: hpa.Observation, ready: Sequence[str]) -> hpa.Observation:
    """A rescaled per-pod observation carries the first Ready pods' names: give it the Ready pods'."""
    if obs.per_pod is None or obs.error:
        return obs
    value = next(iter(obs.per_pod.values()), 0.0)
    return replace(obs, per_pod=dict.fromkeys(ready, value))


def replay(
    model: hpa.HpaModel,
    timeline: Timeline,
    *,
    label: str,
    requests: Mapping[str, int] | None = None,
    startup: float = 0.0,
    load: LoadModel | None = None,
) -> ReplayResult:
    """Run the controller every step from the first recorded size, as it is: recorded replicas
    outside [min, max] (a what-if with other bounds) are clamped by the first step's decision, which
    records that scale event as the controller does (``reconcileAutoscaler`` → ``storeScaleEvent``),
    so it limits the next policy period. ``requests`` (milli-units per resource) gives replayed pods
    a request for Resource Utilization targets. ``startup``: seconds from a pod's creation to Ready
    (the pods of the first step are Ready). ``load``: what the pods publish (default
    :class:`Proportional`)."""
    result = ReplayResult(label)
    load = load or Proportional(model, timeline, requests)
    first = next((r for r in timeline.recorded if r is not None), model.min_replicas)
    start = timeline.times[0] if timeline.times else 0.0
    created = [start - startup] * first
    """Creation time of each replayed pod, oldest first: pod k is named ``replay-k``."""
    history = hpa.History(started=False)
    for i, (at, recorded) in enumerate(zip(timeline.times, timeline.recorded, strict=False)):
        names = _names(len(created))
        ready = sum(1 for c in created if at - c >= startup - 1e-6)  # oldest first: a prefix is Ready
        observations, above, broken = load.observe(i, replicas=len(created), ready=names[:ready])
        pods = [
            PodState(name, ready=k < ready, requests=dict(requests or {})) for k, name in enumerate(names)
        ]
        decision = hpa.decide(
            model,
            spec_replicas=len(created),
            pods=pods,
            observations=observations,
            history=history,
            now=at,
        )
        result.steps.append(
            ReplayStep(at, recorded, decision.final, decision.recommended, above, ready=ready, broken=broken)
        )
        history = decision.history
        if decision.final > len(created):
            created += [at] * (decision.final - len(created))
        else:  # the newest first: unready pods, then the most recently ready
            del created[decision.final :]
    return result


def _above(
    model: hpa.HpaModel,
    observations: Sequence[hpa.Observation],
    means: Sequence[float | None],
    *,
    replicas: int,
    tol_up: float,
    requests: Mapping[str, int] | None,
) -> bool:
    for spec, obs, mean in zip(model.metrics, observations, means, strict=False):
        if obs.error:
            continue
        if mean is not None:
            value = mean
            if spec.target_type == "Utilization":
                request = (requests or {}).get(spec.name, 0) / 1000
                if not request:
                    continue
                value = mean / request * 100
        elif obs.values:
            total = obs.values[0] if spec.kind == "Object" else sum(obs.values)
            value = total / replicas if spec.target_type == "AverageValue" and replicas else total
        else:
            continue
        if value > spec.target * (1 + tol_up):
            return True
    return False


def slices(results: Sequence[ReplayResult], *, rows: int = 24) -> list[dict[str, object]]:
    """Replicas over time in at most ``rows`` slices of the range: the recorded mean and each
    replay's mean and max (what the table shows, as data)."""
    if not results or not results[0].steps:
        return []
    steps = results[0].steps
    per = max(1, math.ceil(len(steps) / rows))
    out: list[dict[str, object]] = []
    for i in range(0, len(steps), per):
        chunk = slice(i, i + per)
        rec = [s.recorded for s in steps[chunk] if s.recorded is not None]
        runs = []
        for r in results:
            part = [s.replicas for s in r.steps[chunk]]
            runs.append({"label": r.label, "mean": round(sum(part) / len(part), 3), "max": max(part)})
        out.append(
            {
                "from": format_time(steps[i].at),
                "recorded_mean": round(sum(rec) / len(rec), 3) if rec else None,
                "runs": runs,
            }
        )
    return out


def table(results: Sequence[ReplayResult], *, rows: int = 24, wide: bool = False) -> str:
    """Replicas over time, one row per slice of the range: recorded mean and each replay's mean/max."""
    parts = slices(results, rows=rows)
    if not parts:
        return "  (no steps)"
    columns = [Column("FROM (UTC)"), Column("RECORDED", right=True)]
    columns += [Column(f"{r.label} mean/max", right=True) for r in results]
    body = []
    for part in parts:
        rec = part["recorded_mean"]
        cells = [str(part["from"]).replace("T", " ")[:16], f"{rec:.1f}" if isinstance(rec, float) else "-"]
        cells += [f"{run['mean']:.1f} / {run['max']}" for run in part["runs"]]  # type: ignore[attr-defined]
        body.append(cells)
    return _indented(render(columns, body, wide=wide))


def _indented(text: str) -> str:
    return "\n".join(f"  {line}".rstrip() for line in text.splitlines())


def recorded_history(
    model: hpa.HpaModel, timeline: Timeline, *, pods: Sequence[PodState], now: float
) -> tuple[hpa.History, int]:
    """The controller's memory at ``now`` rebuilt from the timeline: the recommendation it would have
    made at each step (with the recorded replica count as current) and the recorded scale events.
    Returns the history and how many recommendations it holds."""
    recs: list[hpa.Recommendation] = []
    history = hpa.History(started=True)
    for at, recorded, observations in zip(
        timeline.times, timeline.recorded, timeline.observations, strict=False
    ):
        if recorded is None or at >= now:
            continue
        d = hpa.decide(
            model, spec_replicas=recorded, pods=pods, observations=observations, history=history, now=at
        )
        if not d.failed and d.outcomes:
            recs.append(hpa.Recommendation(at, d.recommended))
    up, down = scale_events(timeline.times, timeline.recorded)
    return hpa.History(tuple(recs), tuple(up), tuple(down), started=True), len(recs)


def history_window(model: hpa.HpaModel) -> int:
    """Seconds of the past the controller's decision at one moment depends on."""
    if model.behavior is None:
        return hpa.DOWNSCALE_STABILISATION
    rules = (model.behavior.scale_up, model.behavior.scale_down)
    periods = [p.period_seconds for r in rules for p in r.policies]
    return max([r.stabilization_seconds for r in rules] + periods + [15])


def _recorded_summary(line: Timeline, *, step: float, gpus_per_pod: float) -> dict[str, float | None]:
    recorded = [r for r in line.recorded if r is not None]
    return {
        "scale_ups": sum(1 for a, b in itertools.pairwise(recorded) if b > a),
        "scale_downs": sum(1 for a, b in itertools.pairwise(recorded) if b < a),
        "mean": sum(recorded) / len(recorded) if recorded else None,
        "gpu_hours": sum(recorded) * step / 3600 * gpus_per_pod,
    }


def report(
    spec: HpaSpec,
    line: Timeline,
    runs: Sequence[ReplayResult],
    *,
    step: float,
    gpus_per_pod: float,
    rows: int,
    origin: str,
    wide: bool = False,
) -> str:
    """The text report: where the data came from, the load model, replicas over time, the summary."""
    if not line.times:
        return "  (no steps)"
    start = datetime.fromtimestamp(line.times[0], UTC).strftime("%Y-%m-%d %H:%M")
    end = datetime.fromtimestamp(line.times[-1], UTC).strftime("%Y-%m-%d %H:%M")
    out = [
        f"replay-hpa {spec.namespace}/{spec.name} → {spec.target_kind}/{spec.target_name}: {start} → {end} UTC, "
        f"{len(line.times)} steps of {step:g}s (decision as Kubernetes {hpa.KUBERNETES_RELEASE})",
        f"  pods: {len(line.pods)} matched the selector ({origin}) in the range; recorded replicas from "
        f"{line.recorded_from}",
        "  load model: per-pod metrics = recorded per-pod mean × recorded replicas ÷ replayed replicas;",
        "  Object/External values as recorded; new pods ready at once (see docs/adapter.md for the limits)",
        "",
        table(runs, rows=rows, wide=wide),
        "",
    ]
    summaries = [
        r.summary(max_replicas=spec.max_replicas, step=step, gpus_per_pod=gpus_per_pod) for r in runs
    ]
    rec = _recorded_summary(line, step=step, gpus_per_pod=gpus_per_pod)
    columns = [Column(""), Column("recorded", right=True), *(Column(r.label, right=True) for r in runs)]
    rec_mean = rec["mean"]
    body = [
        ["scale events (up/down)", f"{rec['scale_ups']:.0f}/{rec['scale_downs']:.0f}"]
        + [f"{s['scale_ups']:.0f}/{s['scale_downs']:.0f}" for s in summaries],
        ["mean replicas", f"{rec_mean:.2f}" if rec_mean is not None else "-"]
        + [f"{s['mean']:.2f}" for s in summaries],
        ["GPU-hours", f"{rec['gpu_hours']:.1f}"] + [f"{s['gpu_hours']:.1f}" for s in summaries],
        ["time at maxReplicas", "-"] + [f"{s['at_max'] * 100:.1f} %" for s in summaries],
        ["time above target", "-"] + [f"{s['above'] * 100:.1f} %" for s in summaries],
    ]
    out.append(_indented(render(columns, body, wide=wide)))
    return "\n".join(out)


def document(
    spec: HpaSpec,
    line: Timeline,
    runs: Sequence[ReplayResult],
    *,
    step: float,
    gpus_per_pod: float,
    rows: int,
    targets: Mapping[str, float],
) -> dict[str, object]:
    """What ``-o json``/``-o yaml`` print (schema: :data:`adapter.commands.replay_hpa.OUTPUT_SCHEMA`)."""
    rec = _recorded_summary(line, step=step, gpus_per_pod=gpus_per_pod)
    return {
        "hpa": {
            "namespace": spec.namespace,
            "name": spec.name,
            "target": f"{spec.target_kind}/{spec.target_name}",
        },
        "kubernetes": hpa.KUBERNETES_RELEASE,
        "start": format_time(line.times[0]) if line.times else None,
        "end": format_time(line.times[-1]) if line.times else None,
        "step_seconds": step,
        "steps": len(line.times),
        "pods": len(line.pods),
        "recorded_from": line.recorded_from,
        "recorded": {
            "scale_ups": rec["scale_ups"],
            "scale_downs": rec["scale_downs"],
            "mean_replicas": rec["mean"],
            "gpu_hours": rec["gpu_hours"],
        },
        "runs": [
            {
                "label": r.label,
                "targets": dict(targets) if i else {},
                "scale_ups": s["scale_ups"],
                "scale_downs": s["scale_downs"],
                "mean_replicas": s["mean"],
                "gpu_hours": s["gpu_hours"],
                "time_at_max": s["at_max"],
                "time_above_target": s["above"],
                "first_replicas": r.steps[0].replicas if r.steps else None,
            }
            for i, (r, s) in enumerate(
                zip(
                    runs,
                    [
                        r.summary(max_replicas=spec.max_replicas, step=step, gpus_per_pod=gpus_per_pod)
                        for r in runs
                    ],
                    strict=True,
                )
            )
        ],
        "slices": slices(runs, rows=rows),
    }
