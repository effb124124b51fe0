"""Work that must grow with the fleet, not with its square: a plan of 10,000 nodes took 47 minutes
of plan building when each node scanned every device of the fleet (measured in ``bench.scale``;
these tests count scans, never time)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace

import pytest

from bench.rightsizer import synthesise
from mig_geometry.catalogue import find_model
from rightsizer.analysis.types import DeviceStats
from rightsizer.optimise import packing
from rightsizer.optimise.fleet import OptimiserSettings, optimise
from rightsizer.plan import build as planning


class _Counted(tuple[DeviceStats, ...]):
    """A tuple that counts how often it is walked."""

    walks = 0

    def __iter__(self) -> Iterator[DeviceStats]:
        type(self).walks += 1
        return super().__iter__()


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [20, 60])
def test_building_a_plan_walks_the_devices_a_fixed_number_of_times(nodes: int) -> None:
    analysis = synthesise(nodes, 7)
    fleet = optimise(analysis, settings=OptimiserSettings())
    assert sum(p.changed for p in fleet.nodes) >= nodes // 4  # something to plan
    _Counted.walks = 0
    counted = replace(analysis, devices=_Counted(analysis.devices))
    plan = planning.build_plan(counted, fleet, context=planning.PlanContext(window="14d", settings={}))
    assert len(plan.nodes) == nodes
    assert sum(len(n.evidence) for n in plan.nodes) == len(analysis.devices)
    assert 1 <= _Counted.walks <= 3, _Counted.walks  # once per index, never once per node


@pytest.mark.parametrize("key", ["A100 40GB", "H100 80GB", "H200"])
def test_the_slice_bound_never_exceeds_the_lp_bound(key: str) -> None:
    """The optimiser skips the LP when greedy meets the slice bound; that is only right if the slice
    bound is a bound the LP's meets or beats."""
    model = find_model(key)
    assert model is not None
    profiles = [p.name for p in packing.plain_profiles(model)]
    rng = random.Random(key)
    for _ in range(60):
        demand = {p: rng.randrange(0, 5) for p in rng.sample(profiles, k=min(3, len(profiles)))}
        assert packing.slice_lower_bound(model, demand) <= packing.lp_lower_bound(model, demand, gpus=40)
