"""The replay loop of :func:`adapter.hpa.replay.replay` with :class:`~adapter.hpa.recommend.model.ModelledLoad`,
for many candidate configurations at once (NumPy arrays with one entry per candidate).

It is the search's instrument, not a second controller: it follows :func:`hpa_controller.decide.decide`
line by line for the shapes a replay produces (every Ready pod with the same value, pods still
starting without one), and the tests run both on the same inputs and require the same replica count
at every step. Every figure recommend-hpa prints is replayed again through the replay engine itself.

Per step and candidate: pods Ready and starting → the model's values (:func:`~adapter.hpa.recommend.model.evaluate`)
→ each metric's proposal in milli-units (``calcPlainMetricReplicas``, ``GetResourceReplicas``,
Object/External Value and AverageValue, with missing pods filled in as the controller does) → the
largest, or the current count when metrics failed → stabilisation over the recommendations of each
window → the policies' limits over the scale events of each period (or, without ``behavior``,
max(2 × current, 4)) → min/max → pods created (Ready after the start-up delay) or removed, the
starting ones first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from adapter.hpa.recommend.model import ServiceModel, evaluate, tables
from hpa_controller import decide as hpa
from hpa_controller.milli import target_milli

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
BIG = 2**40
_MAX, _MIN, _DISABLED = 0, 1, 2
_SELECT = {"Max": _MAX, "Min": _MIN, "Disabled": _DISABLED}


@dataclass
class KernelResult:
    replica_steps: F64
    """(candidates, days): replicas summed over the day's steps."""
    broken: F64
    """(candidates, days): the bound's expected broken steps."""
    steps: I64
    """(days,): steps per day."""
    ups: I64
    downs: I64
    extrapolated: I64
    at_max: I64
    trace: I64 | None = None
    """(candidates, steps): replicas after each step's decision, when asked for."""


@dataclass
class _Rules:
    """One direction's rules of every candidate; the policies flattened, candidate by candidate."""

    window: I64
    """Stabilisation window in seconds, per candidate."""
    select: I64
    owner: I64
    """Per policy: its candidate (policies of a candidate are contiguous)."""
    starts: I64
    """Per candidate: the index of its first policy."""
    kinds: I64
    """Per policy: 0 Pods, 1 Percent."""
    values: I64
    periods: I64


def _rules(models: Sequence[hpa.HpaModel], up: bool) -> _Rules:
    rules = [
        (m.behavior.scale_up if up else m.behavior.scale_down)
        if m.behavior is not None
        else (hpa.scale_up_rules() if up else hpa.scale_down_rules())
        for m in models
    ]
    owner: list[int] = []
    kinds: list[int] = []
    values: list[int] = []
    periods: list[int] = []
    starts: list[int] = []
    for c, r in enumerate(rules):
        starts.append(len(owner))
        for p in r.policies:
            owner.append(c)
            kinds.append(0 if p.kind == "Pods" else 1)
            values.append(p.value)
            periods.append(p.period_seconds)
    return _Rules(
        np.array([r.stabilization_seconds for r in rules], dtype=np.int64),
        np.array([_SELECT[r.select_policy] for r in rules], dtype=np.int64),
        np.array(owner, dtype=np.int64),
        np.array(starts, dtype=np.int64),
        np.array(kinds, dtype=np.int64),
        np.array(values, dtype=np.int64),
        np.array(periods, dtype=np.int64),
    )


class _Ring:
    """Past values per candidate, by step; reads the entries younger than a per-candidate age."""

    def __init__(self, candidates: int, length: int, fill: int, ages: I64) -> None:
        self.length = max(length, 1)
        self.data = np.full((candidates, self.length), fill, dtype=np.int64)
        self.fill = fill
        self.groups = [(np.flatnonzero(ages == age)[:, None], int(age)) for age in np.unique(ages) if age > 1]
        self.back = np.arange(1, self.length + 1)

    def put(self, i: int, values: I64) -> None:
        self.data[:, i % self.length] = values

    def window(self, i: int, pick: str) -> I64:
        """min or max over entries of ages 1..ages-1 (per candidate); ``fill`` when none."""
        out = np.full(self.data.shape[0], self.fill, dtype=np.int64)
        for rows, age in self.groups:
            span = min(age - 1, i, self.length)
            if span <= 0:
                continue
            cols = (i - self.back[:span]) % self.length
            block = self.data[rows, cols]
            out[rows[:, 0]] = block.max(axis=1) if pick == "max" else block.min(axis=1)
        return out


