"""What recommend-hpa reads from Prometheus, aligned on the replay's step grid and checked.

Beside the HPA's own inputs (:func:`adapter.hpa.timeline.fetch`: its metrics as the adapter serves
them, the recorded replicas, the target's pods), per pod of the target: the served and rejected
request counters as rates, the queued requests, and the bound's signal; each summed (or, for the
signal, averaged) over the pods. A sample that is NaN or infinite stops the run with its series,
pod and time; a step without a value is a gap: gaps up to ``max_gap`` are bridged with the values
before them (and counted in the output), a longer one stops the run, naming where it is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from adapter.clients.prometheus import PrometheusClient, RangeSeries
from adapter.errors import ConfigError
from adapter.hpa import timeline as tl
from adapter.hpa.recommend.bound import BoundSpec
from adapter.hpa.spec import HpaSpec
from adapter.provider.selectors import Selector, promql_escape
from adapter.provider.values import MetricValues
from gpupilot_common.timefmt import format_time

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


@dataclass(frozen=True)
class Demand:
    """Series names that recover demand (flags ``--served-requests``, ``--rejected-requests``, ``--queue``)."""

    served: str
    rejected: str
    queue: str


@dataclass
class Inputs:
    timeline: tl.Timeline
    step: float
    times: Array
    recorded: IntArray
    ready: IntArray
    """Pods with a value of the HPA's first per-pod metric (else of the served counter)."""
    served: Array
    rejected: Array | None
    queued: Array | None
    per_pod: dict[int, Array]
    """Metric index → mean per-pod value per step (per-pod metrics)."""
    totals: dict[int, Array]
    """Metric index → the value per step (Object and External metrics; NaN where none)."""
    signal: Array
    sample_spacing: float
    bridged: int = 0
    notes: list[str] = field(default_factory=list)


def check_name(flag: str, name: str) -> str:
    if not NAME.match(name):
        raise ConfigError(f"{flag} {name!r}: expected a series name (letters, digits, _ and :)")
    return name


