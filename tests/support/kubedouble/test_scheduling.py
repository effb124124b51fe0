"""The double as a cluster schedules GPU pods: the device plugin's resources per MIG strategy, pods bound
only where they fit (else Pending with the scheduler's reason), controllers that re-create pods from
the current template, and a double seeded from a plan."""

from __future__ import annotations

import kubernetes
import pytest

from devkit.cluster.deviceplugin import advertised
from tests.support.kubedouble import KubeDouble, fromplan

MIG1, MIG3 = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"


def test_the_device_plugin_advertises_per_strategy_and_time_slicing_replicas():
    layout = {0: {"1g.10gb": 2, "3g.40gb": 1}, 1: None}
    assert advertised(layout, strategy="mixed", replicas={}) == {
        "nvidia.com/mig-1g.10gb": 2,
        "nvidia.com/mig-3g.40gb": 1,
        "nvidia.com/gpu": 1,
    }
    assert advertised(layout, strategy="single", replicas={}) == {"nvidia.com/gpu": 4}
    assert advertised(layout, strategy="none", replicas={}) == {"nvidia.com/gpu": 2}
    assert advertised({0: None, 1: None}, strategy="mixed", replicas={"nvidia.com/gpu": 4}) == {
        "nvidia.com/gpu": 8
    }
    # GFD's nvidia.com/gpu.replicas multiplies nvidia.com/gpu only: MIG devices the config does not
    # replicate stay one each (7 x 1g.10gb, not 28)
    seven = {0: {"1g.10gb": 7}, 1: None}
    assert advertised(seven, strategy="mixed", replicas={"nvidia.com/gpu": 4}) == {
        MIG1: 7,
        "nvidia.com/gpu": 4,
    }


@pytest.mark.slow
def test_nodes_carry_the_applied_layout_and_the_mig_manager_republishes_it():
    with KubeDouble() as kube:
        kube.add_node("gpu-a", gpus=2, mig_config="all-3g.40gb")
        kube.add_node("gpu-b", gpus=2, mig_config="all-disabled")
        assert kube.node("gpu-a")["status"]["allocatable"][MIG3] == "4"
        assert kube.node("gpu-b")["status"]["allocatable"]["nvidia.com/gpu"] == "2"
        kube.set_node_label("gpu-a", "nvidia.com/mig.config.state", None)
        kube.set_node_label("gpu-a", "nvidia.com/mig.config", "all-1g.10gb")
        kube.wait_for(lambda: kube.labels("gpu-a").get("nvidia.com/mig.config.state") == "success")
        alloc = kube.node("gpu-a")["status"]["allocatable"]
        assert alloc[MIG1] == "14" and MIG3 not in alloc


@pytest.mark.slow
def test_a_pod_binds_only_where_it_fits_else_stays_pending_with_the_reason():
    with KubeDouble() as kube:
        kube.add_node("gpu-a", gpus=1, mig_config="all-3g.40gb")
        kube.add_workload("Deployment", "big", namespace="ml", replicas=3, resources={MIG3: 1})
        pods = kube.pods(namespace="ml")
        bound = [p for p in pods if p["spec"].get("nodeName") == "gpu-a"]
        (pending,) = [p for p in pods if not p["spec"].get("nodeName")]
        assert len(bound) == 2 and all(p["status"]["phase"] == "Running" for p in bound)
        (cond,) = pending["status"]["conditions"]
        assert (cond["type"], cond["status"], cond["reason"]) == ("PodScheduled", "False", "Unschedulable")
        assert cond["message"] == f"0/1 nodes are available: 1 Insufficient {MIG3}."
        events = kube.events(involving=pending["metadata"]["name"])
        assert [e["reason"] for e in events] == ["FailedScheduling"]
        kube.add_node("gpu-b", gpus=1, mig_config="all-3g.40gb")  # capacity appears: it binds
        kube.wait_for(lambda: all(p["spec"].get("nodeName") for p in kube.pods(namespace="ml")))


