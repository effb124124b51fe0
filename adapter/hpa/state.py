"""``explain-hpa --state FILE``: pods, metric values, replicas and history given offline.

::

    now: "2026-11-30T12:00:00Z"      # optional (default: the current time); RFC 3339 or Unix seconds
    currentReplicas: 3               # the scale's spec.replicas (default: pods not being deleted)
    statusReplicas: 3                # optional: status.replicas (AverageValue targets divide by it)
    pods:
      - name: llm-0                  # required
        phase: Running               # Running (default), Pending, Succeeded, Failed
        ready: true                  # the Ready condition (default true)
        startTime: "2026-11-30T10:00:00Z"   # optional; CPU metrics use it for the initialisation period
        readySince: "2026-11-30T10:01:00Z"  # optional: the Ready condition's lastTransitionTime
        deleting: false              # metadata.deletionTimestamp set
        requests: {cpu: "4", memory: 32Gi}  # for Resource Utilization targets
    metrics:                         # keyed by the metric name in the HPA (cpu / memory for Resource)
      DCGM_FI_DEV_GPU_UTIL: {llm-0: 90, llm-1: 80}   # Pods / Resource: a value per pod
      queue_total: 45                # Object: one value
      fleet_waste: [1.5, 0.5]        # External: the values of every matching series (summed)
      broken_metric: {error: "no series"}            # a metric that failed to evaluate
    history:                         # optional: the controller's memory for this HPA
      recommendations:               # [{at: TIME | ago: DURATION, replicas: N}]
        - {ago: 2m, replicas: 5}
      scaleUpEvents: [{ago: 60s, change: 2}]
      scaleDownEvents: []
      new: false                     # true: a new HPA (the controller starts from currentReplicas)
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from adapter.errors import ConfigError
from adapter.hpa.spec import HpaSpec
from adapter.quantity import parse_quantity, to_milli
from gpupilot_common import timefmt, yamlsafe
from hpa_controller import decide as hpa
from hpa_controller.calc import PodState

_TOP = {"now", "currentReplicas", "statusReplicas", "pods", "metrics", "history"}
_POD = {"name", "phase", "ready", "startTime", "readySince", "deleting", "requests"}
_PHASES = {"Running", "Pending", "Succeeded", "Failed", "Unknown"}


@dataclass(frozen=True)
class State:
    now: float
    current: int
    status: int
    pods: tuple[PodState, ...]
    observations: tuple[hpa.Observation, ...]
    history: hpa.History
    history_given: bool


def parse_duration(text: object, where: str, *, allow_zero: bool = True) -> float:
    """A duration in Prometheus' grammar (``90s``, ``5m``, ``7d``; :mod:`gpupilot_common.timefmt`)."""
    try:
        return timefmt.parse_duration(text, allow_zero=allow_zero)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def parse_time(text: object, where: str, *, now: float | None = None) -> float:
    """RFC 3339 (no zone means UTC), Unix seconds, ``now`` or ``now-7d``."""
    try:
        return timefmt.parse_time(text, now=time.time() if now is None else now)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_state(path: Path, spec: HpaSpec, *, now: float | None = None) -> State:
    try:
        doc = yamlsafe.safe_load(yamlsafe.read_text(path))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{path}: must be a mapping with pods, metrics and currentReplicas")
    extra = sorted(set(doc) - _TOP)
    if extra:
        raise ConfigError(f"{path}: {extra[0]}: unknown field (allowed: {', '.join(sorted(_TOP))})")
    at = parse_time(doc["now"], f"{path}: now") if "now" in doc else (now if now is not None else time.time())
    pods = tuple(_pod(p, f"{path}: pods[{i}]") for i, p in enumerate(_list(doc.get("pods"), f"{path}: pods")))
    names = [p.name for p in pods]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: pods: a pod name appears twice")
    current = _count(
        doc.get("currentReplicas", sum(1 for p in pods if not p.deleting)), f"{path}: currentReplicas"
    )
    status = _count(doc.get("statusReplicas", current), f"{path}: statusReplicas")
    metrics = doc.get("metrics") or {}
    if not isinstance(metrics, Mapping):
        raise ConfigError(f"{path}: metrics must map metric names to values")
    observations = tuple(_observation(metrics, s.spec, f"{path}: metrics") for s in spec.sources)
    raw_history = doc.get("history")
    history = _history(raw_history, f"{path}: history", at)
    return State(at, current, status, pods, observations, history, raw_history is not None)


