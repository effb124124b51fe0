"""DRA claims from NVIDIA's driver as each release names them, over the real gRPC kubelet double:
static and DynamicMIG, v25.12+ names (``gpu-0-mig-1g10gb-19-0``) and v25.3-v25.8 ones
(``gpu-0-mig-19-0-1``), resolved with ``resource.k8s.io/v1`` slices, ``v1beta1`` slices and no API
access; DynamicMIG slices carry no MIG ``uuid`` (the instance exists only while claimed)."""

from __future__ import annotations

import dataclasses
import time

import pytest

from devkit.cluster.draslices import MigDevice, mig_name, resource_slice
from exporter.attribute import kubeapi
from exporter.attribute.podresources import dra
from exporter.attribute.podresources.client import PodResourcesClient
from exporter.collect.collector import Collector
from exporter.expose import exposition
from exporter.settings import CollectorSettings
from exporter.snapshot import GpuSnapshot, NodeSnapshot
from tests.support.exporter import fakes
from tests.support.exporter.kubelet_double import claim, container, pod
from tests.support.kubedouble import KubeDouble

NODE = "node-a"
SLICES = "resource.k8s.io/resourceslices"  # the API double's storage key


def static_node() -> NodeSnapshot:
    """GPU 0 whole; GPU 1 with seven 1g.10gb instances at placements 0..6 (made ahead of time)."""
    return NodeSnapshot(taken_at=1.0, gpus=(fakes.whole_gpu(0), fakes.mig_gpu(1)))


def dynamic_node() -> NodeSnapshot:
    """DynamicMIG: GPU 1 holds only the instances prepared for claims: 1g.10gb at 0, 3g.40gb at 4."""
    small = fakes.mig_instance(1, 13, start=0)
    big = dataclasses.replace(fakes.mig_instance(1, 2, profile="3g.40gb", start=4), placement_size=4)
    gpu = fakes.mig_gpu(1, 0)
    return NodeSnapshot(
        taken_at=1.0,
        gpus=(fakes.whole_gpu(0), GpuSnapshot(info=gpu.info, values=gpu.values, instances=(small, big))),
    )


STATIC = [MigDevice(1, "1g.10gb", 19, s, 1) for s in range(7)]
DYNAMIC = [MigDevice(1, "1g.10gb", 19, s, 1) for s in range(7)] + [
    MigDevice(1, "3g.40gb", 9, s, 4) for s in (0, 4)
]


def _claims(kubelet, names: list[str]) -> tuple[dra.ClaimDevice, ...]:
    kubelet.set_pods(
        [
            pod("ml", f"p{i}", [container("main", claims=[claim(f"c{i}", "ml", [n])])])
            for i, n in enumerate(names)
        ]
    )
    with PodResourcesClient(kubelet.socket_path, timeout=2.0) as client:
        return client.attribution().claims


def _slices(
    snap: NodeSnapshot, migs: list[MigDevice], *, dynamic: bool, api: str, release: str
) -> dra.SliceIndex:
    gpus = {g.info.minor_number: g.info.uuid for g in snap.gpus}
    by_place = {(i.placement_start, i.profile): i.uuid for i in snap.gpus[1].instances}
    devices = [
        dataclasses.replace(
            m, uuid=None if dynamic else by_place.get((m.start, m.profile), f"MIG-gone-{m.start}")
        )
        for m in migs
    ]
    return dra.slice_index([resource_slice(NODE, gpus=gpus, migs=devices, api_version=api, release=release)])


def _attributed(got: dra.Resolved, snap: NodeSnapshot) -> dict[str, str]:
    """claim → the UUID of the device NVML reports that it was attributed to."""
    return {ref.dra.claim_name: uuid for uuid, refs in got.allocations.items() for ref in refs if ref.dra}


MODES = [("v1", "slices"), ("v1beta1", "slices"), ("", "no API")]


@pytest.mark.parametrize(("api", "mode"), MODES)
@pytest.mark.parametrize("release", ["v25.12", "v25.8"])
def test_static_mig_claims_are_attributed_in_every_mode(kubelet, api, mode, release):
    snap = static_node()
    wanted = [STATIC[0], STATIC[3], STATIC[6]]
    claims = _claims(kubelet, ["gpu-0", *(mig_name(m, release=release) for m in wanted)])
    slices = _slices(snap, STATIC, dynamic=False, api=api, release=release) if api else None
    got = dra.resolve({}, claims, snap, slices=slices)
    insts = snap.gpus[1].instances
    assert _attributed(got, snap) == {
        "c0": snap.gpus[0].info.uuid,
        "c1": insts[0].uuid,
        "c2": insts[3].uuid,
        "c3": insts[6].uuid,
    }  # 4/4 (1 whole GPU + 3 MIG claims)
    assert got.unresolved == ()


@pytest.mark.parametrize(("api", "mode"), MODES)
def test_dynamic_mig_claims_are_attributed_without_a_mig_uuid(kubelet, api, mode):
    snap = dynamic_node()
    small, big = snap.gpus[1].instances
    names = ["gpu-1-mig-1g10gb-19-0", "gpu-1-mig-3g40gb-9-4"]  # v25.12 / v0.4.0, as the driver names them
    claims = _claims(kubelet, names)
    slices = _slices(snap, DYNAMIC, dynamic=True, api=api, release="v25.12") if api else None
    if slices is not None:
        assert all(slices[(NODE, n)].uuid == "" and slices[(NODE, n)].parent_uuid for n in names)
    got = dra.resolve({}, claims, snap, slices=slices)
    assert _attributed(got, snap) == {"c0": small.uuid, "c1": big.uuid}  # 2/2
    ref = got.allocations[big.uuid][0]
    assert ref.dra is not None and (ref.dra.mig_profile, ref.dra.mig_device_uuid) == ("3g.40gb", big.uuid)


