"""How a per-pod signal responds to the load per Ready replica: one fitted curve per metric.

``x`` is the demand per Ready replica (requests/s per pod). A signal is either

* **linear** (``y = a·x + b``): an additive rate, such as requests served per pod, which splits
  evenly across replicas; or
* a **curve**: monotone, piecewise linear through the medians of ``y`` in quantile bins of ``x``
  (pool-adjacent-violators makes it non-decreasing), for queue depth, queue wait, KV-cache use or a
  duty cycle, which grow faster than the load as a replica nears its capacity.

A signal gets the linear model only when it fits nearly as well as the curve over the whole range
(its residual no more than 10 % above the curve's and R² ≥ 0.98); :attr:`Curve.kind` says which it got.
Above the highest bin the curve continues with the slope of its last quarter (never below 0),
and the share of steps a configuration drives there is reported as extrapolation.

The bound is scored by :class:`Exceedance`: the share of steps its signal broke the bound, as a
monotone function of the load per replica (the same binning and pool-adjacent-violators), so the
noise seen in history near the bound counts, not only the curve's middle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]

BINS = 40
MIN_POINTS = 50
"""Fewer points than this (unsaturated steps with a value) and no curve is fitted."""


class FitError(ValueError):
    """Too few or too flat points to fit a signal."""


@dataclass(frozen=True)
class Curve:
    name: str
    kind: str
    """``linear`` or ``curve``."""
    xs: Array
    """Knots (increasing): for ``linear`` two points of the line."""
    ys: Array
    slope: float
    """Slope beyond the last knot."""
    residuals: Array
    """Relative residuals ``y / f(x) - 1`` of the fitted points, sorted."""
    error: float
    """Median absolute relative residual."""
    points: int

    @property
    def x_max(self) -> float:
        return float(self.xs[-1])

    def __call__(self, x: Array) -> Array:
        x = np.asarray(x, dtype=np.float64)
        y = np.interp(x, self.xs, self.ys)
        beyond = x > self.xs[-1]
        if self.kind == "linear":
            y = self.ys[0] + (x - self.xs[0]) * (self.ys[1] - self.ys[0]) / (self.xs[1] - self.xs[0])
        elif beyond.any():
            y = np.where(beyond, self.ys[-1] + self.slope * (x - self.xs[-1]), y)
        return np.asarray(np.maximum(y, 0.0), dtype=np.float64)

    def exceed_share(self, predicted: Array, bound: float, *, upper: bool) -> Array:
        """Expected share of steps the signal breaks ``bound`` (``upper``: must stay at or below it)
        when the curve predicts ``predicted``, from the residuals seen in history."""
        res = self.residuals
        with np.errstate(divide="ignore", invalid="ignore"):
            need = np.where(predicted > 0, bound / predicted - 1.0, np.inf)
        if upper:  # broken when predicted·(1 + r) > bound  ⇔  r > need
            above = len(res) - np.searchsorted(res, need, side="right")
            return np.asarray(above / len(res), dtype=np.float64)
        below = np.searchsorted(res, need, side="left")
        return np.asarray(below / len(res), dtype=np.float64)


def fit(name: str, x: Array, y: Array, *, force: str = "") -> Curve:
    """The signal ``y`` against the load per replica ``x`` (finite, unsaturated steps only)."""
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0)
    x, y = x[ok], y[ok]
    if len(x) < MIN_POINTS:
        raise FitError(f"{name}: {len(x)} usable steps, at least {MIN_POINTS} are needed to fit it")
    if float(np.ptp(x)) <= 0:
        raise FitError(f"{name}: the load per replica never changed; nothing to fit")
    curve = _curve(name, x, y)
    if force == "curve":
        return curve
    line = _line(name, x, y)
    if force == "linear":
        return line
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - line(x)) ** 2)) / ss_tot if ss_tot > 0 else 0.0
    rms_line = float(np.sqrt(np.mean((y - line(x)) ** 2)))
    rms_curve = float(np.sqrt(np.mean((y - curve(x)) ** 2)))
    return line if r2 >= 0.98 and rms_line <= 1.1 * rms_curve else curve


def _line(name: str, x: Array, y: Array) -> Curve:
    a, b = np.polyfit(x, y, 1)
    xs = np.array([float(x.min()), float(x.max())])
    ys = a * xs + b
    return _finish(name, "linear", xs, ys, slope=float(a), x=x, y=y)


def _curve(name: str, x: Array, y: Array) -> Curve:
    edges = np.unique(np.quantile(x, np.linspace(0.0, 1.0, BINS + 1)))
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    xs, ys, ws = [], [], []
    for b in range(len(edges) - 1):
        sel = which == b
        if sel.sum() < 3:
            continue
        xs.append(float(np.median(x[sel])))
        ys.append(float(np.median(y[sel])))
        ws.append(float(sel.sum()))
    if len(xs) < 2:
        raise FitError(f"{name}: the load per replica spans too narrow a range to fit a curve")
    kx, ky = np.array(xs), pava(np.array(ys), np.array(ws))
    kx, ky = _strictly_increasing(kx, ky)
    tail = max(1, len(kx) // 4)
    span = kx[-1] - kx[-1 - tail] if len(kx) > tail else 0.0
    slope = max(0.0, (ky[-1] - ky[-1 - tail]) / span) if span > 0 else 0.0
    return _finish(name, "curve", kx, ky, slope=slope, x=x, y=y)


def _strictly_increasing(xs: Array, ys: Array) -> tuple[Array, Array]:
    keep = np.concatenate(([True], np.diff(xs) > 0))
    return xs[keep], ys[keep]


def _finish(name: str, kind: str, xs: Array, ys: Array, *, slope: float, x: Array, y: Array) -> Curve:
    shell = Curve(name, kind, xs, ys, slope, np.zeros(1), 0.0, len(x))
    pred = shell(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(pred > 1e-12, y / pred - 1.0, 0.0)
    rel = np.sort(rel[np.isfinite(rel)])
    if not len(rel):
        rel = np.zeros(1)
    return Curve(name, kind, xs, ys, slope, rel, float(np.median(np.abs(rel))), len(x))


def pava(y: Array, w: Array) -> Array:
    """Weighted isotonic (non-decreasing) regression by pool-adjacent-violators."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for v, wt in zip(y.tolist(), w.tolist(), strict=True):
        blocks.append([v, wt, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            total = w1 + w2
            blocks.append([(m1 * w1 + m2 * w2) / total, total, c1 + c2])
    out: list[float] = []
    for mean, _, count in blocks:
        out.extend([mean] * int(count))
    return np.array(out)


@dataclass(frozen=True)
class Exceedance:
    """Share of steps a signal broke a bound, against the load per replica: non-decreasing, the
    last bin's share beyond the highest load fitted."""

    xs: Array
    shares: Array

    def __call__(self, x: Array) -> Array:
        return np.asarray(np.interp(np.asarray(x, dtype=np.float64), self.xs, self.shares), dtype=np.float64)


def fit_exceedance(name: str, x: Array, y: Array, *, bound: float, upper: bool) -> Exceedance:
    """Bins of the load per replica (equal width, merged until each holds 20 steps), the share of
    each bin's steps past the bound, made non-decreasing."""
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0)
    x, y = x[ok], y[ok]
    if len(x) < MIN_POINTS:
        raise FitError(f"{name}: {len(x)} usable steps, at least {MIN_POINTS} are needed to fit it")
    broken = (y > bound) if upper else (y < bound)
    edges = np.linspace(float(x.min()), float(x.max()), 4 * BINS + 1)
    which = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, len(edges) - 2)
    counts = np.bincount(which, minlength=len(edges) - 1)
    hits = np.bincount(which, weights=broken.astype(np.float64), minlength=len(edges) - 1)
    sums = np.bincount(which, weights=x, minlength=len(edges) - 1)
    xs, shares, weights = [], [], []
    n = h = sx = 0.0
    for k in range(len(counts)):
        n, h, sx = n + counts[k], h + hits[k], sx + sums[k]
        if n >= 20:
            xs.append(sx / n)
            shares.append(h / n)
            weights.append(n)
            n = h = sx = 0.0
    if n and xs:  # the remainder joins the last bin
        total = weights[-1] + n
        xs[-1] = (xs[-1] * weights[-1] + sx) / total
        shares[-1] = (shares[-1] * weights[-1] + h) / total
        weights[-1] = total
    if not xs:
        raise FitError(f"{name}: too few steps to score the bound")
    kx, ky = _strictly_increasing(np.array(xs), pava(np.array(shares), np.array(weights)))
    return Exceedance(kx, ky)


def describe(curves: Sequence[Curve]) -> list[str]:
    return [
        f"{c.name}: {c.kind}, fitted on {c.points} steps, median error {c.error * 100:.1f} %" for c in curves
    ]
