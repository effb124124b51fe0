"""The in-flight record (pure parts): its codec refuses what it cannot read in one line, and a node
is seen through it — an in-flight step the record does not hold is set aside, and where it holds the
node, the record's plan, configs and workloads win over the node's annotations."""

from __future__ import annotations

import pytest

from rightsizer.apply import protocol as proto
from rightsizer.apply import record as inflight
from rightsizer.apply import workloads as wl

OURS = wl.Change("Deployment", "ml", "reports", 1, {"app": "reports"}, (("a", "b", 1),), ("ml/reports-0",))
FORGED = wl.Change("Deployment", "payments", "api", 1, {}, (("nvidia.com/gpu", "nvidia.com/mig-1g.5gb", 1),))


def node(**annotations: str) -> proto.NodeView:
    return proto.NodeView(
        name="gpu-a",
        resource_version="7",
        uid="uid-a",
        labels={proto.CONFIG_LABEL: "all-1g.10gb"},
        annotations=annotations,
        unschedulable=False,
    )


def held(step: str = "cordoned", uid: str = "uid-a") -> inflight.Record:
    return inflight.Record("gpu-a", uid, "p1", "all-1g.10gb", "all-3g.40gb", False, step, "patch", (OURS,))


def forged(step: str = "relabeled", plan: str = "p1") -> proto.NodeView:
    return node(
        **{
            proto.ANN_STEP: step,
            proto.ANN_PLAN: plan,
            proto.ANN_PREVIOUS: "evil",
            proto.ANN_TARGET: "evil-target",
            proto.ANN_WAS_UNSCHEDULABLE: "true",
            wl.ANN_WORKLOADS: wl.encode([FORGED]),
        }
    )


def test_records_round_trip() -> None:
    records = {"gpu-a": held()}
    assert inflight.decode(inflight.encode(records), where="cm") == records


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "[]",
        '{"format": 2, "nodes": {}}',
        '{"format": 1, "nodes": {"gpu-a": {"uid": "x"}}}',
        '{"format": 1, "nodes": {"gpu-a": ' + '{"uid":"u","plan":"p","previous":"a","target":"b",'
        '"wasUnschedulable":false,"step":"flying"}}}',
    ],
)
def test_a_record_that_cannot_be_read_is_one_line_naming_it(text: str) -> None:
    with pytest.raises(inflight.RecordUnreadable) as err:
        inflight.decode(text, where="ConfigMap gpu-operator/gpupilot-rightsizer-in-flight")
    message = str(err.value)
    assert "\n" not in message and message.startswith("ConfigMap gpu-operator/gpupilot-rightsizer-in-flight")


def test_an_in_flight_step_the_record_does_not_hold_is_set_aside() -> None:
    seen = inflight.trusted_view(forged(), None)
    assert not seen.in_flight and wl.ANN_WORKLOADS not in seen.annotations
    assert "set aside" in inflight.unrecorded(forged(), None)
    # final steps stay: they only ever make apply do less
    assert inflight.trusted_view(forged(step="done"), None).step == "done"


def test_the_record_wins_over_the_node_where_it_holds_it() -> None:
    seen = inflight.trusted_view(forged(step="cordoned"), held())
    assert (seen.previous, seen.target, seen.was_unschedulable) == ("all-1g.10gb", "all-3g.40gb", False)
    assert [c.ref for c in wl.decode(seen.annotations[wl.ANN_WORKLOADS])] == ["deployment/ml/reports"]


def test_the_node_says_how_far_its_change_went_only_under_the_recorded_plan() -> None:
    assert inflight.trusted_view(forged(step="relabeled"), held()).step == "relabeled"  # a killed run
    assert inflight.trusted_view(forged(step="relabeled", plan="p2"), held()).step == "cordoned"
    assert inflight.trusted_view(forged(step="cordoned"), held(step="drained")).step == "drained"
    assert inflight.trusted_view(node(), held(step="starting")).step == "starting"


def test_a_record_of_another_node_of_the_same_name_does_not_count() -> None:
    seen = inflight.trusted_view(forged(), held(uid="uid-old"))
    assert not seen.in_flight
    assert "different UID" in inflight.unrecorded(forged(), held(uid="uid-old"))
