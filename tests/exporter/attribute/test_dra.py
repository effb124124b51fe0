"""DRA attribution: claims over a real gRPC kubelet double, resolved by canonical names or ResourceSlices
(watched from the API double over real HTTP), down to the series' pod and ``dra_*`` labels."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from exporter.attribute import kubeapi
from exporter.attribute.podresources import dra
from exporter.attribute.podresources.client import PodResourcesClient
from exporter.collect.collector import Collector
from exporter.commands import cli
from exporter.settings import CollectorSettings
from exporter.snapshot import NodeSnapshot
from tests.support.exporter import fakes
from tests.support.exporter.kubelet_double import claim, container, pod
from tests.support.kubedouble import KubeDouble

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
SLICES = "resource.k8s.io/resourceslices"  # the double's storage key
H100_1G_ID = 19  # nvidia-smi mig -lgip id of 1g.10gb on H100


def node_snapshot() -> NodeSnapshot:
    """GPU 0 whole, GPU 1 in MIG mode with seven 1g.10gb instances at placements 0..6."""
    return NodeSnapshot(taken_at=1.0, gpus=(fakes.whole_gpu(0), fakes.mig_gpu(1)))


def series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_claims_are_read_from_dynamic_resources_and_other_drivers_ignored(kubelet):
    kubelet.set_pods(
        [
            pod(
                "ml",
                "train-0",
                [
                    container(
                        "main",
                        claims=[
                            claim("train-0-gpu", "ml", ["gpu-0"]),
                            claim("nic", "ml", ["eth1"], driver="dra.net"),
                        ],
                    )
                ],
            )
        ]
    )
    with PodResourcesClient(kubelet.socket_path, timeout=2.0) as client:
        found = client.attribution()
    assert found.devices == {}
    assert found.claims == (
        dra.ClaimDevice("ml", "train-0", "main", "train-0-gpu", "ml", "gpu.nvidia.com", "node-a", "gpu-0"),
    )


def test_canonical_names_resolve_whole_gpus_and_mig_placements():
    snap = node_snapshot()
    claims = [
        dra.ClaimDevice("ml", "a", "c", "ca", "ml", dra.NVIDIA_DRIVER, "node-a", "gpu-0"),
        dra.ClaimDevice(
            "ml", "b", "c", "cb", "ml", dra.NVIDIA_DRIVER, "node-a", f"gpu-1-mig-{H100_1G_ID}-3-1"
        ),
        # wrong profile id at an existing placement, and a minor that is not on this node
        dra.ClaimDevice("ml", "x", "c", "cx", "ml", dra.NVIDIA_DRIVER, "node-a", "gpu-1-mig-9-3-1"),
        dra.ClaimDevice("ml", "y", "c", "cy", "ml", dra.NVIDIA_DRIVER, "node-a", "gpu-7"),
    ]
    got = dra.resolve({}, claims, snap, slices=None)
    gpu0 = snap.gpus[0].info.uuid
    mig = snap.gpus[1].instances[3]
    assert set(got.allocations) == {gpu0, mig.uuid}
    (ref,) = got.allocations[mig.uuid]
    whole = got.allocations[gpu0][0].dra
    assert ref.dra is not None and whole is not None
    assert (ref.pod, ref.dra.device_name, ref.dra.mig_profile, ref.dra.mig_device_uuid) == (
        "b",
        f"gpu-1-mig-{H100_1G_ID}-3-1",
        "1g.10gb",
        mig.uuid,
    )
    assert whole.mig_device_uuid == ""
    assert [c.pod for c in got.unresolved] == ["x", "y"]


def test_slices_win_over_canonical_names():
    """A driver that names devices by index (older releases): only the slices know the UUID."""
    snap = node_snapshot()
    mig = snap.gpus[1].instances[5]
    items: list[dict[str, Any]] = [
        {
            "metadata": {"name": "node-a-gpu.nvidia.com-x"},
            "spec": {
                "driver": "gpu.nvidia.com",
                "nodeName": "node-a",
                "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                "devices": [
                    {"name": "gpu-0", "attributes": {"uuid": {"string": snap.gpus[1].info.uuid}}},
                    {
                        "name": "mig-a",
                        "basic": {  # v1beta1 shape
                            "attributes": {
                                "gpu.nvidia.com/uuid": {"string": mig.uuid},
                                "profile": {"string": "1g.10gb"},
                            }
                        },
                    },
                    {"name": "no-uuid", "attributes": {"type": {"string": "gpu"}}},
                ],
            },
        },
        {"spec": {"driver": "other.example.com", "pool": {"name": "node-a"}, "devices": []}},
    ]
    index = dra.slice_index(items)
    assert set(index) == {("node-a", "gpu-0"), ("node-a", "mig-a")}
    claims = [
        dra.ClaimDevice("ml", "a", "c", "ca", "ml", dra.NVIDIA_DRIVER, "node-a", "gpu-0"),
        dra.ClaimDevice("ml", "b", "c", "cb", "ml", dra.NVIDIA_DRIVER, "node-a", "mig-a"),
    ]
    got = dra.resolve({}, claims, snap, slices=index).allocations
    # gpu-0 in the slices is GPU 1 here (not /dev/nvidia0): the slice decides
    assert got[snap.gpus[1].info.uuid][0].pod == "a"
    mig_ref = got[mig.uuid][0].dra
    assert mig_ref is not None and mig_ref.mig_profile == "1g.10gb"


def test_collector_serves_pod_and_dra_labels_over_grpc(kubelet):
    snap = node_snapshot()
    mig = snap.gpus[1].instances[0]
    kubelet.set_pods(
        [
            pod("ml", "train-0", [container("main", claims=[claim("train-0-gpu", "ml", ["gpu-0"])])]),
            pod(
                "serve",
                "infer-0",
                [container("srv", claims=[claim("infer-0-mig", "serve", [f"gpu-1-mig-{H100_1G_ID}-0-1"])])],
            ),
            pod("serve", "legacy-0", [container("srv", mig={"1g.10gb": [snap.gpus[1].instances[1].uuid]})]),
            pod("ml", "lost-0", [container("main", claims=[claim("lost-claim", "ml", ["gpu-9"])])]),
        ]
    )
    client = PodResourcesClient(kubelet.socket_path, timeout=2.0)
    c = Collector(
        fakes.FakeBackend(snap),
        hostname="node-a",
        settings=CollectorSettings(interval=1.0),
        allocations=client.attribution,
    )
    try:
        assert c.collect_once()
        text = c.page.body(openmetrics=False, gzip=False, now=time.monotonic()).decode()
    finally:
        c.stop()
        client.close()
    util = series(text, "DCGM_FI_DEV_GPU_UTIL")
    assert len(util) == 1
    for label in (
        'pod="train-0"',
        'namespace="ml"',
        'container="main"',
        'dra_claim_name="train-0-gpu"',
        'dra_claim_namespace="ml"',
        'dra_pool_name="node-a"',
        'dra_device_name="gpu-0"',
        'dra_driver_name="gpu.nvidia.com"',
    ):
        assert label in util[0]
    assert (
        "dra_mig_profile" not in util[0] and "dra_mig_device_uuid" not in util[0]
    )  # MIG only, as dcgm-exporter
    active = series(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    claimed = [s for s in active if 'pod="infer-0"' in s]
    assert len(claimed) == 1
    assert f'dra_mig_device_uuid="{mig.uuid}"' in claimed[0] and 'dra_mig_profile="1g.10gb"' in claimed[0]
    legacy = [s for s in active if 'pod="legacy-0"' in s]
    assert len(legacy) == 1 and "dra_claim_name" not in legacy[0]  # device plugin: no dra_* labels
    assert c.errors["dra"] == 1  # gpu-9 is not on this node: counted, not attributed
    assert "lost-0" not in text


def test_dra_off_ignores_claims(kubelet):
    kubelet.set_pods([pod("ml", "a", [container("main", claims=[claim("c", "ml", ["gpu-0"])])])])
    with PodResourcesClient(kubelet.socket_path, timeout=2.0, dra_drivers=()) as client:
        assert client.attribution().claims == ()


def _slice(node: str, devices: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu.nvidia.com"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": n, "attributes": {"uuid": {"string": u}}} for n, u in devices.items()],
        },
    }


@pytest.fixture(scope="module")
def module_kube():
    """One empty API double for this module's watch tests (each puts its own ResourceSlices)."""
    with KubeDouble() as double:
        yield double


