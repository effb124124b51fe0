"""The service model a candidate configuration is replayed against: demand per step, a curve per
metric and for the bound's signal (:mod:`adapter.hpa.recommend.capacity`), and a backlog.

Per step, with ``n`` Ready replicas and demand ``D``:

* with a known capacity ``μ`` per replica, the backlog grows by ``(D - n·μ)·step`` when demand
  exceeds it and drains as it falls (never below 0); while there is a backlog, the bound is broken
  as often as history broke it at that backlog per replica (every step, when history had too few
  such steps to tell), and the queue metric adds backlog ÷ n;
* each per-pod metric = its curve at ``x = D / n`` (capped at the highest load per replica fitted
  when there is a backlog) × (1 + the relative residual history showed at that step); Object and
  External metrics (totals) are taken as recorded;
* the bound's share broken = the share of history's steps at that load per replica whose signal
  broke it (:class:`~adapter.hpa.recommend.capacity.Exceedance`).

:func:`evaluate` works on arrays (one value per candidate): the replay engine calls it with arrays of
one, the vectorised search (:mod:`adapter.hpa.recommend.kernel`) with one per candidate, so both do
the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from adapter.hpa.recommend.capacity import Curve, Exceedance
from hpa_controller import decide as hpa

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class MetricModel:
    spec: hpa.MetricSpec
    curve: Curve | None
    """Per-pod metrics (Pods, Resource); None for totals (Object, External)."""
    recorded: Array | None = None
    """Totals as recorded (NaN where none was)."""
    queue: bool = False
    """The metric is the queue the backlog adds to."""
    request: float = 0.0
    """Resource Utilization: the pods' request (plain units) the usage is divided by."""
    noise: Array | None = None
    """Per step, the relative residual history showed at that step (``y / curve(x) - 1``): the
    replayed value carries the same noise, so the controller meets the wobble it met in history."""


@dataclass(frozen=True)
class Bound:
    signal: str
    upper: bool
    """True: the signal must stay at or below ``value``."""
    value: float
    budget: float
    """Share of each day's steps allowed broken (0-1)."""

    def text(self) -> str:
        op = "<=" if self.upper else ">="
        return f"{self.signal} {op} {self.value:g} (broken at most {self.budget * 100:g} % of each day)"


