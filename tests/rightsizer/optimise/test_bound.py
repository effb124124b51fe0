"""The lower bound is a bound: never above what the plan achieves, pinned GPUs counted only when pods
hold them, single-strategy nodes at the true bound for their pods (with the repack explained), and
the table printing each node's optimum gap when it is not zero."""

from __future__ import annotations

import random

from rightsizer.optimise.fleet import OptimiserSettings, optimise
from rightsizer.plan import build as planning
from rightsizer.plan import table
from rightsizer.plan.model import plan_from_dict, plan_to_dict
from tests.support.rightsizer.exact_node import random_node
from tests.support.rightsizer.fleetspec import Dev, Node, build


def test_idle_me_gpu_is_not_counted_in_the_bound() -> None:
    node = Node(
        "me",
        "H100 80GB",
        [
            [Dev("1g.10gb+me"), Dev("3g.40gb"), Dev("2g.20gb"), Dev("1g.10gb")],
            [Dev("1g.10gb", "a", 0.3, 1000)] + [Dev("1g.10gb")] * 6,
            [Dev("1g.10gb", "b", 0.3, 1000)] + [Dev("1g.10gb")] * 6,
        ],
    )
    analysis = build([node])
    fleet = optimise(analysis, settings=OptimiserSettings())
    (p,) = fleet.nodes
    assert p.changed and p.used_now == 2 and p.used_after == 1
    assert p.lower_bound == 1 == fleet.lower_bound
    plan = planning.build_plan(analysis, fleet, context=planning.PlanContext(window="7d", settings={}))
    text = table.plan_table(plan)
    assert "GPUs in use 2 → 1 of 3 (LP lower bound 1 with pods on their nodes: gap 0)" in text
    assert "gap:" not in text


def test_bound_never_exceeds_what_the_plan_achieves() -> None:
    rng = random.Random(7)
    nodes = [random_node(rng, f"n{i}") for i in range(30)]
    fleet = optimise(build(nodes), settings=OptimiserSettings())
    for p in fleet.nodes:
        assert p.lower_bound <= p.used_after, p.node.name
    assert fleet.lower_bound <= sum(p.used_after for p in fleet.nodes)
    assert any(p.changed and p.lower_bound == p.used_after for p in fleet.nodes)


def test_single_strategy_reports_the_true_bound_and_the_repack() -> None:
    gpus = [
        [Dev("1g.10gb", f"p{i}-{k}", 0.1, 2000) for k in range(2)] + [Dev("1g.10gb")] * 5 for i in range(3)
    ]
    analysis = build([Node("s1", "H100 80GB", gpus, strategy="single")])
    fleet = optimise(analysis, settings=OptimiserSettings())
    (p,) = fleet.nodes
    # Six 1g pods fit one GPU of 1g.10gb×7, but only draining them lets the device plugin repack.
    assert not p.changed and p.used_now == 3 and p.lower_bound == 1
    assert "a repack would free 2 GPU(s)" in p.reason and "device plugin" in p.reason
    plan = planning.build_plan(analysis, fleet, context=planning.PlanContext(window="7d", settings={}))
    (n,) = plan.nodes
    assert n.gap == 2 and n.lower_bound_gpus == 1 and n.gpus_in_use == 3
    text = table.plan_table(plan)
    assert "gap: s1 uses 3 GPU(s) after the plan, lower bound 1 (2 above): a repack would free 2" in text


def test_new_node_fields_round_trip_and_older_plans_still_load() -> None:
    gpus = [
        [Dev("1g.10gb", f"p{i}-{k}", 0.1, 2000) for k in range(2)] + [Dev("1g.10gb")] * 5 for i in range(3)
    ]
    analysis = build([Node("s1", "H100 80GB", gpus, strategy="single")])
    fleet = optimise(analysis, settings=OptimiserSettings())
    plan = planning.build_plan(analysis, fleet, context=planning.PlanContext(window="7d", settings={}))
    data = plan_to_dict(plan)
    again = plan_from_dict(data)
    assert again.nodes[0].gap == 2 and again.nodes[0].reason == plan.nodes[0].reason
    for key in ("gpus_in_use", "lower_bound_gpus", "reason"):
        del data["nodes"][0][key]
    old = plan_from_dict(data)
    assert old.nodes[0].gap == 0 and old.nodes[0].reason == ""


def test_strategy_change_is_recommended_where_mixed_frees_more() -> None:
    # Three busy 2g pods and one idle one: every uniform layout needs 2 GPUs (2g×3 per GPU), the
    # mixed strategy puts 2g×3 + 1g on one GPU.
    gpus = [
        [Dev("2g.20gb", f"busy-{k}", 0.5, 1000) for k in range(3)],
        [Dev("2g.20gb", "idle", 0.0, 500), Dev("2g.20gb"), Dev("2g.20gb")],
    ]
    analysis = build([Node("s", "H100 80GB", gpus, strategy="single")])
    plain = optimise(analysis, settings=OptimiserSettings())
    assert plain.nodes[0].strategy_change is None and not plain.nodes[0].changed
    fleet = optimise(analysis, settings=OptimiserSettings(allow_strategy_change=True))
    (p,) = fleet.nodes
    assert not p.changed  # the single-strategy answer itself does not change
    mixed = p.strategy_change
    assert mixed is not None and mixed.gpus_freed == 1
    plan = planning.build_plan(analysis, fleet, context=planning.PlanContext(window="7d", settings={}))
    (sc,) = plan.strategy_changes
    assert (sc.node, sc.strategy, sc.gpus_freed, sc.single_gpus_freed, sc.pods_disrupted) == (
        "s",
        "mixed",
        1,
        0,
        4,
    )
    assert [g.mig_enabled for g in sc.proposed].count(False) == 1
    assert sc.config_name.startswith("gpupilot-") and sc.config_name in sc.config_document["mig-configs"]
    # A recommendation only: the node stays unchanged for apply, and the plan round-trips.
    assert (
        not plan.nodes[0].changed
        and plan_from_dict(plan_to_dict(plan)).strategy_changes == plan.strategy_changes
    )
    text = table.plan_table(plan)
    assert "strategy change: s (H100 80GB) to the mixed strategy frees 1 GPU(s)" in text
    assert "not applied by 'apply'" in text