@pytest.mark.slow
def test_slice_watcher_lists_and_follows_the_api_over_http(module_kube):
    snap = node_snapshot()
    gpu0, gpu1 = snap.gpus[0].info.uuid, snap.gpus[1].info.uuid
    module_kube.store.put(SLICES, _slice("node-a", {"gpu-0": gpu0}), event="ADDED")
    module_kube.store.put(SLICES, _slice("node-b", {"gpu-0": gpu1}), event="ADDED")
    access = kubeapi.ApiAccess(url=module_kube.url, token_file=None, ca_file=None, timeout_s=2.0)
    watcher = kubeapi.SliceWatcher(access, node="node-a", watch_s=1).start()
    try:
        deadline = time.monotonic() + 5
        while watcher.current()[0] is None and time.monotonic() < deadline:
            time.sleep(0.02)
        index, note = watcher.current()
        assert index == {("node-a", "gpu-0"): dra.SliceDevice(uuid=gpu0)}, note  # node-b's slice not listed
        # the driver republishes the slice: the watch follows without a relist
        lists = watcher.lists
        obj = _slice("node-a", {"gpu-0": gpu0, "gpu-1": gpu1})
        module_kube.store.put(SLICES, obj, event="MODIFIED")
        while ("node-a", "gpu-1") not in (watcher.current()[0] or {}) and time.monotonic() < deadline:
            time.sleep(0.02)
        now_index = watcher.current()[0]
        assert now_index is not None and now_index[("node-a", "gpu-1")].uuid == gpu1
        assert watcher.lists == lists
    finally:
        watcher.stop()


