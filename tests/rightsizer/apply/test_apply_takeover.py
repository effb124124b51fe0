"""In-flight work belongs to the cluster: a plain `apply` finishes or rolls back the nodes any other
run left in flight before it starts anything new, and stops at a safe step when told to."""

from __future__ import annotations

import dataclasses

import pytest

from rightsizer.apply import dryrun, takeover
from rightsizer.apply import protocol as proto
from rightsizer.apply.applier import Applier
from rightsizer.clients.kube import Kube
from rightsizer.plan.model import Plan
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer.apply_support import FAST, GOOD, Change, make_plan, seed_node

OTHER = {"7g.80gb": 1}


class Killed(BaseException):
    """The first run's process dies here."""


def die_after_cordon(kube: KubeDouble, plan: Plan) -> None:
    def progress(node: str, message: str) -> None:
        if node == "gpu-a" and message == "cordoned":
            raise Killed

    with pytest.raises(Killed):
        Applier(Kube(kube.api_client()), plan, FAST, progress=progress).run()
    assert kube.annotations("gpu-a")[proto.ANN_STEP] == "cordoned"
    assert kube.node("gpu-a")["spec"]["unschedulable"] is True


@pytest.mark.slow
def test_another_plans_node_with_the_same_target_is_finished_first_not_repeated() -> None:
    with KubeDouble() as kube:
        for n in ("gpu-a", "gpu-b"):
            seed_node(kube, n)
        first = make_plan([Change("gpu-a", "all-1g.10gb", GOOD), Change("gpu-b", "all-1g.10gb", GOOD)])
        die_after_cordon(kube, first)
        # another replica's plan: the same changes, another id (it also saw an unchanged node)
        second = make_plan(
            [Change("gpu-a", "all-1g.10gb", GOOD), Change("gpu-b", "all-1g.10gb", GOOD)], unchanged=["gpu-z"]
        )
        assert second.plan_id != first.plan_id
        lines: list[tuple[str, str]] = []
        report = Applier(
            Kube(kube.api_client()), second, FAST, progress=lambda n, m: lines.append((n, m))
        ).run()
        assert [(o.node, o.result) for o in report.outcomes] == [("gpu-a", "applied"), ("gpu-b", "applied")]
        assert any("finishing it (this plan also moves it to" in m for n, m in lines if n == "gpu-a")
        cordons = [
            a
            for a in kube.actions(verb="patch", name="gpu-a")
            if (a.detail["body"].get("spec") or {}).get("unschedulable")
        ]
        assert len(cordons) == 1
        assert kube.annotations("gpu-a")[proto.ANN_CORDONED_AT]


@pytest.mark.slow
@pytest.mark.parametrize("wants", ["another-target", "not-in-plan"])
def test_in_flight_work_this_plan_does_not_finish_is_rolled_back_before_anything_new(wants: str) -> None:
    with KubeDouble() as kube:
        for n in ("gpu-a", "gpu-b"):
            seed_node(kube, n)
        die_after_cordon(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
        changes = [Change("gpu-b", "all-1g.10gb", GOOD)]
        if wants == "another-target":
            changes.append(Change("gpu-a", "all-1g.10gb", OTHER))
        report = Applier(Kube(kube.api_client()), make_plan(changes), FAST).run()
        # rolled back, and not started again by this run (a rollback is not a failure of this run)
        assert [(o.node, o.result) for o in report.outcomes] == [
            ("gpu-a", "orphan-rolled-back"),
            ("gpu-b", "applied"),
        ]
        assert report.ok
        annotations = kube.annotations("gpu-a")
        assert (
            annotations[proto.ANN_STEP] == "rolled-back"
            and "rolling it back" in annotations[proto.ANN_REASON]
        )
        assert not kube.node("gpu-a")["spec"].get("unschedulable")
        assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == "all-1g.10gb"
        first_b = min(a.seq for a in kube.actions(verb="patch", name="gpu-b"))
        last_a = max(a.seq for a in kube.actions(verb="patch", name="gpu-a"))
        assert last_a < first_b  # settled before anything new started


@pytest.mark.slow
def test_the_dry_run_says_what_it_would_roll_back_first() -> None:
    with KubeDouble() as kube:
        for n in ("gpu-a", "gpu-b"):
            seed_node(kube, n)
        die_after_cordon(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
        script = dryrun.dry_run_script(
            Kube(kube.api_client()), make_plan([Change("gpu-b", "all-1g.10gb", GOOD)]), FAST
        )
        assert "# node gpu-a: plan " in script and "rolling it back (this plan does not change it)" in script
        assert script.index("# node gpu-a:") < script.index("kubectl cordon gpu-b")


@pytest.mark.slow
def test_a_run_told_to_stop_starts_no_node() -> None:
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a")
        plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD)])
        report = Applier(Kube(kube.api_client()), plan, FAST, stop=lambda: "the loss of leadership").run()
        assert [(o.node, o.result) for o in report.outcomes] == [("gpu-a", "not-started")]
        assert "the loss of leadership" in report.outcomes[0].reason
        assert report.ok and report.interrupted  # not a failure, but `apply` exits 1: work is left
        assert proto.ANN_STEP not in kube.annotations("gpu-a")