def fetch(
    spec: HpaSpec,
    *,
    values: MetricValues,
    prometheus: PrometheusClient,
    selector: Selector,
    bound: BoundSpec,
    demand: Demand,
    start: float,
    end: float,
    step: float,
    max_gap: float,
    rate_window: float | None,
) -> Inputs:
    non_finite: list[tuple[Mapping[str, str], float, float]] = []
    line = tl.fetch(
        spec,
        values=values,
        prometheus=prometheus,
        selector=selector,
        start=start,
        end=end,
        step=step,
        non_finite=non_finite,
    )
    _refuse_non_finite(non_finite, what="the HPA's metrics")
    if not line.pods:
        raise ConfigError(
            f"no pod of {spec.namespace} matched the target's selector ({selector}) between "
            f"{format_time(start)} and {format_time(end)} (kube_pod_labels): check the window and --selector"
        )
    count = len(line.times)
    wanted = set(line.pods)
    ns = f'namespace="{promql_escape(spec.namespace)}"'
    spacing = round(_spacing(prometheus, spec, start=start, end=end) or step)
    window = math.ceil(rate_window or max(60.0, 4.0 * spacing))
    notes: list[str] = []
    if spacing > step * 1.5:
        notes.append(
            f"history holds a sample every {spacing:g}s: each is held for {spacing / step:.0f} steps of {step:g}s"
        )

    def per_pod(query: str, what: str, *, required: bool) -> tuple[Array, IntArray] | None:
        bad: list[tuple[Mapping[str, str], float, float]] = []
        series = prometheus.query_range(
            query, start=start, end=end, step=step, purpose="history", non_finite=bad
        )
        _refuse_non_finite(bad, what=what)
        total, counts = _sum_by_pod(series, wanted, start=start, step=step, count=count)
        if not counts.any():
            if required:
                raise ConfigError(
                    f"{what}: Prometheus has no series for the pods of {spec.namespace}/{spec.target_name} "
                    f"between {format_time(start)} and {format_time(end)} ({query}): check the name "
                    "(or record it first)"
                )
            return None
        return total, counts

    served = per_pod(
        f"sum by (pod) (rate({demand.served}{{{ns}}}[{window}s]))",
        f"--served-requests {demand.served}",
        required=True,
    )
    assert served is not None
    rejected = per_pod(
        f"sum by (pod) (rate({demand.rejected}{{{ns}}}[{window}s]))",
        f"--rejected-requests {demand.rejected}",
        required=False,
    )
    if rejected is None:
        notes.append(f"no {demand.rejected} series: rejected requests are not counted in demand")
    queued = per_pod(f"sum by (pod) ({demand.queue}{{{ns}}})", f"--queue {demand.queue}", required=False)
    if queued is None:
        notes.append(f"no {demand.queue} series: the queue's growth is not counted in demand")
    signal = _signal(
        prometheus, bound, spec=spec, wanted=wanted, start=start, end=end, step=step, count=count
    )
    per_metric: dict[int, Array] = {}
    totals: dict[int, Array] = {}
    ready: IntArray | None = None
    for k, m in enumerate(spec.model.metrics):
        obs = [o[k] for o in line.observations]
        if m.kind in ("Object", "External"):
            totals[k] = np.array(
                [
                    (o.values[0] if m.kind == "Object" else sum(o.values))
                    if o.values and not o.error
                    else math.nan
                    for o in obs
                ]
            )
            continue
        means = np.array([np.mean(list(o.per_pod.values())) if o.per_pod else math.nan for o in obs])
        per_metric[k] = means
        if ready is None:
            ready = np.array([len(o.per_pod) if o.per_pod else 0 for o in obs], dtype=np.int64)
    if ready is None:
        ready = served[1]
    recorded = np.array([r if r is not None else -1 for r in line.recorded], dtype=np.int64)
    times = np.array(line.times)
    series: dict[str, Array] = {"the recorded replica count": recorded.astype(np.float64)}
    series[f"--served-requests {demand.served}"] = np.where(served[1] > 0, served[0], np.nan)
    series[f"--bound {bound.selector}"] = signal
    for k, arr in per_metric.items():
        series[f"the HPA's metric {spec.model.metrics[k].name}"] = arr
    bridged = _bridge(series, times, recorded=recorded, max_gap=max_gap)
    recorded = series["the recorded replica count"].astype(np.int64)
    for k in per_metric:
        per_metric[k] = series[f"the HPA's metric {spec.model.metrics[k].name}"]
    served_total = np.nan_to_num(series[f"--served-requests {demand.served}"])
    if bridged:
        notes.append(
            f"{bridged} steps without a value (gaps up to --max-gap) bridged with the values before them"
        )
    return Inputs(
        timeline=line,
        step=step,
        times=times,
        recorded=recorded,
        ready=ready,
        served=served_total,
        rejected=rejected[0] if rejected else None,
        queued=queued[0] if queued else None,
        per_pod=per_metric,
        totals=totals,
        signal=series[f"--bound {bound.selector}"],
        sample_spacing=spacing,
        bridged=bridged,
        notes=notes,
    )


def _refuse_non_finite(bad: Sequence[tuple[Mapping[str, str], float, float]], *, what: str) -> None:
    if not bad:
        return
    labels, at, value = min(bad, key=lambda b: b[1])
    pod = labels.get("pod")
    where = f" of pod {pod}" if pod else ""
    raise ConfigError(
        f"{what}: {len(bad)} sample(s) are {value!r}, the first{where} at {format_time(at)}: "
        "a recommendation on them would be computed on missing data; fix the series or choose a window "
        "without them (--since/--until)"
    )


def _sum_by_pod(
    series: Sequence[RangeSeries], wanted: set[str], *, start: float, step: float, count: int
) -> tuple[Array, IntArray]:
    total = np.zeros(count)
    counts = np.zeros(count, dtype=np.int64)
    for s in series:
        if s.labels.get("pod", "") not in wanted:
            continue
        for t, v in s.points:
            i = round((t - start) / step)
            if 0 <= i < count:
                total[i] += v
                counts[i] += 1
    return total, counts


