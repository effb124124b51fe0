"""Ids (GPU-instance ids unique for every valid layout, stable UUIDs) and time/duration parsing."""

from __future__ import annotations

import pytest

from exporter.sim import identity, timespec
from mig_geometry import catalogue, layouts, placement


@pytest.mark.parametrize("key", ["H100 80GB", "A100 40GB", "H200", "A30"])
def test_gpu_instance_ids_are_unique_in_every_valid_layout(key: str) -> None:
    model = catalogue.find_model(key)
    assert model is not None
    all_layouts = layouts.valid_layouts(model)
    assert all_layouts
    for layout in all_layouts:
        placed = placement.place(model, dict(layout)).placed
        assert placed is not None
        ids = [
            identity.gpu_instance_id(p.profile.compute_slices, p.profile.memory_slices, p.start)
            for p in placed
        ]
        assert len(ids) == len(set(ids)), (layout, ids)


def test_uuids_are_stable_and_distinct() -> None:
    a = identity.gpu_uuid(1, "n", 0)
    assert a == identity.gpu_uuid(1, "n", 0) and a.startswith("GPU-") and len(a) == 40
    assert len({identity.gpu_uuid(1, "n", i) for i in range(8)} | {identity.gpu_uuid(2, "n", 0)}) == 9
    assert identity.mig_uuid(1, "n", 0, 7).startswith("MIG-")
    pod = identity.replica_pod_name(1, "ns", "web", 0)
    assert pod.startswith(identity.replicaset_name(1, "ns", "web") + "-")
    assert pod != identity.replica_pod_name(1, "ns", "web", 1)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15), ("2h30m", 9000), ("1d", 86400), ("1.5m", 90), ("1w", 604800), (42, 42), ("7", 7)],
)
def test_durations(text: object, seconds: float) -> None:
    assert timespec.parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "5 minutes", "1h-2m", "m5", True, None])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        timespec.parse_duration(bad)


def test_times() -> None:
    now = 1_796_000_000.0
    assert timespec.parse_time("2026-01-01T00:00:00Z", now=now) == 1_767_225_600
    assert timespec.parse_time("2026-01-01", now=now) == 1_767_225_600
    assert timespec.parse_time("now-7d", now=now) == now - 7 * 86400
    assert timespec.parse_time("now", now=now) == now
    assert timespec.parse_time("1767225600", now=now) == 1_767_225_600
    assert timespec.format_time(1_767_225_600) == "2026-01-01T00:00:00Z"
    with pytest.raises(ValueError, match="is not a time"):
        timespec.parse_time("last tuesday", now=now)