@pytest.mark.slow
def test_a_deployment_rolls_to_a_new_template_keeping_old_pods_until_new_ones_are_ready():
    with KubeDouble() as kube:
        kube.add_node("gpu-a", gpus=1, mig_config="all-3g.40gb")
        kube.add_workload("Deployment", "web", namespace="ml", replicas=1, resources={MIG3: 1})
        (old,) = kube.pods(namespace="ml")
        apps = kubernetes.client.AppsV1Api(kube.api_client())
        containers = [
            {"name": "main", "image": "x", "resources": {"limits": {MIG1: "1"}, "requests": {MIG1: "1"}}}
        ]
        apps.patch_namespaced_deployment(
            "web",
            "ml",
            {"spec": {"template": {"spec": {"containers": containers}}}},
            _content_type="application/merge-patch+json",
        )
        names = {p["metadata"]["name"]: p for p in kube.pods(namespace="ml")}
        assert old["metadata"]["name"] in names  # kept: the new pod cannot run (no 1g.10gb anywhere)
        assert len(names) == 2 and len(kube.store.list("apps/replicasets", "ml")) == 2
        core = kubernetes.client.CoreV1Api(kube.api_client())
        core.patch_node("gpu-a", {"spec": {"unschedulable": True}})  # cordon, as apply does
        kube.delete_pod(old["metadata"]["name"], namespace="ml")  # its replacement (old template) waits
        kube.set_node_label("gpu-a", "nvidia.com/mig.config.state", None)
        kube.set_node_label("gpu-a", "nvidia.com/mig.config", "all-balanced")  # 2×1g + 2g + 3g
        kube.wait_for(lambda: kube.labels("gpu-a").get("nvidia.com/mig.config.state") == "success")
        core.patch_node("gpu-a", {"spec": {"unschedulable": None}})
        kube.wait_for(
            lambda: (
                [
                    (p["spec"]["containers"][0]["resources"]["limits"], p["status"]["phase"])
                    for p in kube.pods(namespace="ml")
                ]
                == [({MIG1: "1"}, "Running")]
            ),
            what="the new pod Running and the old ReplicaSet scaled to 0",
        )


@pytest.mark.slow
def test_a_statefulset_re_creates_an_evicted_pod_under_its_name_from_the_current_template():
    with KubeDouble() as kube:
        kube.add_node("gpu-a", gpus=1, mig_config="all-3g.40gb")
        kube.add_workload("StatefulSet", "db", namespace="ml", replicas=2, resources={MIG3: 1})
        assert sorted(p["metadata"]["name"] for p in kube.pods(node="gpu-a")) == ["db-0", "db-1"]
        kube.delete_pod("db-1", namespace="ml")
        kube.wait_for(lambda: [p["metadata"]["name"] for p in kube.pods(node="gpu-a")] == ["db-0", "db-1"])


@pytest.mark.slow
def test_a_job_template_is_immutable_as_on_a_cluster():
    with KubeDouble() as kube:
        kube.add_workload("Job", "train", namespace="ml", resources={MIG3: 1})
        batch = kubernetes.client.BatchV1Api(kube.api_client())
        try:
            batch.patch_namespaced_job(
                "train", "ml", {"spec": {"template": {"metadata": {"labels": {"x": "y"}}}}},
                _content_type="application/merge-patch+json",
            )  # fmt: skip
        except kubernetes.client.ApiException as exc:
            assert exc.status == 422 and "field is immutable" in (exc.body or "")
        else:
            raise AssertionError("the Job's template was changed")


@pytest.mark.slow
def test_seeded_from_a_plan_the_pods_hold_the_devices_the_plan_names():
    plan = {
        "nodes": [
            {
                "name": "gpu-a",
                "model": "H100 80GB",
                "mig_strategy": "mixed",
                "changed": True,
                "current_config_name": "inference-mix",
                "current": [
                    {"index": 0, "mig_enabled": False, "mig_devices": {}},
                    {"index": 1, "mig_enabled": True, "mig_devices": {"1g.10gb": 5, "2g.20gb": 1}},
                ],
                "pods_disrupted": [
                    {
                        "namespace": "ai",
                        "name": "emb-5d8f6c7b9a-x1y2z",
                        "devices": [{"gpu": 1, "profile": "1g.10gb"}],
                    },
                    {
                        "namespace": "ai",
                        "name": "emb-5d8f6c7b9a-q3w4e",
                        "devices": [{"gpu": 1, "profile": "2g.20gb"}],
                    },
                ],
                "pods_kept": [
                    {"namespace": "ai", "name": "llm-6c9d-a1b2c", "devices": [{"gpu": 0, "profile": ""}]}
                ],
            }
        ]
    }
    with KubeDouble() as kube:
        counts = fromplan.seed(kube, plan)
        assert counts == {"nodes": 1, "deployments": 3, "pods": 3}
        node = kube.node("gpu-a")
        assert node["metadata"]["labels"]["nvidia.com/mig.config"] == "inference-mix"
        alloc = node["status"]["allocatable"]
        assert (alloc[MIG1], alloc["nvidia.com/mig-2g.20gb"], alloc["nvidia.com/gpu"]) == ("5", "1", "1")
        pods = {p["metadata"]["name"]: p for p in kube.pods(node="gpu-a")}
        assert set(pods) == {"emb-5d8f6c7b9a-x1y2z", "emb-5d8f6c7b9a-q3w4e", "llm-6c9d-a1b2c"}  # none added
        assert pods["emb-5d8f6c7b9a-q3w4e"]["spec"]["containers"][0]["resources"]["limits"] == {
            "nvidia.com/mig-2g.20gb": "1"
        }
        assert sorted(d["metadata"]["name"] for d in kube.store.list("apps/deployments", "ai")) == [
            "emb",
            "emb-2",
            "llm",
        ]