def test_a_placement_another_profile_holds_now_is_one_unresolved_claim_only(kubelet):
    snap = dynamic_node()
    # 1g.10gb at 4 was released and a 3g.40gb claim now sits there; 1g at 0 is still claimed
    claims = _claims(kubelet, ["gpu-1-mig-1g10gb-19-4", "gpu-1-mig-1g10gb-19-0", "gpu-1-mig-bogus"])
    for slices in (None, _slices(snap, DYNAMIC, dynamic=True, api="v1", release="v25.12")):
        got = dra.resolve({}, claims, snap, slices=slices)
        assert set(_attributed(got, snap)) == {"c1"}
        assert [c.claim_name for c in got.unresolved] == ["c0", "c2"]


def test_names_of_every_release_parse():
    assert dra.parse_canonical("gpu-0-mig-1g10gb-19-0") == (0, dra.MigName(19, 0, profile="1g10gb"))
    assert dra.parse_canonical("gpu-2-mig-1g10gbme-20-6") == (2, dra.MigName(20, 6, profile="1g10gbme"))
    assert dra.parse_canonical("gpu-3-mig-19-2-1") == (3, dra.MigName(19, 2, size=1))
    assert dra.parse_canonical("gpu-7") == (7, None)
    assert dra.parse_canonical("gpu-1-mig-19-0") is None and dra.parse_canonical("mig-a") is None
    assert dra.profile_token("1g.10gb+me") == "1g10gbme"


def test_every_dra_series_carries_dra_driver_name(kubelet):
    snap = dynamic_node()
    claims = _claims(kubelet, ["gpu-0", "gpu-1-mig-3g40gb-9-4"])
    got = dra.resolve({}, claims, snap, slices=None)
    whole = exposition._pod_labels(got.allocations[snap.gpus[0].info.uuid][0])
    mig = exposition._pod_labels(got.allocations[snap.gpus[1].instances[1].uuid][0])
    assert ("dra_driver_name", "gpu.nvidia.com") in whole and ("dra_driver_name", "gpu.nvidia.com") in mig
    assert not {k for k, _ in whole} & {"dra_mig_profile", "dra_mig_device_uuid"}
    assert ("dra_mig_profile", "3g.40gb") in mig


def test_the_api_slice_reader_keeps_dynamic_mig_devices_without_uuid():
    """Over real HTTP from the API double: the driver's DynamicMIG slice, MIG devices without uuid,
    is indexed by parent GPU and profile, and the claims resolve through it."""
    snap = dynamic_node()
    gpus = {g.info.minor_number: g.info.uuid for g in snap.gpus}
    with KubeDouble() as api:
        api.store.put(SLICES, resource_slice(NODE, gpus=gpus, migs=DYNAMIC), event="ADDED")
        access = kubeapi.ApiAccess(url=api.url, token_file=None, ca_file=None, timeout_s=2.0)
        watcher = kubeapi.SliceWatcher(access, node=NODE)
        watcher.list_once()
        index, _ = watcher.current()
    assert index is not None and len(index) == 2 + len(DYNAMIC)  # 2 GPUs + every advertised placement
    dev = index[(NODE, "gpu-1-mig-3g40gb-9-4")]
    assert (dev.uuid, dev.mig_profile, dev.parent_uuid) == ("", "3g.40gb", snap.gpus[1].info.uuid)
    cd = dra.ClaimDevice("ml", "p", "main", "c", "ml", dra.NVIDIA_DRIVER, NODE, "gpu-1-mig-3g40gb-9-4")
    got = dra.resolve({}, [cd], snap, slices=index)
    assert list(got.allocations) == [snap.gpus[1].instances[1].uuid]


@pytest.mark.parametrize(("dynamic", "mode"), [(True, "dynamic"), (False, "static")])
def test_the_node_says_how_the_driver_serves_it(kubelet, dynamic, mode):
    """gpupilot_dra_node_info{mig_mode}: what the rightsizer reads to keep a DynamicMIG node out of
    the MIG Manager's hands, even when no claim was attributed over the window."""
    snap = dynamic_node() if dynamic else static_node()
    slices = _slices(snap, DYNAMIC if dynamic else STATIC, dynamic=dynamic, api="v1", release="v25.12")
    c = Collector(
        fakes.FakeBackend(snap),
        hostname=NODE,
        settings=CollectorSettings(interval=1.0),
        allocations=lambda: dra.Attribution({}, (), slices=slices),
    )
    try:
        assert c.collect_once()
        text = c.page.body(openmetrics=False, gzip=False, now=time.monotonic()).decode()
    finally:
        c.stop()
    info = [ln for ln in text.splitlines() if ln.startswith("gpupilot_dra_node_info{")]
    assert info == [
        f'gpupilot_dra_node_info{{Hostname="{NODE}",dra_driver_name="gpu.nvidia.com",mig_mode="{mode}"}} 1'
    ]
    assert dra.mig_mode(None) == "" and dra.mig_mode({}) == ""
