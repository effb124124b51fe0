"""The rightsizer on DRA nodes, against a real Prometheus over a small backfilled history: node modes
(device plugin, DRA static MIG, DRA dynamic MIG), dynamic-MIG nodes never relabelled, claim-template
advice keyed by pod/claim/profile (not MIG UUID) in plan.json and the plan table; and the pure parts."""

from __future__ import annotations

import contextlib
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.cluster.draslices import MigDevice, resource_slice
from devkit.prometheus import PrometheusServer, backfill_openmetrics
from rightsizer.analysis.types import PodKey
from rightsizer.cli import main
from rightsizer.plan import dra, management
from rightsizer.plan.model import load_plan
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer.dra_history import DAYS, H100, write_history

SLICES = "resource.k8s.io/resourceslices"  # the API double's storage key

pytestmark = pytest.mark.prometheus


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """A Prometheus over the backfilled history: (its URL, the window's end, a scratch folder)."""
    base = tmp_path_factory.mktemp("dra-history")
    now = time.time()
    end = now - now % 3600 - 3600
    write_history(base / "history.om", end=end)
    backfill_openmetrics(base / "history.om", base / "data", block_duration="96h")
    with PrometheusServer(base / "data", log_file=base / "prometheus.log") as server:
        yield server.url, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end)), base


def _plan(history: tuple[str, str, Path], out: Path, *extra: str) -> tuple[dict[str, Any], str]:
    url, at, _ = history
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(
            ["plan", "--prometheus-url", url, "--window", f"{DAYS}d", "--at", at, "--out", str(out), *extra]
        )
    assert code == 0, buf.getvalue()
    return json.loads(out.read_text()), buf.getvalue()


@pytest.fixture(scope="module")
def planned(history: tuple[str, str, Path]) -> tuple[dict[str, Any], str, Path]:
    """``plan`` run once over the history: (plan.json, the table it printed, the plan's path)."""
    out = history[2] / "plan.json"
    doc, table = _plan(history, out)
    return doc, table, out


def test_modes_are_detected_per_node(planned):
    doc, _, _ = planned
    modes = {n["node"]: n["mode"] for n in doc["dra"]["nodes"]}
    assert modes == {
        "node-dp": "device-plugin",
        "node-sta": "dra-static-mig",
        "node-dyn": "dra-dynamic-mig",
        # no claim attributed, but the exporter read DynamicMIG ResourceSlices (gpupilot_dra_node_info)
        "node-dm": "dra-dynamic-mig",
    }
    reasons = {n["node"]: n["reason"] for n in doc["dra"]["nodes"]}
    assert "the exporter saw DynamicMIG ResourceSlices" in reasons["node-dm"]


def test_dynamic_mig_nodes_are_never_relabelled(planned):
    doc, _, path = planned
    assert "node-dyn" not in {n["name"] for n in doc["nodes"]}
    assert {n["name"] for n in doc["nodes"]} == {"node-dp", "node-sta"}
    assert load_plan(path).dra == doc["dra"]  # plan.json reads back for apply


def test_claim_templates_get_a_profile_from_their_workloads_history(planned):
    doc, table, _ = planned
    by_profile = {a["current_profile"]: a for a in doc["dra"]["claim_templates"]}
    infer = by_profile["3g.40gb"]
    # eight claims, eight MIG UUIDs, one workload: history keyed by pod/claim/profile
    assert infer["workload"] == "ml/infer" and len(infer["claims"]) == DAYS * 4 + 1
    assert infer["recommended_profile"] == "1g.10gb"
    assert infer["selector"] == 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    assert 6900 <= infer["peak_memory_mib"] <= 7000
    assert by_profile["7g.80gb"]["recommended_profile"] == "7g.80gb"
    assert "dra: node-dyn is dra-dynamic-mig" in table
    assert "dra: node-sta is dra-static-mig: its pods get devices through ResourceClaims" in table
    assert "node-dp is" not in table  # device-plugin nodes need no word
    assert "dra: ml/infer (NVIDIA H100 80GB HBM3) on 3g.40gb: request 1g.10gb" in table


def test_pure_node_modes():
    modes = dra.node_modes(
        [("", "a"), ("", "b"), ("", "c")],
        claimed=[("", "b"), ("", "c")],
        instances_seen={("", "a"): 7, ("", "b"): 7, ("", "c"): 9},
        instances_now={("", "a"): 7, ("", "b"): 7, ("", "c"): 2},
    )
    assert [m.mode for m in modes] == [
        management.DEVICE_PLUGIN,
        management.DRA_STATIC,
        management.DRA_DYNAMIC,
    ]


def test_pure_profile_recommendation_and_workload_grouping():
    assert (
        dra.recommend_profile(H100, current="3g.40gb", peak_memory_mib=7000, peak_activity=0.1, headroom=0.2)[
            0
        ]
        == "1g.10gb"
    )
    assert (
        dra.recommend_profile(
            H100, current="3g.40gb", peak_memory_mib=15000, peak_activity=0.1, headroom=0.2
        )[0]
        == "1g.20gb"
    )
    assert (
        dra.recommend_profile(
            H100, current="7g.80gb", peak_memory_mib=60000, peak_activity=0.9, headroom=0.2
        )[0]
        == "7g.80gb"
    )
    assert (
        dra.recommend_profile(H100, current="3g.40gb", peak_memory_mib=None, peak_activity=0.1, headroom=0.2)[
            0
        ]
        == "3g.40gb"
    )
    uses = [
        dra.ClaimUse("", "n", "ml", f"infer-5d8f7c9b6-{i:05d}", f"c{i}", "3g.40gb", H100, 5000 + i, 0.1)
        for i in range(3)
    ]
    advice = dra.advise(uses, owners={}, headroom=0.2)
    assert [(a.workload, a.claims, a.recommended_profile) for a in advice] == [
        ("ml/infer", ("c0", "c1", "c2"), "1g.10gb")
    ]
    owned = dra.advise(
        uses[:1], owners={("", PodKey("ml", uses[0].pod)): "ml/Deployment/infer"}, headroom=0.2
    )
    assert owned[0].workload == "ml/Deployment/infer"


