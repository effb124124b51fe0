"""apply on a static-MIG node NVIDIA's DRA driver serves: after the MIG Manager's success the driver's
kubelet-plugin pod is restarted and apply waits for its ResourceSlices to show the new instances
before uncordoning (the API double's DRA driver enumerates devices only when its plugin starts)."""

from __future__ import annotations

from collections import Counter

import pytest

from devkit.cluster.draslices import MigDevice, resource_slice
from rightsizer.apply import draplugin
from rightsizer.plan.management import DRA_LABEL
from tests.support.kubedouble import KubeDouble
from tests.support.kubedouble.dradriver import SLICES
from tests.support.rightsizer.apply_support import GOOD, Change, make_plan, run_apply, seed_node

PLUGIN_DS = {
    "apiVersion": "apps/v1",
    "kind": "DaemonSet",
    "metadata": {"name": "nvidia-dra-driver-gpu-kubelet-plugin"},
    "spec": {
        "selector": {"matchLabels": {"nvidia-dra-driver-gpu-component": "kubelet-plugin"}},
        "template": {
            "metadata": {"labels": {"nvidia-dra-driver-gpu-component": "kubelet-plugin"}},
            "spec": {"nodeSelector": {DRA_LABEL: "true"}, "containers": [{"name": "gpus", "image": "dra"}]},
        },
    },
}


def _profiles(kube: KubeDouble, node: str) -> Counter[str]:
    return draplugin.published_profiles(
        s for s in kube.store.view(SLICES) if (s.get("spec") or {}).get("nodeName") == node
    )


@pytest.mark.slow
def test_the_dra_plugin_is_restarted_and_its_slices_show_the_new_layout_before_uncordon(kube):
    seed_node(kube, "gpu-a")
    kube.set_node_label("gpu-a", DRA_LABEL, "true")
    kube.add_daemonset(PLUGIN_DS, namespace="nvidia-dra-driver-gpu")
    kube.wait_for(lambda: _profiles(kube, "gpu-a") == {"1g.10gb": 56})
    report, lines = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
    assert [o.result for o in report.outcomes] == ["applied"], lines
    assert _profiles(kube, "gpu-a") == {"3g.40gb": 8, "1g.10gb": 32}
    said = [m for n, m in lines if n == "gpu-a"]
    deleted = next(i for i, m in enumerate(said) if m.startswith("evicted the DRA kubelet-plugin pod"))
    shown = next(i for i, m in enumerate(said) if "ResourceSlices show the new MIG instances" in m)
    success = said.index("nvidia.com/mig.config.state=success")
    uncordoned = next(i for i, m in enumerate(said) if m.startswith("success; uncordoned"))
    assert success < deleted < shown < uncordoned
    evicted = [a.name for a in kube.actions(verb="evict")]
    assert "nvidia-dra-driver-gpu-kubelet-plugin-gpu-a" in evicted


@pytest.mark.slow
def test_a_plugin_that_never_republishes_rolls_the_node_back(kube):
    seed_node(kube, "gpu-a")
    kube.set_node_label("gpu-a", DRA_LABEL, "true")
    gpus = {i: f"GPU-{i:08d}-0000-4000-8000-000000000000" for i in range(8)}
    old = [MigDevice(i, "1g.10gb", 19, s, 1, uuid=f"MIG-{i}-{s}") for i in range(8) for s in range(7)]
    kube.store.put(SLICES, resource_slice("gpu-a", gpus=gpus, migs=old), event="ADDED")
    kube.add_pod(
        "dra-plugin-gpu-a",
        namespace="nvidia-dra-driver-gpu",
        node="gpu-a",
        resources={"cpu": 1},
        labels={"nvidia-dra-driver-gpu-component": "kubelet-plugin"},
    )
    kube.dra_driver.started["gpu-a"] = "never"  # a driver that does not come back: no new slice
    kube.dra_driver.publish = lambda node: None
    report, _ = run_apply(kube, make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))
    [outcome] = report.outcomes
    assert outcome.result == "rolled-back"
    assert "ResourceSlices on gpu-a still show 1g.10gb×56" in outcome.reason
    assert not kube.node("gpu-a")["spec"].get("unschedulable")


@pytest.mark.slow
def test_a_node_without_the_dra_driver_is_left_as_it_is(kube):
    seed_node(kube, "gpu-b")
    report, lines = run_apply(kube, make_plan([Change("gpu-b", "all-1g.10gb", GOOD)]))
    assert report.ok and not any("DRA" in m for _, m in lines)
