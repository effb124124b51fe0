"""``--allow-moves`` over the whole fleet: the exact fleet optimum on small random fleets (checked
against an independent position-based MILP), a printed LP bound that never exceeds it, nodes each
optimal on their own combined, the fewest pods disrupted among optimal plans, --max-nodes kept,
pods holding several devices never split across nodes."""

from __future__ import annotations

import random

import pytest

from mig_geometry.catalogue import find_model
from rightsizer.analysis.types import Analysis
from rightsizer.optimise import consolidate
from rightsizer.optimise.fleet import OptimiserSettings, items_for_node, optimise
from rightsizer.optimise.node import is_pinned
from rightsizer.plan import build as planning
from rightsizer.plan import table
from tests.support.rightsizer.exact_fleet import fewest_gpus
from tests.support.rightsizer.exact_node import random_node
from tests.support.rightsizer.fleetspec import Dev, Node, build

H100 = find_model("H100 80GB")
assert H100 is not None


def exact_optimum(analysis: Analysis, *, keep_profiles: bool) -> int:
    """GPUs holding pods in the fleet's best plan: pinned GPUs that hold pods, plus the fewest pool
    GPUs carrying every pool device at its class (no device here needs more than it has)."""
    settings = OptimiserSettings(keep_profiles=keep_profiles)
    workloads = {p: w for w in analysis.workloads for p in w.pods}
    pinned_used, pool, classes = 0, 0, []
    for node in analysis.nodes:
        pinned = {g.index for g in node.gpus if is_pinned(g, analysis, node.name)}
        for g in node.gpus:
            if g.index not in pinned:
                pool += 1
            elif any(d.pods for d in analysis.devices_on(node.name) if d.gpu == g.index):
                pinned_used += 1
        items = items_for_node(node, analysis, settings=settings, workloads=workloads)
        classes += [it.klass for it in items if it.gpu not in pinned]
    assert H100 is not None
    return pinned_used + fewest_gpus(H100, pool, classes, exact=keep_profiles)


def plan_text(analysis: Analysis, settings: OptimiserSettings) -> tuple[int, str]:
    fleet = optimise(analysis, settings=settings)
    plan = planning.build_plan(analysis, fleet, context=planning.PlanContext(window="7d", settings={}))
    return plan.totals.gpus_needed, table.plan_table(plan)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(5))
def test_moves_reach_the_exact_fleet_optimum_and_the_bound_never_exceeds_it(seed: int) -> None:
    rng = random.Random(seed)
    analysis = build([random_node(rng, f"n{i}") for i in range(4)])
    for keep in (False, True):
        settings = OptimiserSettings(allow_moves=True, keep_profiles=keep)
        fleet = optimise(analysis, settings=settings)
        optimum = exact_optimum(analysis, keep_profiles=keep)
        assert fleet.lower_bound <= optimum == sum(p.used_after for p in fleet.nodes), (seed, keep)
        needed, text = plan_text(analysis, settings)
        assert needed == optimum  # the plan's own check keeps every change
        assert (
            f"LP lower bound {fleet.lower_bound} over the fleet, pods moving: gap {optimum - fleet.lower_bound}"
            in text
        )
        # Pods kept on their nodes never do better, and the bound of moves bounds them too.
        alone = optimise(analysis, settings=OptimiserSettings(keep_profiles=keep))
        assert alone.moves_bound == fleet.lower_bound <= optimum <= sum(p.used_after for p in alone.nodes)


def _gpu(prefix: str, pods: int, rest: int = 7) -> list[Dev]:
    return [Dev("1g.10gb", f"{prefix}{k}", 0.5, 1000) for k in range(pods)] + [Dev("1g.10gb")] * (rest - pods)


def test_nodes_optimal_on_their_own_are_combined() -> None:
    # Each node holds 3 busy 1g pods on one GPU: optimal alone, yet the six fit one GPU together.
    # (Pooling only the nodes a plan changes never combined them.)
    analysis = build([Node(n, "H100 80GB", [_gpu(n, 3)]) for n in "ab"])
    alone = optimise(analysis, settings=OptimiserSettings())
    assert not any(p.changed for p in alone.nodes) and sum(p.used_after for p in alone.nodes) == 2
    needed, text = plan_text(analysis, OptimiserSettings(allow_moves=True))
    assert needed == 1
    assert (
        "LP lower bound 2 with pods on their nodes: gap 0; 1 over the fleet with --allow-moves"
        in plan_text(analysis, OptimiserSettings())[1]
    )
    assert "LP lower bound 1 over the fleet, pods moving: gap 0" in text


def test_fewest_pods_disrupted_among_optimal_plans() -> None:
    # Two nodes with one busy 1g pod each and one with five on a 1g×7 GPU: one GPU suffices. The
    # pods of a and b move into c's free slots (2 restarts); c keeps its layout and its pods.
    analysis = build(
        [
            Node("a", "H100 80GB", [_gpu("a", 1)]),
            Node("b", "H100 80GB", [_gpu("b", 1)]),
            Node("c", "H100 80GB", [_gpu("c", 5)]),
        ]
    )
    fleet = optimise(analysis, settings=OptimiserSettings(allow_moves=True))
    plan = planning.build_plan(analysis, fleet, context=planning.PlanContext(window="7d", settings={}))
    assert plan.totals.gpus_needed == 1 and plan.totals.pods_disrupted == 2
    c = plan.node("c")
    assert c is not None and not c.changed and len(c.pods_kept) == 5
    moved = {p.name: p.targets for n in plan.nodes for p in n.pods_disrupted}
    assert set(moved) == {"a0", "b0"} and all(t.node == "c" for ts in moved.values() for t in ts)


def test_max_nodes_bounds_the_changes() -> None:
    analysis = build([Node(n, "H100 80GB", [_gpu(n, 2), _gpu(f"{n}x", 1)]) for n in "abcd"])
    free = optimise(analysis, settings=OptimiserSettings(allow_moves=True))
    capped = optimise(analysis, settings=OptimiserSettings(allow_moves=True, max_nodes=2))
    assert sum(p.changed for p in capped.nodes) <= 2 < sum(p.changed for p in free.nodes)
    assert free.lower_bound == capped.lower_bound <= sum(p.used_after for p in free.nodes)
    assert sum(p.used_after for p in free.nodes) <= sum(p.used_after for p in capped.nodes)
    assert any("--max-nodes 2" in n for n in capped.notes)


def test_a_pod_holding_two_devices_is_not_split_across_nodes() -> None:
    two = [Dev("1g.10gb", "pair", 0.5, 1000), Dev("1g.10gb", "pair", 0.5, 1000)] + [Dev("1g.10gb")] * 5
    analysis = build([Node("a", "H100 80GB", [two]), Node("b", "H100 80GB", [_gpu("b", 1)])])
    fleet = optimise(analysis, settings=OptimiserSettings(allow_moves=True))
    a = next(p for p in fleet.nodes if p.node.name == "a")
    assert consolidate.candidate(a, analysis).repack is None  # its pod holds two devices
    placed = {
        (it.node, g.index)
        for p in fleet.nodes
        for g in p.proposed
        for it in g.items
        if "pair" in str(it.pods)
    }
    assert {node for node, _ in placed} == {"a"}
    assert sum(p.used_after for p in fleet.nodes) == 1  # b's pod joins the pair's GPU