@dataclass(frozen=True)
class ServiceModel:
    step: float
    demand: Array
    capacity: float | None
    metrics: tuple[MetricModel, ...]
    bound: Bound
    bound_curve: Curve
    """The bound's signal against the load per replica (reported)."""
    bound_break: Exceedance
    """The share of steps the bound was broken against the load per replica (scored)."""
    backlog_break: Exceedance | None
    """The share of steps the bound was broken against the backlog per replica, over the steps the
    model finds a backlog in history; None (every such step broken) when history has too few."""
    startup: float
    x_fitted: float
    """Highest load per replica the curves were fitted on (beyond: extrapolated)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    cache: dict[int, Tables | None] = field(default_factory=dict, compare=False, repr=False)
    """:func:`tables` by width, built once per model."""


MAX_TABLE_CELLS = 8_000_000
"""Steps × (replicas + 1) above which :func:`tables` builds none (the per-step path is used)."""


@dataclass(frozen=True)
class Tables:
    """Every step's values for every Ready count 0..width-1 without a backlog: the replays look them
    up instead of evaluating the curves (the same arithmetic, done once for all candidates)."""

    values: list[Array | None]
    """Per metric: (steps, width) for per-pod metrics, None for totals."""
    broken: Array
    extrapolated: npt.NDArray[np.bool_]

    @property
    def width(self) -> int:
        return int(self.broken.shape[1])


def tables(model: ServiceModel, width: int) -> Tables | None:
    """The lookup tables of at least ``width`` Ready counts (one built for a larger width serves)."""
    for have, built in model.cache.items():
        if have >= width:
            return built
    if width in model.cache:
        return model.cache[width]
    out: Tables | None = None
    if len(model.demand) * width <= MAX_TABLE_CELLS:
        n = np.maximum(np.arange(width), 1).astype(np.float64)
        x = model.demand[:, None] / n[None, :]
        values: list[Array | None] = [
            None if m.curve is None else _noisy(m, m.curve(x), None) for m in model.metrics
        ]
        broken = model.bound_break(x)
        broken[:, 0] = 1.0
        out = Tables(values, broken, x > model.x_fitted * 1.0001)
    model.cache[width] = out
    return out


@dataclass
class StepValues:
    values: list[Array]
    """Per metric: the per-pod value (per-pod metrics) or the total (others), one per candidate."""
    broken: Array
    extrapolated: npt.NDArray[np.bool_]


def evaluate(
    model: ServiceModel,
    i: int,
    ready: npt.NDArray[np.int64],
    backlog: Array,
    table: Tables | None = None,
) -> tuple[StepValues, Array]:
    """Step ``i`` for candidates with ``ready`` Ready pods and ``backlog`` queued requests: what the
    pods publish, the bound's share broken, and the new backlog (``table``: :func:`tables`)."""
    d = float(model.demand[i])
    n = np.maximum(ready, 1).astype(np.float64)
    if model.capacity is not None:
        backlog = np.maximum(backlog + (d - n * model.capacity) * model.step, 0.0)
        calm = not (backlog > 1e-9).any()
    else:
        calm = True
    if calm and table is not None and int(ready.max()) < table.width:
        looked = [
            tab[i, ready] if tab is not None else np.full(len(ready), m.recorded[i])  # type: ignore[index]
            for tab, m in zip(table.values, model.metrics, strict=True)
        ]
        return StepValues(looked, table.broken[i, ready], table.extrapolated[i, ready]), np.zeros(len(ready))
    if model.capacity is None:
        backlog = np.zeros_like(n)
    x = d / n
    queued = backlog > 1e-9
    xc = np.where(queued, np.minimum(x, model.x_fitted), x)
    values: list[Array] = []
    for m in model.metrics:
        if m.curve is None:
            assert m.recorded is not None
            values.append(np.full_like(n, m.recorded[i]))
            continue
        v = _noisy(m, m.curve(xc), i)
        if m.queue:
            v = v + backlog / n
        values.append(v)
    broken = model.bound_break(xc)
    if queued.any():
        by_backlog = model.backlog_break(backlog / n) if model.backlog_break is not None else 1.0
        broken = np.where(queued, np.maximum(broken, by_backlog), broken)
    broken = np.where(ready < 1, 1.0, broken)
    return StepValues(values, broken, x > model.x_fitted * 1.0001), backlog


def _noisy(m: MetricModel, value: Array, i: int | None) -> Array:
    """``value`` with the metric's recorded noise: at step ``i``, or per row (every step) when None."""
    if m.noise is None:
        return value
    factor = 1.0 + (m.noise[: len(value), None] if i is None else m.noise[i])
    return np.asarray(value * factor, dtype=np.float64)


class ModelledLoad:
    """The replay engine's load model for one candidate (:class:`adapter.hpa.replay.LoadModel`)."""

    def __init__(self, model: ServiceModel, hpa_model: hpa.HpaModel, *, width: int = 0) -> None:
        self.model = model
        self.order = [_index(model.metrics, m) for m in hpa_model.metrics]
        self.backlog = np.zeros(1)
        self.extrapolated = 0
        self.table = tables(model, max(width, hpa_model.max_replicas + 1))

    def observe(
        self, i: int, *, replicas: int, ready: Sequence[str]
    ) -> tuple[list[hpa.Observation], bool, float]:
        step, self.backlog = evaluate(
            self.model, i, np.array([len(ready)], dtype=np.int64), self.backlog, self.table
        )
        self.extrapolated += int(step.extrapolated[0])
        out: list[hpa.Observation] = []
        for k in self.order:
            m = self.model.metrics[k]
            value = float(step.values[k][0])
            if m.curve is None:
                out.append(
                    hpa.Observation(values=(value,))
                    if np.isfinite(value)
                    else hpa.Observation(error="no value")
                )
            elif not ready:
                out.append(hpa.Observation(per_pod={}))
            else:
                out.append(hpa.Observation(per_pod=dict.fromkeys(ready, value)))
        return out, False, float(step.broken[0])


def _index(metrics: Sequence[MetricModel], spec: hpa.MetricSpec) -> int:
    for k, m in enumerate(metrics):
        if (m.spec.kind, m.spec.name, m.spec.container) == (spec.kind, spec.name, spec.container):
            return k
    raise KeyError(spec.name)
