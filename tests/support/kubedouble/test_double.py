"""The Kubernetes API double itself: REST verbs through the official client, watches, PDB-aware
evictions, conflicts, reviews, and the simulated MIG Manager's label protocol."""

from __future__ import annotations

import datetime
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tests.support.common.present import present
from tests.support.kubedouble import IN_USE, KubeDouble, MigManagerSettings

STATE = "nvidia.com/mig.config.state"


def core(kube: KubeDouble) -> client.CoreV1Api:
    return client.CoreV1Api(kube.api_client())


@pytest.mark.slow
def test_nodes_get_list_patch_with_all_three_patch_types(kube):
    kube.add_node("gpu-a", mig_config="all-1g.10gb")
    kube.add_node("cpu-b", model="L4", gpus=1, mig_config=None)
    v1 = core(kube)
    listed = v1.list_node(label_selector="nvidia.com/mig.capable=true")
    assert [present(n.metadata).name for n in listed.items] == ["gpu-a"]
    rv0 = present(present(v1.read_node("gpu-a").metadata).resource_version)
    v1.patch_node("gpu-a", {"spec": {"unschedulable": True}, "metadata": {"annotations": {"a": "1"}}})
    v1.patch_node(
        "gpu-a", {"metadata": {"labels": {"team": "ml"}}}, _content_type="application/merge-patch+json"
    )
    v1.patch_node("gpu-a", [{"op": "remove", "path": "/metadata/annotations/a"}])
    node = v1.read_node("gpu-a")
    assert present(node.spec).unschedulable is True
    assert present(present(node.metadata).labels)["team"] == "ml"
    assert "a" not in (present(node.metadata).annotations or {})
    assert int(present(present(node.metadata).resource_version)) > int(rv0)
    v1.patch_node("gpu-a", {"metadata": {"labels": {"team": None}}})
    assert "team" not in kube.labels("gpu-a")


@pytest.mark.slow
def test_stale_resource_version_conflicts_and_injected_conflicts(kube):
    kube.add_node("gpu-a")
    v1 = core(kube)
    stale = present(v1.read_node("gpu-a").metadata).resource_version
    v1.patch_node("gpu-a", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(ApiException) as err:
        v1.patch_node("gpu-a", {"metadata": {"resourceVersion": stale, "labels": {"x": "2"}}})
    assert err.value.status == 409
    kube.inject_conflicts("nodes", "gpu-a", 1)
    with pytest.raises(ApiException) as err:
        v1.patch_node("gpu-a", {"metadata": {"labels": {"x": "3"}}})
    assert err.value.status == 409
    v1.patch_node("gpu-a", {"metadata": {"labels": {"x": "3"}}})
    assert kube.labels("gpu-a")["x"] == "3"


@pytest.mark.slow
def test_status_errors_not_found_invalid_and_injected(kube):
    v1 = core(kube)
    with pytest.raises(ApiException) as err:
        v1.read_node("missing")
    assert err.value.status == 404 and '"reason": "NotFound"' in str(err.value.body).replace("'", '"')
    kube.add_node("gpu-a")
    with pytest.raises(ApiException) as err:
        v1.patch_node("gpu-a", {"metadata": {"labels": {"bad": "has spaces"}}})
    assert err.value.status == 422
    kube.inject_fault(503, path_contains="/api/v1/nodes")
    with pytest.raises(ApiException) as err:
        v1.list_node()
    assert err.value.status == 503
    assert v1.list_node().items


@pytest.mark.slow
def test_pod_list_by_node_watch_and_delete(kube):
    kube.add_node("gpu-a")
    kube.add_pod("p1", node="gpu-a", resources={"nvidia.com/gpu": 1})
    kube.add_pod("p2", node="other")
    v1 = core(kube)
    on_a = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=gpu-a")
    assert [present(p.metadata).name for p in on_a.items] == ["p1"]
    seen: list[tuple[str, str]] = []
    w = watch.Watch()

    def deleter() -> None:
        kube.wait_for(lambda: len(seen) >= 1)
        v1.delete_namespaced_pod("p1", "default")

    t = threading.Thread(target=deleter)
    t.start()
    for ev in w.stream(
        v1.list_namespaced_pod, "default", field_selector="spec.nodeName=gpu-a", timeout_seconds=5
    ):
        seen.append((ev["type"], ev["object"].metadata.name))
        if ev["type"] == "DELETED":
            w.stop()
    t.join()
    # graceful deletion: first the deletionTimestamp (MODIFIED), then gone once the kubelet stopped it
    assert seen == [("ADDED", "p1"), ("MODIFIED", "p1"), ("DELETED", "p1")]


@pytest.mark.slow
def test_watch_replays_from_resource_version(kube):
    kube.add_node("gpu-a")
    v1 = core(kube)
    rv = present(v1.list_node().metadata).resource_version
    v1.patch_node("gpu-a", {"metadata": {"labels": {"step": "1"}}})
    v1.patch_node("gpu-a", {"metadata": {"labels": {"step": "2"}}})
    steps = [
        ev["object"].metadata.labels.get("step")
        for ev in watch.Watch().stream(v1.list_node, resource_version=rv, timeout_seconds=1)
    ]
    assert steps == ["1", "2"]


@pytest.mark.slow
def test_eviction_respects_pod_disruption_budget(kube):
    kube.add_pod("a", node="gpu-a", labels={"app": "infer"})
    kube.add_pod("b", node="gpu-b", labels={"app": "infer"})
    kube.add_pdb("infer", match_labels={"app": "infer"}, min_available=1)
    v1 = core(kube)
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name="a", namespace="default"))
    pdb = client.PolicyV1Api(kube.api_client()).read_namespaced_pod_disruption_budget("infer", "default")
    assert present(pdb.status).disruptions_allowed == 1
    v1.create_namespaced_pod_eviction("a", "default", body)
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_pod_eviction(
            "b", "default", client.V1Eviction(metadata=client.V1ObjectMeta(name="b", namespace="default"))
        )
    assert err.value.status == 429
    assert kube.pods()[0]["metadata"].get("deletionTimestamp")  # "a" terminates gracefully
    kube.wait_for(lambda: [p["metadata"]["name"] for p in kube.pods()] == ["b"])
    assert [a.verb for a in kube.actions(resource="pods")] == ["evict", "evict-refused"]