def run(
    model: ServiceModel,
    models: Sequence[hpa.HpaModel],
    *,
    first: int,
    days: I64,
    requests: dict[str, int] | None = None,
    trace: bool = False,
) -> KernelResult:
    """Replay every candidate over the model's steps; ``days`` gives each step's day index;
    ``requests``: each Resource metric's per-pod request in milli-units (Utilization targets)."""
    state = _Replay(model, models, first=first, requests=requests or {})
    steps_total = len(model.demand)
    ndays = int(days.max()) + 1 if steps_total else 0
    c = len(models)
    res = KernelResult(
        np.zeros((c, ndays)),
        np.zeros((c, ndays)),
        np.bincount(days, minlength=ndays).astype(np.int64),
        np.zeros(c, dtype=np.int64),
        np.zeros(c, dtype=np.int64),
        np.zeros(c, dtype=np.int64),
        np.zeros(c, dtype=np.int64),
    )
    if trace:
        res.trace = np.zeros((c, steps_total), dtype=np.int64)
    prev: I64 | None = None
    for i in range(steps_total):
        final, broken, extrapolated = state.step(i)
        day = int(days[i])
        res.replica_steps[:, day] += final
        res.broken[:, day] += broken
        res.extrapolated += extrapolated
        res.at_max += final >= state.max_r
        if prev is not None:
            res.ups += final > prev
            res.downs += final < prev
        prev = final
        if res.trace is not None:
            res.trace[:, i] = final
    return res


