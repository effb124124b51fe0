"""The configurations recommend-hpa tries, in stages (each a few dozen to a few hundred candidates):

1. **targets**: for each load per replica of a ladder (a share of the measured capacity, or of the
   highest load fitted when history never saturated), the targets the fitted curves give there:
   one metric at that level with the others out of its way, and all metrics at that level;
   each with the HPA's own behaviour and with a responsive one;
2. **behaviour**: the cheapest target sets, and the cheapest nudged by 3 % either way, × scale-up
   and scale-down stabilisation windows × scale-down policies × ``minReplicas`` (as written, one less);
3. with stage 2, **bounds and tolerance** where they can matter: ``maxReplicas`` raised when the
   best target set reaches it, and (where the cluster has per-HPA tolerance, ``--may-change
   tolerance``) smaller tolerances.

Only what ``--may-change`` allows is varied. A metric set "out of the way" gets a target its curve
reaches only far beyond any load seen; the recommendation then leaves that metric out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from adapter.hpa.recommend.model import ServiceModel
from hpa_controller import decide as hpa

CHANGES = ("targets", "behavior", "minReplicas", "maxReplicas", "tolerance")
DEFAULT_CHANGES = ("targets", "behavior", "minReplicas", "maxReplicas")
LEVELS = (0.55, 0.6, 0.65, 0.7, 0.74, 0.78, 0.82, 0.85, 0.88, 0.91, 0.94, 0.97)
"""Load per replica as a share of capacity (or of the highest load fitted)."""
OUT_OF_WAY = 50.0
"""A metric out of the way: its curve's value at this many times the highest load fitted."""


@dataclass(frozen=True)
class Candidate:
    label: str
    model: hpa.HpaModel
    dropped: tuple[str, ...] = ()
    """Metrics set out of the way (the recommendation leaves them out)."""


def nice(value: float) -> float:
    """Two significant digits (three above 100): targets people write."""
    if value <= 0 or not math.isfinite(value):
        return value
    digits = 3 if value >= 100 else 2
    return float(f"{value:.{digits}g}")


def reference_load(model: ServiceModel) -> float:
    return model.capacity if model.capacity is not None else model.x_fitted


def target_sets(
    model: ServiceModel, current: hpa.HpaModel
) -> list[tuple[str, tuple[float, ...], tuple[str, ...]]]:
    """(label, targets per metric, metrics out of the way) for each level of :data:`LEVELS`."""
    ref = reference_load(model)
    per_pod = [k for k, m in enumerate(model.metrics) if m.curve is not None]
    out: list[tuple[str, tuple[float, ...], tuple[str, ...]]] = []
    seen: set[tuple[float, ...]] = set()

    def value(k: int, x: float) -> float:
        m = model.metrics[k]
        if m.curve is None:
            return current.metrics[k].target
        v = float(m.curve(np.array([x]))[0])
        if current.metrics[k].target_type == "Utilization":
            return float(max(1, round(v / m.request * 100))) if m.request > 0 else current.metrics[k].target
        return nice(v)

    far = OUT_OF_WAY * model.x_fitted
    for level in LEVELS:
        x = level * ref
        variants: list[tuple[str, list[int]]] = [("all", per_pod)]
        if len(per_pod) > 1:
            variants += [(model.metrics[k].spec.name, [k]) for k in per_pod]
        for what, driving in variants:
            targets = []
            dropped = []
            for k in range(len(model.metrics)):
                if k in driving or model.metrics[k].curve is None:
                    targets.append(value(k, x))
                else:
                    targets.append(max(value(k, far), current.metrics[k].target * 10))
                    dropped.append(model.metrics[k].spec.name)
            key = tuple(targets)
            if key in seen or any(t <= 0 for t in targets):
                continue
            seen.add(key)
            out.append((f"{what} at {level:.0%} load", key, tuple(dropped)))
    return out


def with_targets(m: hpa.HpaModel, targets: Sequence[float]) -> hpa.HpaModel:
    return replace(m, metrics=tuple(replace(s, target=t) for s, t in zip(m.metrics, targets, strict=True)))


RESPONSIVE = hpa.Behavior(hpa.scale_up_rules(), hpa.scale_down_rules(stabilization_seconds=300))
UP_WINDOWS = (0, 60)
DOWN_WINDOWS = (60, 300, 600)
DOWN_POLICIES: tuple[tuple[str, tuple[hpa.Policy, ...] | None], ...] = (
    ("100%/15s", None),
    ("1 pod/60s", (hpa.Policy("Pods", 1, 60),)),
    ("20%/60s", (hpa.Policy("Percent", 20, 60),)),
)