@pytest.mark.slow
def test_terminating_pods_linger_then_go():
    with KubeDouble(pod_termination_s=0.1) as kube:
        kube.add_pod("a", node="gpu-a")
        core(kube).delete_namespaced_pod("a", "default")
        assert kube.pods()[0]["metadata"].get("deletionTimestamp")
        kube.wait_for(lambda: not kube.pods(), timeout=3)


@pytest.mark.slow
def test_configmaps_events_and_cluster_policy(kube):
    v1 = core(kube)
    cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c"), data={"config.yaml": "x"})
    v1.create_namespaced_config_map("gpu-operator", cm)
    with pytest.raises(ApiException) as err:
        v1.create_namespaced_config_map("gpu-operator", cm)
    assert err.value.status == 409
    got = v1.read_namespaced_config_map("c", "gpu-operator")
    data = present(got.data)
    data["config.yaml"] = "y"
    v1.replace_namespaced_config_map("c", "gpu-operator", got)
    data["config.yaml"] = "z"  # stale resourceVersion now
    with pytest.raises(ApiException) as err:
        v1.replace_namespaced_config_map("c", "gpu-operator", got)
    assert err.value.status == 409
    v1.create_namespaced_event(
        "default",
        client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name="gpu-a."),
            involved_object=client.V1ObjectReference(kind="Node", name="gpu-a"),
            reason="MigReconfigureFailed",
            message="m",
        ),
    )
    client.EventsV1Api(kube.api_client()).create_namespaced_event(
        "default",
        client.EventsV1Event(
            metadata=client.V1ObjectMeta(generate_name="gpu-a."),
            event_time=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
            regarding=client.V1ObjectReference(kind="Node", name="gpu-a"),
            reason="R",
            action="A",
            reporting_controller="c",
            reporting_instance="i",
            type="Normal",
        ),
    )
    assert len(kube.events(involving="gpu-a")) == 2
    crd = client.CustomObjectsApi(kube.api_client())
    with pytest.raises(ApiException) as err:
        crd.patch_cluster_custom_object(
            "nvidia.com",
            "v1",
            "clusterpolicies",
            "cluster-policy",
            {"spec": {}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert err.value.status == 415  # a CRD: no strategic merge, as on a real cluster
    crd.patch_cluster_custom_object(  # the client's default for custom objects is merge-patch
        "nvidia.com",
        "v1",
        "clusterpolicies",
        "cluster-policy",
        {"spec": {"migManager": {"config": {"name": "custom"}}}},
    )
    cp: Any = crd.get_cluster_custom_object("nvidia.com", "v1", "clusterpolicies", "cluster-policy")
    assert cp["spec"]["migManager"]["config"] == {"name": "custom", "default": "all-disabled"}


@pytest.mark.slow
def test_token_and_subject_access_reviews():
    with KubeDouble(require_token=True) as kube:
        kube.add_token(
            "t-hpa", "system:serviceaccount:kube-system:horizontal-pod-autoscaler", ["system:serviceaccounts"]
        )
        kube.allow("system:serviceaccounts", "get", "pods", group="custom.metrics.k8s.io")
        authn = client.AuthenticationV1Api(kube.api_client())
        ok = authn.create_token_review(client.V1TokenReview(spec=client.V1TokenReviewSpec(token="t-hpa")))
        bad = authn.create_token_review(client.V1TokenReview(spec=client.V1TokenReviewSpec(token="nope")))
        assert present(ok.status).authenticated
        assert present(present(present(ok.status).user).username).endswith("horizontal-pod-autoscaler")
        assert not present(bad.status).authenticated
        authz = client.AuthorizationV1Api(kube.api_client())

        def sar(verb: str, resource: str) -> bool:
            spec = client.V1SubjectAccessReviewSpec(
                user="u",
                groups=["system:serviceaccounts"],
                resource_attributes=client.V1ResourceAttributes(
                    verb=verb, resource=resource, group="custom.metrics.k8s.io", namespace="ml"
                ),
            )
            return bool(
                present(
                    authz.create_subject_access_review(client.V1SubjectAccessReview(spec=spec)).status
                ).allowed
            )

        assert sar("get", "pods") and not sar("delete", "pods")
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(kube.api_client(token=None)).list_node()
        assert err.value.status == 401


def _relabel_and_wait(kube: KubeDouble, node: str, config: str) -> str:
    core(kube).patch_node(node, {"metadata": {"labels": {"nvidia.com/mig.config": config, STATE: None}}})
    kube.wait_for(lambda: kube.labels(node).get(STATE) in ("success", "failed"), timeout=5)
    return kube.labels(node)[STATE]


@pytest.mark.slow
def test_mig_manager_applies_known_configs_and_pauses_operands(kube):
    kube.add_node("gpu-a", mig_config="all-1g.10gb")
    assert _relabel_and_wait(kube, "gpu-a", "all-balanced") == "success"
    assert kube.mig_manager.states("gpu-a") == ["pending", "success"]
    labels = kube.labels("gpu-a")
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert labels["nvidia.com/mig-3g.40gb.count"] == "8"
    paused = [a for a in kube.actions(verb="mig-manager") if a.detail["state"] == "pending"]
    assert paused and kube.mig_manager.applied["gpu-a"] == "all-balanced"


@pytest.mark.slow
def test_mig_manager_fails_unknown_names_bad_layouts_and_busy_gpus(kube):
    kube.add_node("gpu-a", mig_config="all-1g.10gb")
    assert _relabel_and_wait(kube, "gpu-a", "no-such-config") == "failed"
    assert "not found" in kube.mig_manager.log[-1].reason
    bad = {
        "version": "v1",
        "mig-configs": {
            "bad": [{"devices": "all", "mig-enabled": True, "mig-devices": {"3g.40gb": 2, "1g.10gb": 1}}]
        },
    }
    kube.add_configmap("custom", data={"config.yaml": yaml.safe_dump(bad)})
    kube.store.update(
        "nvidia.com/clusterpolicies",
        "",
        "cluster-policy",
        lambda cp: cp["spec"]["migManager"]["config"].update(name="custom"),
    )
    assert _relabel_and_wait(kube, "gpu-a", "bad") == "failed"
    assert "placement" in kube.mig_manager.log[-1].reason
    kube.store.update(
        "nvidia.com/clusterpolicies",
        "",
        "cluster-policy",
        lambda cp: cp["spec"]["migManager"]["config"].update(name="default-mig-parted-config"),
    )
    kube.add_pod("busy", node="gpu-a", resources={"nvidia.com/mig-1g.10gb": 1})
    assert _relabel_and_wait(kube, "gpu-a", "all-3g.40gb") == "failed"
    assert kube.mig_manager.log[-1].reason.startswith(IN_USE)
    assert kube.labels("gpu-a")["nvidia.com/gpu.deploy.dcgm-exporter"] == "true"


@pytest.mark.slow
def test_mig_manager_reboot_path():
    with KubeDouble(mig_manager=MigManagerSettings(with_reboot=True)) as kube:
        kube.add_node("gpu-a", mig_config="all-disabled")
        assert _relabel_and_wait(kube, "gpu-a", "all-1g.10gb") == "success"
        assert kube.mig_manager.states("gpu-a") == ["pending", "rebooting", "success"]


@pytest.mark.slow
def test_kubectl_works_against_the_double(kube, tmp_path: Path):
    kube.add_node("gpu-a")
    cfg = kube.write_kubeconfig(tmp_path / "kubeconfig")
    out = subprocess.run(
        ["kubectl", "--kubeconfig", str(cfg), "label", "node", "gpu-a", "team=ml", "--overwrite"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert kube.labels("gpu-a")["team"] == "ml"