@pytest.mark.slow
def test_an_expired_watch_is_relisted_and_the_index_kept_current(module_kube):
    access = kubeapi.ApiAccess(url=module_kube.url, token_file=None, ca_file=None, timeout_s=2.0)
    module_kube.store.put(SLICES, _slice("node-x", {"gpu-0": "GPU-x0"}), event="ADDED")
    watcher = kubeapi.SliceWatcher(access, node="node-x", watch_s=1, backoff_max_s=0.05)
    module_kube.expire_watches(1)  # the first watch gets 410 Expired in-stream
    watcher.start()
    try:
        deadline = time.monotonic() + 5
        while watcher.lists < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert watcher.lists >= 2  # listed, the watch expired, listed again
        module_kube.store.put(
            SLICES, _slice("node-x", {"gpu-0": "GPU-x0", "gpu-1": "GPU-x1"}), event="MODIFIED"
        )
        while ("node-x", "gpu-1") not in (watcher.current()[0] or {}) and time.monotonic() < deadline:
            time.sleep(0.02)
        now_index = watcher.current()[0]
        assert now_index is not None and now_index[("node-x", "gpu-1")].uuid == "GPU-x1"
    finally:
        watcher.stop()


@pytest.mark.slow
def test_slice_watcher_over_https_with_a_service_account_token(tmp_path, exporter_pki):
    """In a pod: HTTPS checked against the cluster CA, the token file read for each request, and a
    missing RBAC grant named in the one-line error."""
    token = tmp_path / "token"
    token.write_text("exporter-token\n")
    sa = "system:serviceaccount:gpupilot:gpupilot-exporter"
    with KubeDouble(
        tls=(exporter_pki.server_cert, exporter_pki.server_key), require_token=True, enforce_rules=True
    ) as api:
        assert api.url.startswith("https://")
        api.add_token("exporter-token", sa)
        access = kubeapi.ApiAccess(url=api.url, token_file=token, ca_file=exporter_pki.ca_cert, timeout_s=2.0)
        watcher = kubeapi.SliceWatcher(access, node="node-a")
        with pytest.raises(
            kubeapi.KubeApiError, match=r"HTTP 403 \(check the exporter's RBAC for resourceslices\)"
        ):
            watcher.list_once()
        api.allow(sa, "list", "resourceslices", group="resource.k8s.io")
        api.store.put(SLICES, _slice("node-a", {"gpu-0": "GPU-abc"}), event="ADDED")
        watcher.list_once()
        assert watcher.current()[0] == {("node-a", "gpu-0"): dra.SliceDevice(uuid="GPU-abc")}
        wrong_ca = kubeapi.ApiAccess(url=api.url, token_file=token, ca_file=exporter_pki.other_ca_cert)
        with pytest.raises(kubeapi.KubeApiError, match="CERTIFICATE_VERIFY_FAILED"):
            kubeapi.SliceWatcher(wrong_ca, node="node-a").list_once()