@pytest.mark.slow
def test_a_run_whose_lease_renewals_fail_stops_before_another_can_take_it() -> None:
    with KubeDouble() as kube:
        for n in ("gpu-a", "gpu-b"):
            seed_node(kube, n)
        plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD), Change("gpu-b", "all-1g.10gb", GOOD)])

        def unreachable(node: str, message: str) -> None:
            if node == "gpu-a" and message == "cordoned" and not kube.api.faults:
                # from now on every write of the apply Lease fails: its renewals stop succeeding
                kube.inject_fault(503, path_contains="/leases/gpupilot-rightsizer-apply", count=None)
                kube.wait_for(lambda: not applier._lease.held(), timeout=5, what="the renew deadline")  # type: ignore[union-attr]

        settings = dataclasses.replace(FAST, lease_duration_s=1, api_retry_s=0.2)
        applier = Applier(Kube(kube.api_client()), plan, settings, progress=unreachable)
        report = applier.run()
        assert [(o.node, o.result) for o in report.outcomes] == [
            ("gpu-a", "stopped"),
            ("gpu-b", "not-started"),
        ]
        assert "the apply Lease not renewed in time" in report.outcomes[0].reason
        assert kube.annotations("gpu-a")[proto.ANN_STEP] == "cordoned"  # a recorded step, for the next run


def _node(name: str, **annotations: str) -> proto.NodeView:
    return proto.view(
        {
            "metadata": {
                "name": name,
                "labels": {proto.CONFIG_LABEL: "all-1g.10gb"},
                "annotations": {f"gpupilot.io/{k.replace('_', '-')}": v for k, v in annotations.items()},
            }
        }
    )


def test_settle_orders_in_flight_work_before_new_nodes() -> None:
    plan = make_plan(
        [
            Change("gpu-a", "all-1g.10gb", GOOD),
            Change("gpu-b", "all-1g.10gb", GOOD),
            Change("gpu-c", "all-1g.10gb", GOOD),
        ]
    )
    target = plan.node("gpu-c").config_name  # type: ignore[union-attr]
    nodes = [
        _node("gpu-a"),
        _node("gpu-b"),
        _node("gpu-c", step="drained", plan_id="old", previous_config="all-1g.10gb", target_config=target),
        _node("gpu-x", step="relabeled", plan_id="old", previous_config="all-1g.10gb", target_config=target),
        _node("gpu-y", step="done", plan_id="old"),
    ]
    s = takeover.settle(nodes, plan, only={"gpu-b", "gpu-c"})
    assert [n.name for n in s.finish] == ["gpu-c"]  # in flight, same move: finished first
    assert [(n.name, "does not change it" in why) for n, why in s.roll_back] == [("gpu-x", True)]
    assert [n.name for n in s.fresh] == ["gpu-b"]  # gpu-a is not this run's to start (only)