class _Replay:
    """Every candidate's controller memory and pods, one :meth:`step` at a time."""

    def __init__(
        self, model: ServiceModel, models: Sequence[hpa.HpaModel], *, first: int, requests: dict[str, int]
    ) -> None:
        c = len(models)
        step = model.step
        self.model, self.first, self.requests = model, first, requests
        self.order = [_metric_index(model, m) for m in models[0].metrics]
        shapes = [(s.kind, s.name, s.target_type) for s in models[0].metrics]
        if any([(s.kind, s.name, s.target_type) for s in m.metrics] != shapes for m in models):
            raise ValueError("every candidate must have the same metrics (kind, name, target type)")
        self.specs = models[0].metrics
        self.targets = np.array(
            [
                [
                    target_milli(s.target) if s.target_type != "Utilization" else int(s.target)
                    for s in m.metrics
                ]
                for m in models
            ],
            dtype=np.int64,
        )
        self.min_r = np.array([m.min_replicas for m in models], dtype=np.int64)
        self.max_r = np.array([m.max_replicas for m in models], dtype=np.int64)
        tol = [m.tolerances() for m in models]
        self.tol_up = np.array([t.up for t in tol])
        self.tol_down = np.array([t.down for t in tol])
        self.legacy = np.array([m.behavior is None for m in models])
        self.up, self.down = _rules(models, True), _rules(models, False)
        self.k_start = max(0, math.ceil(model.startup / step - 1e-7))
        # windows and periods in steps: an entry of age a counts while a·step < window (behaviour),
        # a·step <= 300 (legacy); recommendations of ages 1..ages-1 are read from the ring
        self.up_ages = np.where(self.legacy, 0, np.ceil(self.up.window / step - 1e-9).astype(np.int64))
        self.down_ages = np.where(
            self.legacy, _legacy_ages(step), np.ceil(self.down.window / step - 1e-9).astype(np.int64)
        )
        ring_len = int(max(self.up_ages.max(initial=1), self.down_ages.max(initial=1))) + 1
        self.rec_min = _Ring(c, ring_len, BIG, self.up_ages)  # invalid entries: BIG for min, -1 for max
        self.rec_max = _Ring(c, ring_len, -1, self.down_ages)
        self.lag_up = (
            np.ceil(self.up.periods / step - 1e-9).astype(np.int64) - 1
        )  # events of the last lag steps
        self.lag_down = np.ceil(self.down.periods / step - 1e-9).astype(np.int64) - 1
        cum_len = int(max(self.lag_up.max(initial=1), self.lag_down.max(initial=1))) + 3
        self.cum_up = np.zeros((c, cum_len), dtype=np.int64)  # cum[i] = changes stored before step i
        self.cum_down = np.zeros((c, cum_len), dtype=np.int64)
        self.tot_up = np.zeros(c, dtype=np.int64)
        self.tot_down = np.zeros(c, dtype=np.int64)
        self.created = np.zeros((c, max(self.k_start, 1)), dtype=np.int64)  # pods created per step
        self.spec = np.full(c, first, dtype=np.int64)
        self.pending = np.zeros(c, dtype=np.int64)
        self.backlog = np.zeros(c)
        self.table = tables(model, int(max(self.max_r.max(), first)) + 1)

    def step(self, i: int) -> tuple[I64, F64, npt.NDArray[np.bool_]]:
        """Step ``i``: (replicas after the decision, the bound's share broken, extrapolated)."""
        k = self.k_start
        if k:
            self.pending -= self.created[:, i % k]  # created k steps ago: Ready now
            self.created[:, i % k] = 0
        spec = self.spec
        ready = spec - self.pending
        values, self.backlog = evaluate(self.model, i, ready, self.backlog, self.table)
        self.cum_up[:, i % self.cum_up.shape[1]] = self.tot_up
        self.cum_down[:, i % self.cum_down.shape[1]] = self.tot_down
        desired, failed = self._propose(values.values, ready)
        final = self._normalise(i, desired)
        final = np.where(failed, spec, final)
        over, under = spec > self.max_r, spec < self.min_r
        final = np.where(over, self.max_r, np.where(under, self.min_r, final))
        stored = ~(failed | over | under)
        self.rec_min.put(i, np.where(stored, desired, BIG))
        self.rec_max.put(i, np.where(stored, desired, -1))
        change = final - spec
        behaviour = ~self.legacy
        self.tot_up = self.tot_up + np.where(behaviour & (change > 0), change, 0)
        self.tot_down = self.tot_down + np.where(behaviour & (change < 0), -change, 0)
        self._pods(i, change)
        self.spec = final
        return final, values.broken, values.extrapolated

    def _propose(self, values: Sequence[F64], ready: I64) -> tuple[I64, npt.NDArray[np.bool_]]:
        """The largest proposal over the metrics that could be evaluated, and whether the decision
        failed (every metric failed, or one did and the others propose a scale-down)."""
        c = len(ready)
        proposed = np.zeros(c, dtype=np.int64)
        invalid = np.zeros(c, dtype=np.int64)
        for k, s in enumerate(self.specs):
            prop, bad = _proposal(
                s,
                values[self.order[k]],
                self.targets[:, k],
                spec=self.spec,
                ready=ready,
                missing=self.pending,
                tol_up=self.tol_up,
                tol_down=self.tol_down,
                request=self.requests.get(s.name, 0),
            )
            invalid += bad
            proposed = np.where(bad, proposed, np.where((proposed == 0) | (prop > proposed), prop, proposed))
        failed = (invalid >= len(self.specs)) | ((invalid > 0) & (proposed < self.spec))
        return proposed, failed

    def _normalise(self, i: int, desired: I64) -> I64:
        """Stabilisation, then the legacy rules or the behaviour's rate limits, then min/max."""
        spec, first = self.spec, self.first
        hist_max = self.rec_max.window(i, "max")
        hist_max = np.where(i < self.down_ages, np.maximum(hist_max, first), hist_max)  # the first size
        hist_min = self.rec_min.window(i, "min")
        hist_min = np.where(i < self.up_ages, np.minimum(hist_min, first), hist_min)
        legacy_stab = np.maximum(desired, hist_max)
        maximum = np.minimum(self.max_r, np.maximum(2 * spec, 4))
        legacy_final = np.where(legacy_stab < self.min_r, self.min_r, np.minimum(legacy_stab, maximum))
        beh_stab = np.minimum(np.maximum(spec, np.minimum(desired, hist_min)), np.maximum(desired, hist_max))
        counts = (self.cum_up, self.cum_down, self.tot_up, self.tot_down)
        up_limit = _limit(self.up, self.lag_up, counts, i=i, spec=spec, up=True)
        down_limit = _limit(self.down, self.lag_down, counts, i=i, spec=spec, up=False)
        allowed_up = np.minimum(self.max_r, np.maximum(up_limit, spec))
        allowed_down = np.maximum(self.min_r, np.minimum(down_limit, spec))
        beh_final = np.where(
            beh_stab > spec,
            np.minimum(beh_stab, allowed_up),
            np.where(beh_stab < spec, np.maximum(beh_stab, allowed_down), beh_stab),
        )
        return np.where(self.legacy, legacy_final, beh_final)

    def _pods(self, i: int, change: I64) -> None:
        """New pods start (Ready after the start-up delay); removed ones are the starting pods first,
        the newest first."""
        k = self.k_start
        if not k:
            return
        grow = np.maximum(change, 0)
        self.created[:, i % k] = grow
        remove = np.minimum(np.maximum(-change, 0), self.pending)
        self.pending += grow - remove
        if not remove.any():
            return
        for age in range(1, k):
            col = (i - age) % k
            take = np.minimum(self.created[:, col], remove)
            self.created[:, col] -= take
            remove = remove - take
            if not remove.any():
                break


