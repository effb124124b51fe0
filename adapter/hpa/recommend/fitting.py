"""From the checked history to the service model: demand, start-up delay, capacity, one curve per
metric and one for the bound's signal (which model each gets is reported)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from adapter.errors import ConfigError
from adapter.hpa.recommend import capacity, demand
from adapter.hpa.recommend.capacity import Curve, FitError
from adapter.hpa.recommend.history import Inputs
from adapter.hpa.recommend.model import Bound, MetricModel, ServiceModel
from adapter.hpa.spec import HpaSpec


@dataclass(frozen=True)
class Fitted:
    model: ServiceModel
    demand: demand.Demand
    startup_measured: float | None
    startup_events: int
    curves: tuple[Curve, ...]
    censored_share: float


def fit(
    spec: HpaSpec,
    inputs: Inputs,
    bound: Bound,
    *,
    queue_metric: str,
    startup: float | None,
    requests: dict[str, int],
) -> Fitted:
    d = demand.recover(
        step=inputs.step,
        served=inputs.served,
        rejected=inputs.rejected,
        queued=inputs.queued,
        ready=inputs.ready,
        recorded=inputs.recorded,
        max_replicas=spec.max_replicas,
    )
    measured, events = demand.startup_delay(inputs.times, inputs.recorded, inputs.ready)
    delay = startup if startup is not None else (measured if measured is not None else 0.0)
    notes = list(inputs.notes)
    if startup is None and measured is None:
        notes.append("no scale-up in history to measure the pods' start-up delay: taken as 0 (set --startup)")
    usable = ~d.censored & np.isfinite(d.per_replica) & (inputs.ready > 0)
    x = d.per_replica
    metrics: list[MetricModel] = []
    curves: list[Curve] = []
    for k, m in enumerate(spec.model.metrics):
        if k in inputs.totals:
            metrics.append(MetricModel(m, None, recorded=inputs.totals[k]))
            continue
        y = inputs.per_pod[k]
        try:
            curve = capacity.fit(m.name, x[usable], y[usable])
        except FitError as exc:
            raise ConfigError(
                f"the HPA's metric {exc}: widen the window (--since) or check the series"
            ) from None
        curves.append(curve)
        metrics.append(
            MetricModel(
                m,
                curve,
                queue=m.name == queue_metric,
                request=requests.get(m.name, 0) / 1000.0,
                noise=_noise(curve, x, y, usable),
            )
        )
    if not curves:
        raise ConfigError(
            f"{spec.path}: every metric of the HPA is Object or External: none responds to the replica "
            "count, so no target can be modelled; recommend-hpa needs a Pods or Resource metric"
        )
    try:
        signal = capacity.fit(bound.signal, x[usable], inputs.signal[usable])
        breaks = capacity.fit_exceedance(
            bound.signal, x[usable], inputs.signal[usable], bound=bound.value, upper=bound.upper
        )
    except FitError as exc:
        raise ConfigError(f"--bound {exc}: widen the window (--since) or check the series") from None
    curves.append(signal)
    x_fitted = float(np.nanmax(x[usable])) if usable.any() else 0.0
    backlog_break = None
    if d.capacity is not None:
        per_pod = _backlog(d.offered, inputs.ready, d.capacity, inputs.step) / np.maximum(inputs.ready, 1)
        queued = per_pod > 1e-9
        if queued.sum() >= capacity.MIN_POINTS:
            try:
                backlog_break = capacity.fit_exceedance(
                    bound.signal,
                    per_pod[queued] + 1e-9,
                    inputs.signal[queued],
                    bound=bound.value,
                    upper=bound.upper,
                )
            except FitError:
                backlog_break = None
    model = ServiceModel(
        step=inputs.step,
        demand=d.offered,
        capacity=d.capacity,
        metrics=tuple(metrics),
        bound=bound,
        bound_curve=signal,
        bound_break=breaks,
        backlog_break=backlog_break,
        startup=delay,
        x_fitted=x_fitted,
        notes=tuple(notes),
    )
    return Fitted(
        model, d, measured, events, tuple(curves), float(d.censored.mean()) if len(d.censored) else 0.0
    )


def _backlog(offered: np.ndarray, ready: np.ndarray, mu: float, step: float) -> np.ndarray:
    """The model's backlog with the recorded Ready pods (the recursion :func:`model.evaluate` runs)."""
    out = np.zeros(len(offered))
    b = 0.0
    for i, (d, n) in enumerate(zip(offered.tolist(), ready.tolist(), strict=True)):
        b = max(b + (d - max(n, 1) * mu) * step, 0.0)
        out[i] = b
    return out


NOISE_LIMIT = 0.5
"""Relative residuals are kept within ±50 % (a step far off its curve is an outlier, not noise)."""


def _noise(curve: Curve, x: np.ndarray, y: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """Each step's relative residual from the curve (0 where the step was not fitted)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        fitted = curve(np.where(np.isfinite(x), x, 0.0))
        r = np.where(usable & (fitted > 1e-9) & np.isfinite(y), y / fitted - 1.0, 0.0)
    return np.asarray(np.clip(np.nan_to_num(r), -NOISE_LIMIT, NOISE_LIMIT), dtype=np.float64)
