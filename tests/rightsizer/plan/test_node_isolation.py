"""One node never stops the plan: a node whose change fails the plan's pods-fit check, or whose
proposal fails the optimiser's own checks, is left as it is with a note; the rest of the fleet is
planned, and no message asks the user to report a bug."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rightsizer.optimise import fleet as fleet_mod
from rightsizer.optimise.fleet import OptimiserSettings, optimise
from rightsizer.optimise.proposal import GpuPlan, NodeInconsistency
from rightsizer.plan import build as planning
from tests.support.rightsizer.fleetspec import Dev, Node, build


def balanced(pod: str) -> list[Dev]:
    return [Dev("3g.40gb", pod, 0.05, 1000), Dev("2g.20gb"), Dev("1g.10gb"), Dev("1g.10gb")]


NODES = [Node(name, "H100 80GB", [balanced(f"{name}-a"), balanced(f"{name}-b")]) for name in ("good", "bad")]


def test_a_node_failing_the_pods_fit_check_is_left_alone() -> None:
    analysis = build(NODES)
    fleet = optimise(analysis, settings=OptimiserSettings())
    assert all(p.changed for p in fleet.nodes)

    # Break 'bad': its proposed layouts lose the 1g slots its pods are given.
    def broken(p):
        gpus = tuple(
            GpuPlan(g.index, g.mig_enabled, {"7g.80gb": 1} if g.items else {}, g.items) for g in p.proposed
        )
        return replace(p, proposed=gpus)

    nodes = [broken(p) if p.node.name == "bad" else p for p in fleet.nodes]
    plan = planning.build_plan(
        analysis, replace(fleet, nodes=tuple(nodes)), context=planning.PlanContext(window="7d", settings={})
    )
    by_name = {n.name: n for n in plan.nodes}
    assert by_name["good"].changed and not by_name["bad"].changed
    assert by_name["bad"].proposed == by_name["bad"].current and not by_name["bad"].pods_disrupted
    note = next(n for n in plan.notes if n.startswith("bad: left unchanged"))
    assert "nvidia.com/mig-1g.10gb" in note and "report" not in note
    assert plan.totals.nodes_changed == 1


def test_a_node_failing_the_optimisers_check_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    real = fleet_mod.propose_node

    def failing(node, analysis, **kw):
        if node.name == "bad":
            raise NodeInconsistency("bad GPU 0: proposed layout has no placement: test")
        return real(node, analysis, **kw)

    monkeypatch.setattr(fleet_mod, "propose_node", failing)
    analysis = build(NODES)
    fleet = optimise(analysis, settings=OptimiserSettings())
    by_name = {p.node.name: p for p in fleet.nodes}
    assert by_name["good"].changed and not by_name["bad"].changed
    assert by_name["bad"].reason.startswith("left unchanged: the optimiser's check failed (bad GPU 0")
    plan = planning.build_plan(analysis, fleet, context=planning.PlanContext(window="7d", settings={}))
    assert any(n.startswith("bad: left unchanged") for n in plan.notes)
