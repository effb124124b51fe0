"""A slice grows only when its pod's peak does not fit it, or when the pod's namespace asks to grow
for headroom; the plan says why for every slice that grows and every one kept though the headroom
alone would grow it."""

from __future__ import annotations

from rightsizer.optimise.fleet import OptimiserSettings, optimise
from rightsizer.plan import build as planning
from tests.support.rightsizer.fleetspec import Dev, Node, build


def _fleet() -> list[Node]:
    # Each node frees a GPU however its big pod is sized, so both change. 'fits' peaks at 94 % of
    # its 4g.40gb (with 20 % headroom it would need all 7 slices); 'over' peaks above its 2g's memory.
    def one(pod: str) -> list[Dev]:
        return [Dev("1g.10gb", pod, 0.5, 1000)] + [Dev("1g.10gb")] * 6

    return [
        Node("a", "H100 80GB", [[Dev("4g.40gb", "fits", 0.94, 20_000), Dev("3g.40gb")], one("x"), one("z")]),
        Node(
            "b",
            "H100 80GB",
            [[Dev("2g.20gb", "over", 0.3, 21_000), Dev("2g.20gb"), Dev("2g.20gb")], one("y"), one("w")],
        ),
    ]


def _plan(settings: OptimiserSettings) -> tuple[dict[str, str], tuple[str, ...]]:
    analysis = build(_fleet())
    fleet = optimise(analysis, settings=settings)
    assert all(p.changed for p in fleet.nodes)
    plan = planning.build_plan(
        analysis, fleet, context=planning.PlanContext(window="7d", settings={"headroom": 0.2})
    )
    served = {
        "/".join(str(p) for p in it.pods): it.klass for p in fleet.nodes for g in p.proposed for it in g.items
    }
    return served, plan.notes


def test_a_pod_whose_peak_fits_keeps_its_slice_and_the_plan_says_why() -> None:
    served, notes = _plan(OptimiserSettings())
    assert served["ns/fits"] == "4g.40gb"
    kept = [n for n in notes if "(ns/fits): keeps its slice" in n]
    assert len(kept) == 1 and "peak 94% of its 4 compute slice(s)" in kept[0]
    assert (
        "with 20% headroom" in kept[0]
        and "would need 7g.80gb" in kept[0]
        and "--grow-for-headroom" in kept[0]
    )
    # A peak beyond the slice (21,000 MiB on a 2g.20gb) grows it, and the plan says so.
    assert served["ns/over"] in ("3g.40gb", "4g.40gb")
    assert any("(ns/over): grows to" in n and "does not fit 2g.20gb" in n for n in notes)


def test_a_namespace_that_asks_grows_for_headroom() -> None:
    served, notes = _plan(OptimiserSettings(grow_for_headroom=("ns",)))
    assert served["ns/fits"] == "7g.80gb"
    assert any("(ns/fits): grows to 7g.80gb for 20% headroom (--grow-for-headroom)" in n for n in notes)
    other, _ = _plan(OptimiserSettings(grow_for_headroom=("elsewhere",)))
    assert other["ns/fits"] == "4g.40gb"
    everyone, _ = _plan(OptimiserSettings(grow_for_headroom=("*",)))
    assert everyone["ns/fits"] == "7g.80gb"


def test_a_starved_slice_on_a_node_that_changes_nothing_is_named() -> None:
    analysis = build(
        [Node("c", "H100 80GB", [[Dev("2g.20gb", "over", 0.3, 21_000), Dev("2g.20gb"), Dev("2g.20gb")]])]
    )
    fleet = optimise(analysis, settings=OptimiserSettings())
    assert not fleet.nodes[0].changed
    plan = planning.build_plan(analysis, fleet, context=planning.PlanContext(window="7d", settings={}))
    assert any(
        "(ns/over): its peak" in n and "does not fit 2g.20gb, but its node frees nothing" in n
        for n in plan.notes
    )