def test_whole_gpu_claims_move_to_the_mig_device_class_or_stay_whole():
    small = dra.ClaimUse("", "n", "ml", "embed-5d8f7c9b6-00001", "c1", "", H100, 7000, 0.1)
    busy = dra.ClaimUse("", "n", "ml", "train-5d8f7c9b6-00001", "c2", "", H100, 70000, 0.95)
    by_workload = {a.workload: a for a in dra.advise([small, busy], owners={}, headroom=0.2)}
    moved, kept = by_workload["ml/embed"], by_workload["ml/train"]
    # a whole GPU used lightly: a MIG profile, asked of the mig.nvidia.com class with a selector it matches
    assert (moved.recommended_profile, moved.device_class) == ("1g.10gb", dra.MIG_CLASS)
    assert moved.selector == 'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    assert "from gpu.nvidia.com to mig.nvidia.com" in moved.reason
    # a whole GPU used fully stays a whole GPU (never 7g.80gb on gpu.nvidia.com, whose type is 'gpu')
    assert (kept.recommended_profile, kept.device_class, kept.selector) == ("", dra.GPU_CLASS, "")
    assert not kept.changes
    lines = dra.table_lines(dra.to_dict(dra.DraAdvice(claims=(moved, kept))))
    assert lines[0].endswith(
        'deviceClassName: mig.nvidia.com; selector: device.attributes["gpu.nvidia.com"].profile == "1g.10gb"'
    )
    assert "on whole GPU: keep whole GPU" in lines[1] and lines[1].endswith("deviceClassName: gpu.nvidia.com")


def test_a_dynamic_mig_node_the_series_miss_is_recognised_from_its_resource_slices(history, tmp_path):
    """node-dp's series show no claim (its MIG claims unattributed), yet its ResourceSlices, as the
    driver publishes them with DynamicMIG (MIG devices without uuid, consuming shared counters), say the
    MIG Manager must not run there: plan --kubeconfig keeps it out of nodes[]."""
    gpus = {i: f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(2)}
    dynamic = resource_slice("node-dp", gpus=gpus, migs=[MigDevice(0, "1g.10gb", 19, s, 1) for s in range(7)])
    static = resource_slice(
        "node-sta",
        gpus=gpus,
        migs=[MigDevice(0, "3g.40gb", 9, 0, 4, uuid="MIG-5c89fbd4-3b66-5a8e-9e0b-2ab4c8e3b8a1")],
        api_version="v1",
    )
    with KubeDouble() as kube:
        kube.add_node("node-dp", gpus=2)
        kube.add_node("node-sta", gpus=2)
        kube.store.put(SLICES, dynamic, event="ADDED")
        kube.store.put(SLICES, static, event="ADDED")
        config = kube.write_kubeconfig(tmp_path / "kubeconfig")
        doc, table = _plan(history, tmp_path / "plan.json", "--kubeconfig", str(config))
    modes = {n["node"]: (n["mode"], n["reason"]) for n in doc["dra"]["nodes"]}
    assert modes["node-dp"][0] == "dra-dynamic-mig"
    assert "7 MIG device(s) in its gpu.nvidia.com ResourceSlices have no uuid" in modes["node-dp"][1]
    assert modes["node-sta"][0] == "dra-static-mig" and modes["node-dyn"][0] == "dra-dynamic-mig"
    assert {n["name"] for n in doc["nodes"]} == {"node-sta"}  # never a MIG Manager config for node-dp
    assert "dra: node-dp is dra-dynamic-mig" in table


def test_pure_node_management_from_slices_and_the_operator_label():
    gpus = {0: "GPU-00000000-0000-0000-0000-000000000000"}
    node = {"metadata": {"name": "n", "labels": {management.DRA_LABEL: "true"}}}
    plain = {"metadata": {"name": "n", "labels": {}}}
    for api in ("v1", "v1beta1"):
        dyn = resource_slice("n", gpus=gpus, migs=[MigDevice(0, "1g.10gb", 19, 0, 1)], api_version=api)
        assert management.dynamic_devices(dyn) == ["gpu-0-mig-1g10gb-19-0"]
        assert management.mode(plain, [dyn])[0] == management.DRA_DYNAMIC  # type: ignore[index]
        sta = resource_slice(
            "n",
            gpus=gpus,
            migs=[MigDevice(0, "1g.10gb", 19, 0, 1, uuid="MIG-0")],
            release="v25.8",
            api_version=api,
        )
        assert management.dynamic_devices(sta) == []
        assert management.mode(plain, [sta])[0] == management.DRA_STATIC  # type: ignore[index]
    assert management.mode(node, None)[0] == management.DRA_DYNAMIC  # type: ignore[index]  # slices unreadable
    assert management.mode(node, [])[0] == management.DRA_STATIC  # type: ignore[index]
    assert management.mode(plain, None) is None and management.mode(plain, []) is None
    other = resource_slice("m", gpus=gpus, migs=[MigDevice(0, "1g.10gb", 19, 0, 1)])
    assert management.mode(plain, [other]) is None  # another node's slice says nothing of this one
