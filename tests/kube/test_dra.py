"""DRA objects as the real API server takes them (``resource.k8s.io/v1``): the ResourceSlices NVIDIA's
driver publishes — whole GPUs, static MIG devices of both naming schemes, DynamicMIG devices
consuming their GPU's shared counters — are accepted as the tests build them; the exporter's
ResourceSlice watcher, with the token of the chart's exporter ServiceAccount and the chart's
``resourceslices`` reader role, lists and watches this node's slices only (its field selector) and
follows a change; the rightsizer's client sees a DynamicMIG node's slices."""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit.cluster.draslices import DRIVER, MigDevice, counter_slice, resource_slice
from exporter.attribute.kubeapi import ApiAccess, SliceWatcher
from rightsizer.clients.kube import Kube, KubeSettings
from rightsizer.plan import management
from tests.kube import world
from tests.kube.conftest import RealCluster

H100_UUID = "GPU-0c5a5d0e-0000-4000-8000-000000000001"


def _slice(node: str, **kwargs: object) -> dict[str, object]:
    obj = resource_slice(node, **kwargs)  # type: ignore[arg-type]
    obj["metadata"] = {"name": f"{node}-{DRIVER}-0"}
    return obj


@pytest.fixture(scope="module")
def exporter_token(real_cluster: RealCluster, chart: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A token of the chart's exporter ServiceAccount (DRA on: the slice reader role bound to it)."""
    path = tmp_path_factory.mktemp("exporter") / "token"
    path.write_text(world.service_account_token(real_cluster, chart, "gpupilot-exporter"))
    return path


@pytest.mark.parametrize("release", ["v25.12", "v25.8"])
def test_static_mig_slices_of_both_naming_schemes_are_accepted(
    real_cluster: RealCluster, release: str
) -> None:
    node = f"dra-static-{release.replace('.', '-')}"
    migs = [
        MigDevice(0, "1g.10gb", 19, 0, 1, uuid="MIG-11111111-0000-4000-8000-000000000001"),
        MigDevice(0, "3g.40gb", 9, 4, 4, uuid="MIG-11111111-0000-4000-8000-000000000002"),
    ]
    created = real_cluster.kube.create(_slice(node, gpus={0: H100_UUID}, migs=migs, release=release))
    names = [d["name"] for d in created["spec"]["devices"]]
    assert names[0] == "gpu-0" and len(names) == 3, names
    real_cluster.kube.delete("resource.k8s.io/v1", "ResourceSlice", created["metadata"]["name"])


def test_dynamic_mig_slices_with_shared_counters_are_accepted_and_the_rightsizer_sees_them(
    real_cluster: RealCluster, chart: str, tmp_path: Path
) -> None:
    """The pool in two slices (the counters, the devices consuming them); the rightsizer, with its
    own ServiceAccount, lists them and calls the node DynamicMIG: a node it must leave to the driver."""
    node = "dra-dynamic"
    migs = [MigDevice(0, "1g.10gb", 19, s, 1) for s in range(7)] + [MigDevice(0, "3g.40gb", 9, 0, 4)]
    created = real_cluster.kube.create(_slice(node, gpus={0: H100_UUID}, migs=migs))
    counters = real_cluster.kube.create(counter_slice(node, minors=[0]))
    assert counters["spec"]["sharedCounters"][0]["name"] == "gpu-0-counter-set"
    assert (
        created["spec"]["pool"]["resourceSliceCount"] == counters["spec"]["pool"]["resourceSliceCount"] == 2
    )
    assert any(d.get("consumesCounters") for d in created["spec"]["devices"]), "DynamicMIG devices consume it"
    kube = Kube.connect(
        KubeSettings(
            kubeconfig=world.service_account_kubeconfig(real_cluster, tmp_path, chart, "gpupilot-rightsizer")
        )
    )
    try:
        slices = kube.list_resource_slices(driver=DRIVER, node=node)
    finally:
        kube.close()
    assert len(slices) == 2
    found = management.mode({"metadata": {"name": node, "labels": {}}}, slices)
    assert found is not None and found[0] == management.DRA_DYNAMIC, found
    for obj in (created, counters):
        real_cluster.kube.delete("resource.k8s.io/v1", "ResourceSlice", obj["metadata"]["name"])


def test_the_exporters_watcher_follows_its_nodes_slices_with_the_charts_rbac(
    real_cluster: RealCluster, exporter_token: Path
) -> None:
    node, other = "dra-watched", "dra-elsewhere"
    mine = real_cluster.kube.create(_slice(node, gpus={0: H100_UUID}))
    real_cluster.kube.create(_slice(other, gpus={0: "GPU-0c5a5d0e-0000-4000-8000-00000000000f"}))
    access = ApiAccess(
        url=real_cluster.cp.url, token_file=exporter_token, ca_file=Path(real_cluster.cp.ca_file)
    )
    watcher = SliceWatcher(access, node=node, watch_s=30).start()
    try:
        world.wait(lambda: watcher.current()[0] is not None, what="the first list", timeout=30)
        index, _ = watcher.current()
        assert index is not None
        assert watcher.lists >= 1
        # a MIG device appears on this node's slice: the watch brings it
        migs = [MigDevice(0, "3g.40gb", 9, 0, 4, uuid="MIG-22222222-0000-4000-8000-000000000001")]
        update = _slice(node, gpus={0: H100_UUID}, migs=migs)
        real_cluster.kube.apply(update)
        uuid = "MIG-22222222-0000-4000-8000-000000000001"
        world.wait(
            lambda: uuid in repr(watcher.current()[0]), what="the watch to bring the MIG device", timeout=30
        )
        assert "GPU-0c5a5d0e-0000-4000-8000-00000000000f" not in repr(watcher.current()[0]), (
            "another node's slice"
        )
    finally:
        watcher.stop()
        for n in (node, other):
            real_cluster.kube.delete("resource.k8s.io/v1", "ResourceSlice", f"{n}-{DRIVER}-0")
    assert mine["metadata"]["name"] == f"{node}-{DRIVER}-0"