def _signal(
    prometheus: PrometheusClient,
    bound: BoundSpec,
    *,
    spec: HpaSpec,
    wanted: set[str],
    start: float,
    end: float,
    step: float,
    count: int,
) -> Array:
    bad: list[tuple[Mapping[str, str], float, float]] = []
    query = bound.query(spec.namespace)
    series = prometheus.query_range(query, start=start, end=end, step=step, purpose="history", non_finite=bad)
    _refuse_non_finite(bad, what=f"--bound {bound.selector}")
    per_pod = [s for s in series if s.labels.get("pod")]
    if per_pod:
        total, counts = _sum_by_pod(per_pod, wanted, start=start, step=step, count=count)
        if counts.any():
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(counts > 0, total / np.maximum(counts, 1), np.nan)
    service = [s for s in series if not s.labels.get("pod")]
    if len(service) == 1:
        out = np.full(count, np.nan)
        for t, v in service[0].points:
            i = round((t - start) / step)
            if 0 <= i < count:
                out[i] = v
        return out
    raise ConfigError(
        f"--bound {bound.selector}: Prometheus has no such series for the pods of {spec.namespace}/"
        f"{spec.target_name} between {format_time(start)} and {format_time(end)} ({query}): check the "
        "name and matchers, or record the signal first (one series per pod, or one for the service)"
    )


def _spacing(prometheus: PrometheusClient, spec: HpaSpec, *, start: float, end: float) -> float | None:
    """Seconds between the recorded replica count's samples over the window (the history's resolution)."""
    ns = promql_escape(spec.namespace)
    span = max(1, int(end - start))
    for query in (
        f'count_over_time(kube_deployment_spec_replicas{{namespace="{ns}", deployment="{promql_escape(spec.target_name)}"}}[{span}s])',
        f'count_over_time(kube_horizontalpodautoscaler_status_current_replicas{{namespace="{ns}", horizontalpodautoscaler="{promql_escape(spec.name)}"}}[{span}s])',
    ):
        rows = prometheus.query(query, at=end, purpose="history")
        if rows and rows[0].value > 1:
            return span / rows[0].value
    return None


def _bridge(series: dict[str, Array], times: Array, *, recorded: IntArray, max_gap: float) -> int:
    """Fill runs of missing steps (NaN, or -1 recorded replicas) with the step before (at the start:
    the first value), when no run is longer than ``max_gap``; otherwise one line naming the run.
    Returns how many steps missed something."""
    del recorded
    step = float(times[1] - times[0]) if len(times) > 1 else 0.0
    union = np.zeros(len(times), dtype=bool)
    for what, arr in series.items():
        missing = ~np.isfinite(arr) | (arr < 0)
        if not missing.any():
            continue
        if missing.all():
            raise ConfigError(
                f"history has no value of {what} from {format_time(times[0])} to {format_time(times[-1])}: "
                "check the window (--since/--until)"
            )
        for a, b in _runs(missing):
            if (b - a) * step > max_gap:
                raise ConfigError(
                    f"history has a gap of {_duration((b - a) * step)} in {what}, from {format_time(times[a])} "
                    f"to {format_time(times[min(b, len(times) - 1)])}: choose a window without it (--since/--until) "
                    f"or bridge it with --max-gap {_duration((b - a) * step)} (its steps then hold the values before it)"
                )
        idx = np.where(missing, -1, np.arange(len(arr)))
        first = int(np.argmin(missing))
        idx[:first] = first
        np.maximum.accumulate(idx, out=idx)
        arr[:] = arr[idx]
        union |= missing
    return int(union.sum())


def _runs(mask: npt.NDArray[np.bool_]) -> list[tuple[int, int]]:
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s % 3600 == 0:
        return f"{s // 3600}h"
    if s % 60 == 0:
        return f"{s // 60}m"
    return f"{s}s"