def stage_targets(model: ServiceModel, current: hpa.HpaModel, changes: Iterable[str]) -> list[Candidate]:
    changes = set(changes)
    sets: list[tuple[str, tuple[float, ...], tuple[str, ...]]]
    if "targets" not in changes:
        sets = [("as written", tuple(s.target for s in current.metrics), ())]
    else:
        sets = target_sets(model, current)
    behaviours: list[tuple[str, hpa.Behavior | None]] = [("own behaviour", current.behavior)]
    if "behavior" in changes:
        behaviours.append(("responsive", RESPONSIVE))
    out = []
    for label, targets, dropped in sets:
        for blabel, behaviour in behaviours:
            out.append(
                Candidate(
                    f"{label}, {blabel}", replace(with_targets(current, targets), behavior=behaviour), dropped
                )
            )
    return out


def stage_behaviour(
    best: Sequence[Candidate], current: hpa.HpaModel, changes: Iterable[str]
) -> list[Candidate]:
    changes = set(changes)
    behaviours: list[tuple[str, hpa.Behavior | None]] = []
    if "behavior" in changes:
        for up in UP_WINDOWS:
            for down in DOWN_WINDOWS:
                for plabel, policies in DOWN_POLICIES:
                    behaviours.append(
                        (
                            f"up {up}s, down {down}s {plabel}",
                            hpa.Behavior(
                                hpa.scale_up_rules(stabilization_seconds=up),
                                hpa.scale_down_rules(stabilization_seconds=down, policies=policies),
                            ),
                        )
                    )
    mins = [current.min_replicas]
    if "minReplicas" in changes and current.min_replicas > 1:
        mins.append(current.min_replicas - 1)
    out = []
    for cand in best:
        for blabel, behaviour in behaviours or [("", cand.model.behavior)]:
            for lo in mins:
                m = replace(cand.model, behavior=behaviour, min_replicas=lo)
                label = ", ".join(
                    p
                    for p in (
                        cand.label.split(",")[0],
                        blabel,
                        f"min {lo}" if lo != current.min_replicas else "",
                    )
                    if p
                )
                out.append(Candidate(label, m, cand.dropped))
    return out


def stage_bounds(
    best: Sequence[Candidate], current: hpa.HpaModel, changes: Iterable[str], *, at_max: bool
) -> list[Candidate]:
    changes = set(changes)
    maxes = [current.max_replicas]
    if "maxReplicas" in changes and at_max:
        maxes.append(max(current.max_replicas + 1, math.ceil(current.max_replicas * 1.5)))
    tolerances: list[float | None] = [None]
    if "tolerance" in changes:
        tolerances += [0.05, 0.02]
    out = []
    for cand in best:
        for hi in maxes:
            for tol in tolerances:
                if hi == cand.model.max_replicas and tol is None:
                    continue
                m = replace(cand.model, max_replicas=max(hi, cand.model.min_replicas))
                label = cand.label + (f", max {hi}" if hi != cand.model.max_replicas else "")
                if tol is not None:
                    m = _with_tolerance(m, tol)
                    label += f", tolerance {tol:g}"
                out.append(Candidate(label, m, cand.dropped))
    return out


def _with_tolerance(m: hpa.HpaModel, tol: float) -> hpa.HpaModel:
    behaviour = m.behavior or hpa.Behavior(hpa.scale_up_rules(), hpa.scale_down_rules())
    return replace(
        m,
        behavior=hpa.Behavior(
            replace(behaviour.scale_up, tolerance=tol), replace(behaviour.scale_down, tolerance=tol)
        ),
    )


def nudged(best: Candidate, changes: Iterable[str]) -> list[Candidate]:
    """The best target set's targets 3 % lower and higher."""
    if "targets" not in set(changes):
        return []
    out = []
    for factor in (0.97, 1.03):
        targets = [
            s.target
            if s.name in best.dropped
            else (
                float(max(1, round(s.target * factor)))
                if s.target_type == "Utilization"
                else nice(s.target * factor)
            )
            for s in best.model.metrics
        ]
        out.append(Candidate(f"{best.label} ×{factor:g}", with_targets(best.model, targets), best.dropped))
    return out