def _legacy_ages(step: float) -> int:
    """Ages of recommendations the legacy window (300 s, inclusive) reads, as a ring bound."""
    return math.floor(hpa.DOWNSCALE_STABILISATION / step + 1e-9) + 1


def _limit(rules: _Rules, lag: I64, counts: tuple[I64, I64, I64, I64], *, i: int, spec: I64, up: bool) -> I64:
    """``calculateScaleUpLimitWithScalingRules`` / ``calculateScaleDownLimitWithBehaviors``: each
    policy from the count before its period's scale events, then Max/Min over a candidate's
    policies. ``counts``: the rings of cumulated scale-ups and -downs, and their totals."""
    cum_up, cum_down, tot_up, tot_down = counts
    owner = rules.owner
    idx = (i - np.minimum(lag, i)) % cum_up.shape[1]
    added = tot_up[owner] - cum_up[owner, idx]
    removed = tot_down[owner] - cum_down[owner, idx]
    start = spec[owner] - added + removed
    v = rules.values
    if up:
        prop = np.where(rules.kinds == 0, start + v, np.ceil(start * (1 + v / 100)).astype(np.int64))
        hi, lo = np.maximum.reduceat(prop, rules.starts), np.minimum.reduceat(prop, rules.starts)
        result = np.where(rules.select == _MIN, lo, hi)
    else:
        prop = np.where(rules.kinds == 0, start - v, np.trunc(start * (1 - v / 100)).astype(np.int64))
        hi, lo = np.maximum.reduceat(prop, rules.starts), np.minimum.reduceat(prop, rules.starts)
        result = np.where(rules.select == _MIN, hi, lo)
    return np.where(rules.select == _DISABLED, spec, result)


def _proposal(
    s: hpa.MetricSpec,
    value: F64,
    target: I64,
    *,
    spec: I64,
    ready: I64,
    missing: I64,
    tol_up: F64,
    tol_down: F64,
    request: int,
) -> tuple[I64, npt.NDArray[np.bool_]]:
    """(proposal, invalid) per candidate for one metric."""
    c = len(spec)

    def within(r: F64) -> npt.NDArray[np.bool_]:
        return ((1.0 - tol_down) <= r) & (r <= (1.0 + tol_up))

    if s.kind in ("Object", "External"):
        bad = ~np.isfinite(value)
        v = np.where(bad, 0.0, value)
        milli = np.trunc(v * 1000.0).astype(np.int64)
        if s.target_type == "Value":
            ratio = milli / target
            prop = np.where(within(ratio), spec, np.ceil(ratio * ready).astype(np.int64))
        else:
            ratio = milli / (target * spec)
            prop = np.where(within(ratio), spec, np.ceil(milli / target).astype(np.int64))
        return np.minimum(prop, 2**31 - 1), bad
    bad = ready < 1
    usage = np.trunc(np.maximum(value, 0.0) * 1000.0).astype(np.int64)
    n = np.maximum(ready, 1)
    if s.target_type == "Utilization":
        req = request
        if req <= 0:
            return np.zeros(c, dtype=np.int64), np.ones(c, dtype=bool)
        util = (n * usage * 100) // (n * req)
        ratio = util / target
        fallback = np.maximum(100, target)
        filled_low = (n * usage + missing * ((req * fallback) // 100)) * 100 // ((n + missing) * req)
        filled_high = (n * usage) * 100 // ((n + missing) * req)
        new_util = np.where(ratio < 1.0, filled_low, np.where(ratio > 1.0, filled_high, util))
        new_ratio = new_util / target
    else:
        ratio = usage / target
        low = (n * usage + missing * target) // (n + missing)
        high = (n * usage) // (n + missing)
        new_ratio = np.where(ratio < 1.0, low, np.where(ratio > 1.0, high, usage)) / target
    plain = np.where(within(ratio), spec, np.ceil(ratio * n).astype(np.int64))
    replicas = np.ceil(new_ratio * (n + missing)).astype(np.int64)
    keep = within(new_ratio) | ((ratio < 1.0) & (new_ratio > 1.0)) | ((ratio > 1.0) & (new_ratio < 1.0))
    keep |= ((new_ratio < 1.0) & (replicas > spec)) | ((new_ratio > 1.0) & (replicas < spec))
    with_missing = np.where(keep, spec, replicas)
    prop = np.where(missing > 0, with_missing, plain)
    return prop, bad


def _metric_index(model: ServiceModel, spec: hpa.MetricSpec) -> int:
    for k, m in enumerate(model.metrics):
        if (m.spec.kind, m.spec.name, m.spec.container) == (spec.kind, spec.name, spec.container):
            return k
    raise KeyError(spec.name)
