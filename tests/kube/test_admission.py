"""The rightsizer's ValidatingAdmissionPolicies decided by kube-apiserver itself (the chart installed
with auto-apply; every write made as the rightsizer's ServiceAccount, by impersonation): `apply`'s
template patch and its rollback, cordon, relabel and rollback of a node, and the ClusterPolicy's
config name are admitted; every other change in the same tables the CEL unit tests use
(tests/deploy/test_admission_policies.py) is refused, with the policy's message; another identity
is not bound."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from rightsizer.apply import protocol
from rightsizer.apply import workloads as wl
from tests.deploy.test_admission_policies import (
    ALLOWED_MOVES,
    FORBIDDEN,
    NODE_FORBIDDEN,
    OUTSIDE_THE_ALLOW_LIST,
    deployment,
)
from tests.kube import world
from tests.kube.conftest import RealCluster
from tests.support.kubedouble.patching import merge_patch

RIGHTSIZER = world.RIGHTSIZER


def _diff(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {k: None for k in old if k not in new}
    for k, v in new.items():
        if k not in old:
            patch[k] = v
        elif old[k] != v:
            patch[k] = _diff(old[k], v)
    return patch


def _write(
    cluster: RealCluster, old: dict[str, Any], new: dict[str, Any], *, user: str | None = RIGHTSIZER
) -> tuple[bool, str]:
    """``kubectl patch --type=merge`` from ``old`` to ``new`` as ``user`` (the rightsizer patches;
    RBAC gives it no update; ``None``: the cluster's admin): (admitted, the API server's answer)."""
    meta = old["metadata"]
    where = ["-n", meta["namespace"]] if meta.get("namespace") else []
    kinds = {"Deployment": "deployments.apps", "Node": "nodes", "ClusterPolicy": "clusterpolicies.nvidia.com"}
    patch = json.dumps(_diff(old, new))
    who = [f"--as={user}"] if user else []
    res = cluster.kubectl(
        "patch", kinds[old["kind"]], meta["name"], *where, "--type=merge", "-p", patch, *who, check=False
    )
    return res.returncode == 0, str(res.stderr or res.stdout).strip()


def _live_deployment(cluster: RealCluster, namespace: str, name: str = "train") -> dict[str, Any]:
    """The tables' Deployment created in the cluster (as the admin), read back as the API has it."""
    owner = cluster.kube.apply(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owner", "namespace": namespace}}
    )
    obj = deployment()
    obj["metadata"] = {
        "name": name,
        "namespace": namespace,
        "labels": {"app": "train"},
        "annotations": {"example.com/owner": "ml"},
        # an owner that exists (the garbage collector removes a dependent whose owner does not)
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
        ],
    }
    obj.pop("status", None)
    if cluster.kube.get("apps/v1", "Deployment", name, namespace) is None:
        cluster.kube.create(obj)
    live: dict[str, Any] | None = cluster.kube.get("apps/v1", "Deployment", name, namespace)
    assert live is not None
    live.pop("status", None)
    live["metadata"].pop("managedFields", None)
    return live


def _refused_by_policy(answer: str) -> bool:
    return "ValidatingAdmissionPolicy 'gpupilot-rightsizer-" in answer and "denied request" in answer


def test_apply_template_patch_and_its_rollback_are_admitted(
    real_cluster: RealCluster, chart: str, namespace: str
) -> None:
    live = _live_deployment(real_cluster, namespace)
    moves = (("nvidia.com/mig-3g.40gb", "nvidia.com/mig-1g.10gb", 1),)
    ok, answer = _write(
        real_cluster, live, merge_patch(live, wl.template_patch(live, "Deployment", moves, plan_id="p-7"))
    )
    assert ok, answer
    now = _live_deployment(real_cluster, namespace)
    ok, answer = _write(
        real_cluster,
        now,
        merge_patch(now, wl.template_patch(now, "Deployment", wl.reverse(moves), plan_id="")),
    )
    assert ok, answer


@pytest.mark.parametrize("change", sorted(ALLOWED_MOVES))
def test_a_request_may_move_between_managed_gpu_resources(
    real_cluster: RealCluster, chart: str, namespace: str, change: str
) -> None:
    live = _live_deployment(real_cluster, namespace)
    new = copy.deepcopy(live)
    ALLOWED_MOVES[change](new)
    ok, answer = _write(real_cluster, live, new)
    assert ok, answer


