"""Utilisation and memory patterns: pure, vectorised functions of (seed, entity, time).

Every value the simulator publishes comes from here, evaluated over a NumPy array of Unix times, so
a live read at ``t`` (a one-element array) and the backfill at ``t`` (one element of a long array)
run the same arithmetic and give bit-identical floats. Noise is a hash, not a random generator: the
entity's key is ``blake2b(seed, entity)`` and the noise of time bucket ``b`` is ``splitmix64(key, b)``,
so nothing depends on call order or global state.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[np.float64]
PatternKind = Literal["constant", "daily", "bursty", "idle"]

NOISE_BUCKET_S = 15.0
"""Noise is constant within 15-second buckets: Prometheus' usual scrape interval."""
DAY_S = 86400.0

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@dataclass(frozen=True)
class Pattern:
    """A time pattern. Units are the caller's (percent for utilisation, MiB for memory, …).

    ``constant``: ``base``. ``idle``: 0. ``daily``: a cosine day with its trough ``base`` and its
    ``peak`` at ``peak_hour`` (UTC). ``bursty``: ``base``, and once per ``every`` seconds a burst at
    ``peak`` lasting ``duration`` seconds, at a hash-chosen offset in each window. All add uniform
    noise of ± ``noise`` and are clipped to [``minimum``, ``maximum``].
    """

    kind: PatternKind
    base: float = 0.0
    peak: float = 0.0
    peak_hour: float = 14.0
    noise: float = 0.0
    every: float = 3600.0
    duration: float = 300.0
    minimum: float = 0.0
    maximum: float = math.inf


IDLE = Pattern("idle")


@lru_cache(maxsize=65536)
def entity_key(seed: int, entity: str) -> int:
    """64-bit key of an entity (``node/gpu/instance:field``) under a scenario seed."""
    digest = hashlib.blake2b(f"{seed}\0{entity}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def uniform(seed: int, entity: str, buckets: npt.NDArray[np.int64]) -> Array:
    """Deterministic uniform values in [0, 1), one per integer bucket (splitmix64)."""
    with np.errstate(over="ignore"):
        x = np.uint64(entity_key(seed, entity)) ^ (buckets.astype(np.uint64) * _GOLDEN)
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _MIX1
        x = (x ^ (x >> np.uint64(27))) * _MIX2
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def noise(seed: int, entity: str, t: Array) -> Array:
    """Uniform noise in [-1, 1), constant within each :data:`NOISE_BUCKET_S` bucket."""
    buckets = np.floor(t / NOISE_BUCKET_S).astype(np.int64)
    return uniform(seed, entity, buckets) * 2.0 - 1.0


def _daily_shape(p: Pattern, t: Array) -> Array:
    """0..1, 1 at ``peak_hour``."""
    phase = 2.0 * math.pi * (t / DAY_S - p.peak_hour / 24.0)
    return 0.5 + 0.5 * np.cos(phase)


def _burst_start(p: Pattern, seed: int, entity: str, window: npt.NDArray[np.int64]) -> Array:
    room = max(p.every - p.duration, 0.0)
    return window.astype(np.float64) * p.every + uniform(seed, f"{entity}#burst", window) * room


def mean(p: Pattern, *, seed: int, entity: str, t: Array) -> Array:
    """The pattern without noise or clipping."""
    if p.kind == "idle":
        return np.zeros_like(t)
    if p.kind == "constant":
        return np.full_like(t, p.base)
    if p.kind == "daily":
        return p.base + (p.peak - p.base) * _daily_shape(p, t)
    window = np.floor(t / p.every).astype(np.int64)
    start = _burst_start(p, seed, entity, window)
    inside = (t >= start) & (t < start + p.duration)
    return np.where(inside, p.peak, p.base)


def rounded(x: Array, decimals: int = 0) -> Array:
    """``np.round`` typed as float64 (what every published value goes through)."""
    return np.asarray(np.round(x, decimals), dtype=np.float64)


def evaluate(p: Pattern, *, seed: int, entity: str, t: Array, decimals: int = 3) -> Array:
    """The pattern's value at each time in ``t`` (noise and clipping included, rounded)."""
    value = mean(p, seed=seed, entity=entity, t=t)
    if p.noise:
        value = value + p.noise * noise(seed, entity, t)
    return rounded(np.clip(value, p.minimum, p.maximum), decimals)


def integral(p: Pattern, *, seed: int, entity: str, t0: float, t: Array) -> Array:
    """∫ mean(p) dt from ``t0`` to each ``t`` in closed form (for counters such as energy)."""
    span = t - t0
    if p.kind == "idle":
        return np.zeros_like(t)
    if p.kind == "constant":
        return p.base * span
    if p.kind == "daily":
        w = 2.0 * math.pi / DAY_S
        shift = 2.0 * math.pi * p.peak_hour / 24.0
        sin_part = (np.sin(w * t - shift) - math.sin(w * t0 - shift)) / w
        out: Array = p.base * span + (p.peak - p.base) * (0.5 * span + 0.5 * sin_part)
        return out
    origin = float(_bursty_cumulative(p, seed, entity, np.array([t0]))[0])
    return _bursty_cumulative(p, seed, entity, t) - origin


def _bursty_cumulative(p: Pattern, seed: int, entity: str, t: Array) -> Array:
    """∫ from 0 to t; each full window contributes the same, whatever its burst offset."""
    window = np.floor(t / p.every).astype(np.int64)
    per_window = p.base * p.every + (p.peak - p.base) * min(p.duration, p.every)
    start = _burst_start(p, seed, entity, window)
    in_burst = np.clip(t - start, 0.0, p.duration)
    partial = p.base * (t - window * p.every) + (p.peak - p.base) * in_burst
    return window.astype(np.float64) * per_window + partial
