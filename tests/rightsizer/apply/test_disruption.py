"""The one disruption rule (mig-parted's per-GPU skip, the reset of all GPUs on a MIG mode change),
the split of a node's pods, the in-code layout check and apply's eviction list."""

from __future__ import annotations

import pytest

from rightsizer.plan import disruption
from rightsizer.plan.model import DisruptedPod, GpuLayout, HeldDevice, NodePlan

BALANCED = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
SEVEN = {"1g.10gb": 7}


def gpus(*layouts: dict[str, int] | None) -> tuple[GpuLayout, ...]:
    return tuple(GpuLayout(i, m is not None, dict(m or {})) for i, m in enumerate(layouts))


def pod(name: str, *devices: tuple[int, str]) -> DisruptedPod:
    return DisruptedPod("ml", name, tuple(HeldDevice(g, p) for g, p in devices))


def test_only_gpus_whose_layout_changes_are_recreated():
    now = gpus(BALANCED, SEVEN, None)
    assert disruption.reconfigured_gpus(now, gpus(BALANCED, BALANCED, None)) == {1}
    assert disruption.reconfigured_gpus(now, now) == frozenset()
    # Counts compare as mig-parted's Equals does: order and zero entries do not matter.
    same = gpus({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2, "4g.40gb": 0}, SEVEN, None)
    assert disruption.reconfigured_gpus(now, same) == frozenset()


def test_a_mig_mode_change_recreates_every_gpu_of_the_node():
    now = gpus(BALANCED, SEVEN, None)
    assert disruption.mode_changes(now, gpus(BALANCED, None, None))
    assert disruption.reconfigured_gpus(now, gpus(BALANCED, None, None)) == {0, 1, 2}
    assert disruption.reconfigured_gpus(now, gpus(BALANCED, SEVEN, SEVEN)) == {0, 1, 2}


def test_split_keeps_pods_on_untouched_gpus_unless_the_plan_moves_them():
    now, after = gpus(BALANCED, SEVEN), gpus(BALANCED, {"3g.40gb": 2})
    a = pod("a", (0, "2g.20gb"))
    b = pod("b", (1, "1g.10gb"))
    c = pod("c", (0, "1g.10gb"))
    placements = [
        disruption.PodPlacement(a, (disruption.Target(a.devices[0], "n", 0, "2g.20gb"),)),
        disruption.PodPlacement(b, (disruption.Target(b.devices[0], "n", 1, "3g.40gb"),)),
        # c's GPU keeps its layout, but the plan gives c another slot: it must be evicted to move.
        disruption.PodPlacement(c, (disruption.Target(c.devices[0], "n", 1, "3g.40gb"),)),
    ]
    gone, kept = disruption.split_pods(placements, node="n", current=now, proposed=after)
    assert [p.name for p in gone] == ["b", "c"] and [p.name for p in kept] == ["a"]


def test_requests_must_fit_the_proposed_layout():
    after = gpus(BALANCED)
    stay = [pod("a", (0, "1g.10gb")), pod("b", (0, "1g.10gb"))]
    arriving = [disruption.Target(HeldDevice(1, "2g.20gb"), "n", 0, "2g.20gb")]
    disruption.check_requests_fit("n", after, staying=stay, arriving=arriving)
    third = [*arriving, disruption.Target(HeldDevice(1, "2g.20gb"), "n", 0, "1g.10gb")]
    with pytest.raises(
        disruption.LayoutMismatchError, match=r"n GPU 0: 3 pod device\(s\).*mig-1g.10gb.*has 2"
    ):
        disruption.check_requests_fit("n", after, staying=stay, arriving=third)


def test_apply_evicts_listed_and_unseen_pods_never_kept_ones():
    node = NodePlan(
        name="n",
        model="H100 80GB",
        pci_device_id="0x2330",
        changed=True,
        current_config_name="a",
        current=(),
        proposed=(),
        config_name="b",
        config_document={},
        slices_freed=0,
        gpus_freed=0,
        expected_utilisation=0.0,
        pods_disrupted=(pod("gone"),),
        pods_kept=(pod("stays"),),
    )
    got = disruption.evictions(node, [("ml", "stays"), ("ml", "gone"), ("ml", "new"), ("ml", "gone")])
    assert [(e.name, e.reason.split(" ")[0]) for e in got] == [("gone", "listed"), ("new", "not")]
    summary = disruption.disruption_summary(node)
    assert summary == ""  # current == proposed == (): nothing is re-created


def test_idle_rule_uses_the_peak_or_else_every_hour_without_a_process():
    from rightsizer.plan import idle  # noqa: PLC0415
    from rightsizer.plan.model import Evidence  # noqa: PLC0415

    def ev(peak: float | None, idle_h: float, cover: float = 48.0) -> Evidence:
        return Evidence(
            gpu=0,
            profile="1g.10gb",
            gpu_instance_id="7",
            allocated=True,
            pod="ml/x",
            idle_hours=idle_h,
            p95_activity=None,
            coverage_hours=cover,
            window_hours=48.0,
            peak_activity=peak,
        )

    assert idle.is_idle(ev(0.01, 47), 0.05)
    assert not idle.is_idle(ev(0.75, 46), 0.05)  # a daily burst: busy, however many idle hours
    assert idle.is_idle(ev(None, 48), 0.05)  # no GPM: no compute process in any hour
    assert not idle.is_idle(ev(None, 40), 0.05)  # processes ran in 8 hours
    assert not idle.is_idle(ev(None, 0, cover=0), 0.05)  # no data at all: unknown


def test_evidence_column_names_the_peak_and_when():
    from rightsizer.plan.model import Evidence  # noqa: PLC0415
    from rightsizer.plan.table import activity_text  # noqa: PLC0415

    def ev(peak: float | None, at: str = "2026-11-29T03:00:00Z") -> Evidence:
        return Evidence(
            gpu=0,
            profile="3g.40gb",
            gpu_instance_id="1",
            allocated=True,
            pod="ml/x",
            idle_hours=46.0,
            p95_activity=0.01,
            coverage_hours=48.0,
            window_hours=48.0,
            peak_activity=peak,
            peak_at=at,
        )

    assert activity_text(ev(0.85)) == "peak 15-min mean 85% on 11-29 03:00"
    assert activity_text(ev(0.0)) == "peak 15-min mean 0%"
    assert activity_text(ev(None)) == "activity unknown"


def test_pods_sharing_one_device_use_its_slot_once():
    # Two pods on one 1g.10gb (the history's last samples show the pod leaving and the one after it),
    # and two pods of one device moving together: one slot each.
    after = gpus(BALANCED)
    shared = HeldDevice(0, "1g.10gb", "13", "MIG-a")
    stay = [pod("leaving"), pod("arrived")]
    stay = [DisruptedPod("ml", p.name, (shared,)) for p in stay] + [pod("b", (0, "1g.10gb"))]
    moving = HeldDevice(1, "2g.20gb", "3", "MIG-b")
    arriving = [disruption.Target(moving, "n", 0, "2g.20gb"), disruption.Target(moving, "n", 0, "2g.20gb")]
    disruption.check_requests_fit("n", after, staying=stay, arriving=arriving)
    other = disruption.Target(HeldDevice(2, "1g.10gb", "9", "MIG-c"), "n", 0, "1g.10gb")
    with pytest.raises(disruption.LayoutMismatchError, match=r"3 pod device\(s\).*mig-1g.10gb.*has 2"):
        disruption.check_requests_fit("n", after, staying=stay, arriving=[*arriving, other])
