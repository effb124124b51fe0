"""recommend-hpa's model pieces: the bound's grammar, demand recovered from served, rejected and
queued requests, the start-up delay and capacity, the curve chosen per signal, the exceedance
share, gaps and NaN refused or bridged, and the days held out."""

from __future__ import annotations

import numpy as np
import pytest

from adapter.errors import ConfigError
from adapter.hpa.recommend import bound, capacity, demand, history, output, search
from hpa_controller import decide as hpa


@pytest.mark.parametrize(
    ("text", "name", "matchers", "upper", "value"),
    [
        (
            'inference_queue_wait_seconds{quantile="0.95"} <= 2',
            "inference_queue_wait_seconds",
            ('quantile="0.95"',),
            True,
            2.0,
        ),
        ("inference_queue_wait_seconds:p95<=2.5", "inference_queue_wait_seconds:p95", (), True, 2.5),
        ('ok_ratio{a="x,y", b=~"c.*"} >= 0.99', "ok_ratio", ('a="x,y"', 'b=~"c.*"'), False, 0.99),
    ],
)
def test_bounds_parse(text: str, name: str, matchers: tuple[str, ...], upper: bool, value: float) -> None:
    spec = bound.parse(text, budget="1%")
    assert (spec.name, spec.matchers, spec.bound.upper, spec.bound.value, spec.bound.budget) == (
        name,
        matchers,
        upper,
        value,
        0.01,
    )
    inner = ", ".join((*matchers, 'namespace="ai"'))
    assert spec.query("ai") == f"max by (pod) ({name}{{{inner}}})"


@pytest.mark.parametrize(
    ("text", "budget", "expected"),
    [
        ("queue < ", "1%", "expected SELECTOR OP NUMBER"),
        ("queue <= lots", "1%", "'lots' is not a number"),
        ("queue <= inf", "1%", "must be a finite number"),
        ("queue{pod} <= 3", "1%", "'pod' is not a label matcher"),
        ("queue <= 3", "100%", "--bound-budget '100%': must be at least 0 % and below 100 %"),
        ("queue <= 3", "some", "--bound-budget 'some': expected a percentage"),
    ],
)
def test_bad_bounds_are_one_line(text: str, budget: str, expected: str) -> None:
    with pytest.raises(ConfigError) as exc:
        bound.parse(text, budget=budget)
    assert expected in str(exc.value) and "\n" not in str(exc.value)


def test_demand_is_served_plus_rejected_plus_queue_growth() -> None:
    step = 15.0
    n = 200
    ready = np.full(n, 4, dtype=np.int64)
    offered = 30 + 10 * np.sin(np.arange(n) / 20)
    queued = np.cumsum(np.where(np.arange(n) > 100, 2.0, 0.0)) * step  # grows by 2 req/s after step 100
    served = offered - np.where(np.arange(n) > 100, 2.0, 0.0) - 1.0
    rejected = np.ones(n)
    d = demand.recover(
        step=step,
        served=served,
        rejected=rejected,
        queued=queued,
        ready=ready,
        recorded=ready,
        max_replicas=8,
    )
    assert np.allclose(d.offered[5:99], offered[5:99])
    assert np.allclose(d.offered[103:-2], offered[103:-2])
    assert d.saturated[120] and d.censored[120]
    assert np.allclose(d.per_replica[10], offered[10] / 4)


def test_capacity_is_what_saturated_replicas_serve() -> None:
    n = 400
    ready = np.full(n, 2, dtype=np.int64)
    served = np.where(np.arange(n) < 200, 10.0, 20.0)  # 10 req/s per pod once saturated
    rejected = np.where(np.arange(n) < 200, 0.0, 3.0)
    d = demand.recover(
        step=15.0, served=served, rejected=rejected, queued=None, ready=ready, recorded=ready, max_replicas=9
    )
    assert d.capacity == pytest.approx(10.0)
    calm = demand.recover(
        step=15.0, served=served, rejected=None, queued=None, ready=ready, recorded=ready, max_replicas=9
    )
    assert calm.capacity is None