def _list(raw: object, where: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: must be a list")
    return raw


def _count(raw: object, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not 0 <= raw <= 2**31 - 1:
        raise ConfigError(f"{where}: must be a whole number of replicas, got {raw!r}")
    return raw


def _pod(raw: object, where: str) -> PodState:
    if not isinstance(raw, Mapping) or not raw.get("name"):
        raise ConfigError(f"{where}: must be a mapping with at least name")
    extra = sorted(set(raw) - _POD)
    if extra:
        raise ConfigError(f"{where}.{extra[0]}: unknown field (allowed: {', '.join(sorted(_POD))})")
    phase = str(raw.get("phase", "Running"))
    if phase not in _PHASES:
        raise ConfigError(f"{where}.phase: {phase!r} is not one of {', '.join(sorted(_PHASES))}")
    for key in ("ready", "deleting"):
        if key in raw and not isinstance(raw[key], bool):
            raise ConfigError(f"{where}.{key}: must be true or false")
    requests = raw.get("requests") or {}
    if not isinstance(requests, Mapping):
        raise ConfigError(f"{where}.requests: must map resources to quantities")
    milli: dict[str, int] = {}
    for res, qty in requests.items():
        try:
            milli[str(res)] = to_milli(parse_quantity(qty))
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{where}.requests.{res}: {qty!r} is not a quantity") from exc
    return PodState(
        name=str(raw["name"]),
        phase=phase,
        ready=bool(raw.get("ready", True)),
        deleting=bool(raw.get("deleting", False)),
        start_time=parse_time(raw["startTime"], f"{where}.startTime") if "startTime" in raw else None,
        ready_transition=parse_time(raw["readySince"], f"{where}.readySince")
        if "readySince" in raw
        else None,
        requests=milli,
    )


def _value(raw: object, where: str) -> float:
    try:
        value = parse_quantity(raw)  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {raw!r} is not a number") from exc
    if not math.isfinite(value):
        raise ConfigError(f"{where}: {raw!r} is not finite")
    return value


def _observation(metrics: Mapping[str, Any], spec: hpa.MetricSpec, where: str) -> hpa.Observation:
    if spec.name not in metrics:
        return hpa.Observation(error=f"no value for {spec.name} in the state file")
    raw = metrics[spec.name]
    w = f"{where}.{spec.name}"
    if isinstance(raw, Mapping) and "error" in raw:
        return hpa.Observation(error=str(raw["error"]))
    if spec.kind in ("Pods", "Resource", "ContainerResource"):
        if not isinstance(raw, Mapping):
            raise ConfigError(f"{w}: a {spec.kind} metric needs a value per pod ({{pod-name: value}})")
        return hpa.Observation(per_pod={str(k): _value(v, f"{w}.{k}") for k, v in raw.items()})
    if spec.kind == "Object":
        if isinstance(raw, list | Mapping):
            raise ConfigError(f"{w}: an Object metric takes one value")
        return hpa.Observation(values=(_value(raw, w),))
    items = raw if isinstance(raw, list) else [raw]
    return hpa.Observation(values=tuple(_value(v, f"{w}[{i}]") for i, v in enumerate(items)))


def _when(raw: Mapping[str, Any], where: str, now: float) -> float:
    if "at" in raw:
        return parse_time(raw["at"], f"{where}.at")
    if "ago" in raw:
        return now - parse_duration(raw["ago"], f"{where}.ago")
    raise ConfigError(f"{where}: needs at (a time) or ago (a duration)")


def _history(raw: object, where: str, now: float) -> hpa.History:
    if raw is None:
        return hpa.History(started=True)
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping")
    recs = []
    for i, r in enumerate(_list(raw.get("recommendations"), f"{where}.recommendations")):
        rw = f"{where}.recommendations[{i}]"
        if not isinstance(r, Mapping):
            raise ConfigError(f"{rw}: must be a mapping with replicas and at/ago")
        recs.append(hpa.Recommendation(_when(r, rw, now), _count(r.get("replicas"), f"{rw}.replicas")))
    events: dict[str, list[hpa.ScaleEvent]] = {}
    for key in ("scaleUpEvents", "scaleDownEvents"):
        events[key] = []
        for i, e in enumerate(_list(raw.get(key), f"{where}.{key}")):
            ew = f"{where}.{key}[{i}]"
            if not isinstance(e, Mapping):
                raise ConfigError(f"{ew}: must be a mapping with change and at/ago")
            events[key].append(hpa.ScaleEvent(_when(e, ew, now), _count(e.get("change"), f"{ew}.change")))
    new = raw.get("new", False)
    if not isinstance(new, bool):
        raise ConfigError(f"{where}.new: must be true or false")
    recs.sort(key=lambda r: r.at)
    return hpa.History(
        tuple(recs), tuple(events["scaleUpEvents"]), tuple(events["scaleDownEvents"]), started=not new
    )