@pytest.mark.parametrize(
    "table,change",
    [("forbidden", c) for c in sorted(FORBIDDEN)]
    + [("outside the allow-list", c) for c in sorted(OUTSIDE_THE_ALLOW_LIST)],
)
def test_every_other_workload_change_is_refused(
    real_cluster: RealCluster, chart: str, namespace: str, table: str, change: str
) -> None:
    live = _live_deployment(real_cluster, namespace)
    new = copy.deepcopy(live)
    mutate: Callable[[dict[str, Any]], object] = (
        FORBIDDEN if table == "forbidden" else OUTSIDE_THE_ALLOW_LIST
    )[change]
    if table == "forbidden":
        new["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-1g.10gb"] = (
            "1"
        )
    mutate(new)
    ok, answer = _write(real_cluster, live, new)
    assert not ok, f"a {change} change was admitted"
    # refused by the policy, or before it by the API's own validation (an extended resource
    # requested without its limit)
    assert _refused_by_policy(answer) or " is invalid: " in answer, answer


def test_only_the_rightsizer_is_bound(real_cluster: RealCluster, chart: str, namespace: str) -> None:
    live = _live_deployment(real_cluster, namespace)
    new = copy.deepcopy(live)
    new["spec"]["template"]["spec"]["containers"][0]["image"] = "registry.example/train:2"
    ok, answer = _write(real_cluster, live, new)
    assert not ok and _refused_by_policy(answer), answer
    ok, answer = _write(real_cluster, live, new, user=None)  # the cluster's admin
    assert ok, answer


def _node(cluster: RealCluster, name: str) -> dict[str, Any]:
    world.add_gpu_node(cluster, name, config="all-1g.10gb")
    cluster.kube.merge_patch(
        "v1",
        "Node",
        name,
        {
            "metadata": {"annotations": {"example.com/rack": "r1"}},
            "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
        },
    )
    live: dict[str, Any] | None = cluster.kube.get("v1", "Node", name)
    assert live is not None
    live.pop("status", None)
    live["metadata"].pop("managedFields", None)
    return live


def test_apply_node_patches_are_admitted(real_cluster: RealCluster, chart: str) -> None:
    live = _node(real_cluster, "admission-node-ok")
    cordoned = merge_patch(
        live, protocol.cordon_patch(protocol.view(live), plan_id="p", target="all-3g.40gb", now="t")
    )
    ok, answer = _write(real_cluster, live, cordoned)
    assert ok, answer
    live = real_cluster.kube.get("v1", "Node", "admission-node-ok") or {}
    live.pop("status", None)
    relabeled = merge_patch(live, protocol.relabel_patch(protocol.view(live), target="all-3g.40gb"))
    ok, answer = _write(real_cluster, live, relabeled)
    assert ok, answer
    live = real_cluster.kube.get("v1", "Node", "admission-node-ok") or {}
    live.pop("status", None)
    ok, answer = _write(
        real_cluster, live, merge_patch(live, protocol.rollback_patch(protocol.view(live), reason="x"))
    )
    assert ok, answer


@pytest.mark.parametrize("change", sorted(set(NODE_FORBIDDEN) - {"providerID"}))
def test_node_changes_outside_the_allow_list_are_refused(
    real_cluster: RealCluster, chart: str, change: str
) -> None:
    """(``providerID`` is left out: the API server itself refuses to change it once set.)"""
    name = "admission-node-" + re.sub(r"[^a-z0-9]+", "-", change.lower()).strip("-")
    live = _node(real_cluster, name)
    new = copy.deepcopy(live)
    new["metadata"]["labels"]["nvidia.com/mig.config"] = "all-3g.40gb"
    NODE_FORBIDDEN[change](new)
    ok, answer = _write(real_cluster, live, new)
    assert not ok and _refused_by_policy(answer), f"{change}: {answer}"


def test_only_the_mig_managers_config_name_of_the_cluster_policy_may_change(
    real_cluster: RealCluster, chart: str
) -> None:
    live = real_cluster.kube.get("nvidia.com/v1", "ClusterPolicy", "cluster-policy")
    assert live is not None
    live.pop("status", None)
    live["metadata"].pop("managedFields", None)
    renamed = merge_patch(live, {"spec": {"migManager": {"config": {"name": "gpupilot-mig-parted-config"}}}})
    for patch in (
        {"spec": {"driver": {"image": "evil"}}},
        {"spec": {"migManager": {"hostNetwork": True}}},
        {"spec": {"migManager": {"config": {"default": "all-1g.10gb"}}}},
        {"metadata": {"labels": {"a": "b"}}},
    ):
        ok, answer = _write(real_cluster, live, merge_patch(renamed, patch))
        assert not ok and _refused_by_policy(answer), f"{patch}: {answer}"
    ok, answer = _write(real_cluster, live, renamed)
    assert ok, answer
    back = real_cluster.kube.get("nvidia.com/v1", "ClusterPolicy", "cluster-policy") or {}
    back.pop("status", None)
    ok, answer = _write(
        real_cluster,
        back,
        merge_patch(back, {"spec": {"migManager": {"config": {"name": "default-mig-parted-config"}}}}),
    )
    assert ok, answer