def test_slice_watcher_reports_an_unreachable_api_in_one_line():
    access = kubeapi.ApiAccess(url="http://127.0.0.1:9", token_file=None, ca_file=None, timeout_s=1.0)
    watcher = kubeapi.SliceWatcher(access, node="node-a")
    with pytest.raises(
        kubeapi.KubeApiError, match=r"127\.0\.0\.1:9/apis/resource\.k8s\.io/v1/resourceslices"
    ):
        watcher.list_once()


def test_unreadable_api_falls_back_to_canonical_names():
    snap = node_snapshot()
    cd = dra.ClaimDevice("ml", "a", "c", "ca", "ml", dra.NVIDIA_DRIVER, "node-a", "gpu-0")
    found = dra.Attribution({}, (cd,), slices=None, slices_note="connection refused")
    assert found.resolve(snap).allocations[snap.gpus[0].info.uuid][0].pod == "a"
    moved = dataclasses.replace(found, slices={})
    assert found.resolve(snap).unresolved == () and moved.resolve(snap).unresolved == ()


def test_cli_with_the_simulator_attributes_claims_through_the_same_socket(kubelet, capsys):
    """``--backend sim`` + ``--pod-resources-socket``: the kubelet's claims label the simulated node's
    devices, resolved by canonical names (no API in a test run)."""
    kubelet.set_pods(
        [
            pod(
                "llm",
                "infer-0",
                [container("server", claims=[claim("infer-0-gpu", "llm", ["gpu-0"], pool="gpu-h100-b")])],
            ),
            pod(
                "ml",
                "small-0",
                [
                    container(
                        "main",
                        claims=[
                            claim("small-0-mig", "ml", [f"gpu-1-mig-{H100_1G_ID}-0-1"], pool="gpu-h100-b")
                        ],
                    )
                ],
            ),
        ]
    )
    code = cli.main(
        [
            *("--backend", "sim", "--scenario", str(EXAMPLES / "fleet-demo.yaml"), "--node", "gpu-h100-b"),
            *("--pod-resources-socket", kubelet.socket_path, "--kubernetes-enable-dra", "--once"),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    util = [ln for ln in out.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{") and 'gpu="0"' in ln]
    assert len(util) == 1 and 'pod="infer-0"' in util[0] and 'dra_device_name="gpu-0"' in util[0]
    mig = [
        ln for ln in out.splitlines() if ln.startswith("gpupilot_device_pod_info{") and 'pod="small-0"' in ln
    ]
    assert len(mig) == 1
    assert 'GPU_I_PROFILE="1g.10gb"' in mig[0] and 'dra_mig_profile="1g.10gb"' in mig[0]
    assert 'dra_mig_device_uuid="MIG-' in mig[0] and "placement_start" not in mig[0]


def test_once_says_which_claims_it_could_not_attribute(kubelet, capsys):
    """``--once`` logs errors only; a claimed device that is not on the node is still one warning line
    on stderr, naming the claim, and the collection succeeds."""
    kubelet.set_pods(
        [
            pod(
                "llm",
                "infer-0",
                [container("server", claims=[claim("infer-0-gpu", "llm", ["gpu-0"], pool="gpu-h100-b")])],
            ),
            pod(
                "ml",
                "lost-0",
                [container("main", claims=[claim("lost-0-gpu", "ml", ["gpu-9"], pool="gpu-h100-b")])],
            ),
        ]
    )
    code = cli.main(
        [
            *("--backend", "sim", "--scenario", str(EXAMPLES / "fleet-demo.yaml"), "--node", "gpu-h100-b"),
            *("--pod-resources-socket", kubelet.socket_path, "--kubernetes-enable-dra", "--once"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0
    assert 'pod="infer-0"' in captured.out
    lines = [ln for ln in captured.err.splitlines() if "lost-0" in ln]
    assert lines == [
        "gpupilot-exporter: warning: claimed device(s) not found on this node, served without pod labels: "
        "ml/lost-0-gpu (gpu-h100-b/gpu-9); ResourceSlices unavailable: ResourceSlices not watched"
    ]


def test_one_unparsable_device_name_drops_only_that_devices_labels(kubelet, caplog):
    """A claim naming ``gpu-`` and 5,000 digits (more than Python converts to an int by default):
    that claim alone goes unattributed — counted, one warning naming it shortened, no Python error
    text — and every other device keeps its pod labels."""
    snap = node_snapshot()
    odd = "gpu-" + "9" * 5000
    kubelet.set_pods(
        [
            pod("ml", "train-0", [container("main", claims=[claim("train-0-gpu", "ml", ["gpu-0"])])]),
            pod("ml", "odd-0", [container("main", claims=[claim("odd-claim", "ml", [odd])])]),
            pod("serve", "legacy-0", [container("srv", mig={"1g.10gb": [snap.gpus[1].instances[1].uuid]})]),
        ]
    )
    client = PodResourcesClient(kubelet.socket_path, timeout=2.0)
    c = Collector(
        fakes.FakeBackend(snap),
        hostname="node-a",
        settings=CollectorSettings(interval=1.0),
        allocations=client.attribution,
    )
    try:
        with caplog.at_level("WARNING", logger="exporter.collect.collector"):
            assert c.collect_once()
        text = c.page.body(openmetrics=False, gzip=False, now=time.monotonic()).decode()
    finally:
        c.stop()
        client.close()
    assert any('pod="train-0"' in s for s in series(text, "DCGM_FI_DEV_GPU_UTIL"))
    assert any('pod="legacy-0"' in s for s in series(text, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"))
    assert "odd-0" not in text
    assert c.errors["dra"] == 1 and c.errors["podresources"] == 0
    (line,) = [r.getMessage() for r in caplog.records]
    assert "ml/odd-claim (node-a/gpu-999" in line and "..." in line and len(line) < 300
    assert "digits" not in line and "int" not in line.split("(")[0]


def test_names_with_numbers_out_of_bounds_or_other_scripts_parse_to_nothing():
    for name in (
        "gpu-" + "9" * 5000,
        "gpu-\u0663",
        "gpu-1-mig-" + "1" * 40 + "-0-1",
        "gpu-0-mig-1g10gb-19-0\n",
    ):
        assert dra.parse_canonical(name) is None, name
    assert dra.parse_canonical("gpu-123456") == (123456, None)
