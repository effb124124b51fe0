"""The vectorised replay against the replay engine: the same replicas at every step and the same
bound figures, for random configurations (behaviour or none, policies, windows, tolerance, bounds,
a start-up delay), with a backlog, recorded noise on the metrics and a missing-pods rebalancing on
the way."""

from __future__ import annotations

import numpy as np
import pytest

from adapter.hpa import replay
from adapter.hpa.recommend import capacity, kernel
from adapter.hpa.recommend.model import Bound, MetricModel, ModelledLoad, ServiceModel
from adapter.hpa.timeline import Timeline
from hpa_controller import decide as hpa

STEPS = 900


def _model(rng: np.random.Generator, startup: float) -> ServiceModel:
    t = np.arange(STEPS) * 15.0
    demand = 40 + 30 * np.sin(t / 2000) + np.where((t // 1800) % 4 == 1, 35.0, 0.0) + rng.normal(0, 3, STEPS)
    x = rng.uniform(0.5, 9.5, 3000)
    queue = capacity.fit("q", x, (x / 10) ** 3 * 8 * (1 + rng.normal(0, 0.05, 3000)))
    kv = capacity.fit("kv", x, 0.05 + 0.09 * x * (1 + rng.normal(0, 0.02, 3000)))
    wait = (x / 10) ** 4 * 5 * (1 + rng.normal(0, 0.05, 3000))
    specs = (
        hpa.MetricSpec("Pods", "q", "AverageValue", 3.0),
        hpa.MetricSpec("Pods", "kv", "AverageValue", 0.7),
    )
    return ServiceModel(
        15.0,
        np.maximum(demand, 0.0),
        10.0,
        (
            MetricModel(specs[0], queue, queue=True, noise=rng.uniform(-0.05, 0.05, STEPS)),
            MetricModel(specs[1], kv, noise=rng.uniform(-0.02, 0.02, STEPS)),
        ),
        Bound("w", True, 2.0, 0.01),
        capacity.fit("w", x, wait),
        capacity.fit_exceedance("w", x, wait, bound=2.0, upper=True),
        None,
        startup=startup,
        x_fitted=9.5,
    )


def _candidate(rng: np.random.Generator) -> hpa.HpaModel:
    metrics = (
        hpa.MetricSpec("Pods", "q", "AverageValue", float(rng.choice([1.5, 3, 5, 8]))),
        hpa.MetricSpec("Pods", "kv", "AverageValue", float(rng.choice([0.6, 0.7, 0.8, 0.85]))),
    )
    behaviour = None
    if rng.random() >= 0.2:

        def policies(limit: int) -> tuple[hpa.Policy, ...]:
            return tuple(
                hpa.Policy(
                    str(rng.choice(["Pods", "Percent"])),
                    int(rng.integers(1, limit)),
                    int(rng.choice([15, 30, 60, 120, 300])),
                )
                for _ in range(int(rng.integers(1, 3)))
            )

        up, down = policies(300), policies(150)
        # the controller forgets a direction's scale events older than that direction's longest
        # period (storeScaleEvent): the kernel is exact where both directions' longest periods match
        longest = max(p.period_seconds for p in up + down)
        up = (*up[:-1], hpa.Policy(up[-1].kind, up[-1].value, longest))
        down = (*down[:-1], hpa.Policy(down[-1].kind, down[-1].value, longest))
        behaviour = hpa.Behavior(
            hpa.scale_up_rules(
                stabilization_seconds=int(rng.choice([0, 30, 60, 180])),
                select_policy=str(rng.choice(["Max", "Min", "Max"])),
                policies=up,
            ),
            hpa.scale_down_rules(
                stabilization_seconds=int(rng.choice([0, 60, 300, 600])),
                select_policy=str(rng.choice(["Max", "Min", "Disabled", "Max"])),
                policies=down,
            ),
        )
    lo = int(rng.integers(1, 4))
    return hpa.HpaModel(
        lo, int(rng.integers(lo + 1, 20)), metrics, behaviour, tolerance=float(rng.choice([0.1, 0.05, 0.0]))
    )


@pytest.mark.slow
@pytest.mark.parametrize(("seed", "startup"), [(1, 120.0), (2, 45.0), (3, 0.0)])
def test_kernel_replays_each_candidate_as_the_engine_does(seed: int, startup: float) -> None:
    rng = np.random.default_rng(seed)
    model = _model(rng, startup)
    candidates = [_candidate(rng) for _ in range(12)]
    first = int(rng.integers(1, 12))
    days = (np.arange(STEPS) // 300).astype(np.int64)
    res = kernel.run(model, candidates, first=first, days=days, trace=True)
    assert res.trace is not None
    line = Timeline(
        list(np.arange(STEPS) * 15.0), [[] for _ in range(STEPS)], [first] + [None] * (STEPS - 1), "", []
    )
    moved = 0
    for c, candidate in enumerate(candidates):
        result = replay.replay(
            candidate, line, label="x", startup=startup, load=ModelledLoad(model, candidate)
        )
        replicas = np.array([s.replicas for s in result.steps])
        assert np.array_equal(replicas, res.trace[c]), (c, int(np.argmax(replicas != res.trace[c])))
        broken = np.bincount(days, weights=np.array([s.broken for s in result.steps]))
        assert np.allclose(broken, res.broken[c])
        assert res.replica_steps[c].sum() == replicas.sum()
        moved += int(np.ptp(replicas) > 0)
    assert moved >= len(candidates) // 2, "most candidates should scale: the trace would test little"


def test_candidates_must_share_their_metrics() -> None:
    rng = np.random.default_rng(0)
    model = _model(rng, 0.0)
    one = _candidate(rng)
    other = hpa.HpaModel(1, 5, one.metrics[:1])
    with pytest.raises(ValueError, match="same metrics"):
        kernel.run(model, [one, other], first=2, days=np.zeros(STEPS, dtype=np.int64))