def test_startup_delay_is_the_median_time_to_ready_after_a_rise() -> None:
    times = np.arange(40, dtype=np.float64) * 15.0
    recorded = np.array([2] * 10 + [4] * 15 + [3] * 5 + [5] * 10, dtype=np.int64)
    ready = np.array([2] * 18 + [4] * 12 + [3] * 2 + [5] * 8, dtype=np.int64)
    delay, events = demand.startup_delay(times, recorded, ready)
    assert events == 2 and delay == pytest.approx((8 * 15 + 2 * 15) / 2)


def test_additive_rates_get_a_line_and_queues_a_curve() -> None:
    rng = np.random.default_rng(4)
    x = rng.uniform(1, 9, 3000)
    rate = capacity.fit("served", x, x * (1 + rng.normal(0, 0.01, 3000)))
    queue = capacity.fit("queue", x, (x / 10) ** 4 * 20 * (1 + rng.normal(0, 0.05, 3000)))
    assert rate.kind == "linear" and queue.kind == "curve"
    assert rate(np.array([12.0]))[0] == pytest.approx(12.0, rel=0.02)  # a line extrapolates
    grid = np.linspace(1, 9, 50)
    assert np.all(np.diff(queue(grid)) >= -1e-12), "a fitted curve never decreases"
    assert queue(np.array([8.0]))[0] == pytest.approx((0.8**4) * 20, rel=0.08)
    with pytest.raises(capacity.FitError, match="at least 50"):
        capacity.fit("few", x[:10], x[:10])


def test_exceedance_is_the_share_broken_at_each_load() -> None:
    rng = np.random.default_rng(5)
    x = rng.uniform(0, 10, 20000)
    y = x + rng.normal(0, 1, 20000)
    ex = capacity.fit_exceedance("y", x, y, bound=7.0, upper=True)
    assert ex(np.array([3.0]))[0] < 0.01 and ex(np.array([9.5]))[0] > 0.97
    assert ex(np.array([7.0]))[0] == pytest.approx(0.5, abs=0.08)
    assert np.all(np.diff(ex.shares) >= 0)


def test_short_gaps_are_bridged_and_long_ones_named() -> None:
    times = np.arange(100, dtype=np.float64) * 15.0 + 1.8e9
    a = np.arange(100, dtype=np.float64)
    a[10:14] = np.nan
    series = {"the served requests": a}
    filled = history._bridge(series, times, recorded=np.zeros(100, dtype=np.int64), max_gap=120.0)
    assert filled == 4 and np.all(series["the served requests"][10:14] == 9.0)
    b = np.arange(100, dtype=np.float64)
    b[20:40] = np.nan
    with pytest.raises(ConfigError) as exc:
        history._bridge(
            {"the served requests": b}, times, recorded=np.zeros(100, dtype=np.int64), max_gap=120.0
        )
    assert "gap of 5m in the served requests, from 2027-01-15T08:05:00Z" in str(exc.value)
    assert "--max-gap 5m" in str(exc.value)


def test_non_finite_samples_stop_the_run_naming_pod_and_time() -> None:
    with pytest.raises(ConfigError) as exc:
        history._refuse_non_finite([({"pod": "p-1"}, 1.8e9 + 30, float("nan"))], what="--queue q")
    assert str(exc.value).startswith(
        "--queue q: 1 sample(s) are nan, the first of pod p-1 at 2027-01-15T08:00:30Z"
    )


def test_the_last_days_are_held_out() -> None:
    times = 1.8e9 + np.arange(0, 7 * 86400 + 1, 15.0)
    days = search.split(times, held_out=2)
    assert len(days.steps) == 7 and list(days.held_out) == [False] * 5 + [True] * 2
    assert days.steps.sum() == len(times) and days.index[0] == 0 and days.index[-1] == 6


def test_a_utilization_target_comes_with_its_average_value_equivalent() -> None:
    model = hpa.HpaModel(1, 5, (hpa.MetricSpec("Resource", "cpu", "Utilization", 70.0),))
    notes = output.utilization_notes(None, model, {"cpu": 4000})  # type: ignore[arg-type]
    assert notes == [
        "cpu Utilization 70 % moves with the pods' requests (now 4): the same point as an AverageValue target is 2800m"
    ]
    assert output.utilization_notes(None, hpa.HpaModel(1, 5, ()), {}) == []  # type: ignore[arg-type]
