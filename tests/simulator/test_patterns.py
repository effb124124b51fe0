"""Patterns: deterministic, pure functions of (seed, entity, time), within their ranges; integrals."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import patterns
from simulator.patterns import Pattern

T0 = 1_796_000_000.0
DAY = np.arange(T0, T0 + 86400, 15.0)
DAILY = Pattern("daily", base=20, peak=90, peak_hour=15, noise=5, maximum=100)
BURSTY = Pattern("bursty", base=10, peak=95, every=3600, duration=600, noise=2, maximum=100)


@pytest.mark.parametrize(
    "p", [DAILY, BURSTY, Pattern("constant", base=50, noise=10, maximum=100), patterns.IDLE]
)
def test_values_stay_in_range_and_repeat(p: Pattern) -> None:
    v = patterns.evaluate(p, seed=1, entity="n/0:util", t=DAY)
    assert v.min() >= 0 and v.max() <= 100
    again = patterns.evaluate(p, seed=1, entity="n/0:util", t=DAY)
    assert np.array_equal(v, again)


def test_a_single_time_equals_the_same_time_in_a_long_array() -> None:
    whole = patterns.evaluate(DAILY, seed=3, entity="x", t=DAY)
    for i in (0, 17, 4000, len(DAY) - 1):
        one = patterns.evaluate(DAILY, seed=3, entity="x", t=np.array([DAY[i]]))
        assert one[0] == whole[i]


def test_seed_and_entity_change_the_noise_only() -> None:
    a = patterns.evaluate(DAILY, seed=1, entity="a", t=DAY)
    b = patterns.evaluate(DAILY, seed=2, entity="a", t=DAY)
    c = patterns.evaluate(DAILY, seed=1, entity="b", t=DAY)
    assert not np.array_equal(a, b) and not np.array_equal(a, c)
    assert abs(float(a.mean()) - float(b.mean())) < 1.0


def test_daily_peaks_at_its_hour_and_troughs_twelve_hours_later() -> None:
    quiet = Pattern("daily", base=20, peak=90, peak_hour=15)
    hours = (DAY % 86400) / 3600
    v = patterns.evaluate(quiet, seed=0, entity="x", t=DAY)
    assert float(v[np.argmin(np.abs(hours - 15))]) == pytest.approx(90, abs=0.01)
    assert float(v[np.argmin(np.abs(hours - 3))]) == pytest.approx(20, abs=0.01)


def test_bursty_has_exactly_one_burst_per_window() -> None:
    v = patterns.mean(BURSTY, seed=5, entity="x", t=DAY)
    high = v == 95
    windows = np.floor(DAY / 3600)
    for w in np.unique(windows)[1:-1]:
        assert high[windows == w].sum() * 15 == 600


def test_noise_is_uniform_ish_and_bucketed() -> None:
    n = patterns.noise(9, "x", DAY)
    assert n.min() >= -1 and n.max() < 1 and abs(float(n.mean())) < 0.05
    b0 = 15.0 * 119_733_334  # a bucket boundary
    assert patterns.noise(9, "x", np.array([b0]))[0] == patterns.noise(9, "x", np.array([b0 + 14.9]))[0]
    assert patterns.noise(9, "x", np.array([b0]))[0] != patterns.noise(9, "x", np.array([b0 + 15.0]))[0]


@pytest.mark.parametrize("p", [DAILY, BURSTY, Pattern("constant", base=42)])
def test_integral_matches_numeric_integration(p: Pattern) -> None:
    t = np.arange(T0, T0 + 2 * 86400 + 1, 1.0)
    numeric = float(np.sum(patterns.mean(p, seed=4, entity="x", t=t[:-1])))
    closed = float(patterns.integral(p, seed=4, entity="x", t0=T0, t=np.array([t[-1]]))[0])
    assert closed == pytest.approx(numeric, rel=2e-3)
