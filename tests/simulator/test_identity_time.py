"""Ids (GPU-instance ids unique for every valid layout, stable UUIDs)."""

from __future__ import annotations

import pytest

from mig_geometry import catalogue, layouts, placement
from simulator import identity


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
