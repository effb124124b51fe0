"""``apply`` on the real control plane, under the chart's own RBAC and admission policies (the
rightsizer's ServiceAccount token): cordon, evictions that the real PodDisruptionBudgets allow or
refuse, the workload's GPU request patched, the MIG Manager stand-in re-partitioning through the
node-label protocol, the real scheduler placing the re-created pods on the new slices, every
workload Running, the node uncordoned; a failed MIG Manager state and a workload the scheduler
cannot place roll back. Every call the rightsizer makes is authorized by the rendered RBAC (no 403
in the audit log)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from rightsizer.apply import protocol as proto
from rightsizer.apply.applier import Applier
from rightsizer.clients.kube import Kube, KubeSettings
from tests.kube import world
from tests.kube.conftest import RealCluster
from tests.support.rightsizer.apply_support import FAST, resize_plan

MIG1, MIG2, MIG3 = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"
SETTINGS = dataclasses.replace(
    FAST, timeout_s=60, eviction_timeout_s=20, settle_timeout_s=45, lease_duration_s=15, api_retry_s=20
)


@pytest.fixture(scope="module")
def rightsizer(real_cluster: RealCluster, chart: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart's rightsizer (auto-apply) installed; a kubeconfig with its ServiceAccount's token."""
    where = tmp_path_factory.mktemp("rightsizer")
    return world.service_account_kubeconfig(real_cluster, where, world.RELEASE_NS, "gpupilot-rightsizer")


def _apply(kubeconfig: Path, plan, settings=SETTINGS):
    kube = Kube.connect(KubeSettings(kubeconfig=kubeconfig))
    try:
        return Applier(kube, plan, settings).run()
    finally:
        kube.close()


def _node(cluster: RealCluster, namespace: str) -> str:
    return f"{namespace[:40]}-gpu".strip("-")


def test_a_workload_moved_from_3g_to_1g_ends_running_on_a_1g_slice(
    real_cluster: RealCluster, namespace: str, rightsizer: Path
) -> None:
    started = time.time()
    node = _node(real_cluster, namespace)
    world.add_gpu_node(real_cluster, node, config="all-3g.40gb")
    world.deployment(real_cluster, namespace, "reports", resources={MIG3: 1}, node=node)
    (pod,) = world.wait(
        lambda: world.running_pods(real_cluster, namespace, "reports"), what="reports Running"
    )
    plan = resize_plan(node, "all-3g.40gb", {"1g.10gb": 7}, [(namespace, pod["metadata"]["name"], "1g.10gb")])

    report = _apply(rightsizer, plan)

    (out,) = report.outcomes
    assert out.result == "applied", out
    (now,) = world.running_pods(real_cluster, namespace, "reports")
    assert now["metadata"]["name"] != pod["metadata"]["name"]
    assert now["spec"]["nodeName"] == node, "the real scheduler placed it on the re-partitioned node"
    assert world.limits_of(now["spec"]) == {MIG1: "1"}
    obj = real_cluster.kube.get("v1", "Node", node)
    assert obj is not None
    assert obj["status"]["allocatable"][MIG1] == "7" and MIG3 not in obj["status"]["allocatable"]
    assert not obj["spec"].get("unschedulable"), "uncordoned"
    labels = obj["metadata"]["labels"]
    assert labels[proto.CONFIG_LABEL] == plan.nodes[0].config_name
    assert labels["nvidia.com/mig.config.state"] == "success"
    assert real_cluster.manager.states(node)[-2:] == ["pending", "success"]
    assert world.refused(real_cluster, world.RIGHTSIZER, since=started) == []


def test_a_pdb_that_allows_one_at_a_time_waits_for_each_replacement(
    real_cluster: RealCluster, namespace: str, rightsizer: Path
) -> None:
    """Two replicas, minAvailable 1, and room for the new request on a second node of the pool: the
    second eviction is refused (429) until the first replacement is Running and Ready there, which
    the disruption controller then counts."""
    started = time.time()
    node, spare = _node(real_cluster, namespace), f"{namespace[:36]}-spare".strip("-")
    world.add_gpu_node(real_cluster, node, config="all-3g.40gb", pool=namespace)
    world.add_gpu_node(real_cluster, spare, config="all-2g.20gb", pool=namespace)
    world.deployment(real_cluster, namespace, "serve", resources={MIG3: 1}, pool=namespace, replicas=2)
    world.pdb(real_cluster, namespace, "serve", app="serve", min_available=1)
    pods = world.wait(lambda: len(world.running_pods(real_cluster, namespace, "serve")) == 2 and world.running_pods(real_cluster, namespace, "serve"), what="serve 2/2")  # fmt: skip
    assert {p["spec"]["nodeName"] for p in pods} == {node}
    moves = [(namespace, p["metadata"]["name"], "2g.20gb") for p in pods]
    plan = resize_plan(node, "all-3g.40gb", {"2g.20gb": 3}, moves)

    report = _apply(rightsizer, plan)

    (out,) = report.outcomes
    assert out.result == "applied", out
    now = world.running_pods(real_cluster, namespace, "serve")
    assert len(now) == 2 and all(world.limits_of(p["spec"]) == {MIG2: "1"} for p in now)
    assert world.refused(real_cluster, world.RIGHTSIZER, since=started) == []


def test_replicas_that_can_run_only_on_the_node_cannot_keep_their_pdb(
    real_cluster: RealCluster, namespace: str, rightsizer: Path
) -> None:
    """Both replicas pinned to the node and minAvailable 1: the first eviction is allowed, its
    replacement can run only on the new layout (after the re-partition), so the second eviction is
    refused until --eviction-timeout and the node is rolled back: the budget is kept."""
    node = _node(real_cluster, namespace)
    world.add_gpu_node(real_cluster, node, config="all-3g.40gb")
    world.deployment(real_cluster, namespace, "serve", resources={MIG3: 1}, node=node, replicas=2)
    world.pdb(real_cluster, namespace, "serve", app="serve", min_available=1)
    pods = world.wait(lambda: len(world.running_pods(real_cluster, namespace, "serve")) == 2 and world.running_pods(real_cluster, namespace, "serve"), what="serve 2/2")  # fmt: skip
    moves = [(namespace, p["metadata"]["name"], "2g.20gb") for p in pods]
    plan = resize_plan(node, "all-3g.40gb", {"2g.20gb": 3}, moves)

    report = _apply(rightsizer, plan, dataclasses.replace(SETTINGS, eviction_timeout_s=8))

    (out,) = report.outcomes
    assert out.result == "rolled-back", out
    assert "violate the pod's disruption budget" in out.reason, out.reason  # the API server's own words
    obj = real_cluster.kube.get("v1", "Node", node)
    assert obj is not None and obj["metadata"]["labels"][proto.CONFIG_LABEL] == "all-3g.40gb"
    back = world.wait(lambda: len(world.running_pods(real_cluster, namespace, "serve")) == 2 and world.running_pods(real_cluster, namespace, "serve"), what="serve 2/2 again")  # fmt: skip
    assert all(world.limits_of(p["spec"]) == {MIG3: "1"} for p in back)


def test_a_pdb_that_allows_nothing_stops_the_node_before_the_relabel(
    real_cluster: RealCluster, namespace: str, rightsizer: Path
) -> None:
    """One replica and minAvailable 1: every eviction is a 429 until --eviction-timeout; the node
    is rolled back (template restored, uncordoned) and its MIG layout never touched."""
    node = _node(real_cluster, namespace)
    world.add_gpu_node(real_cluster, node, config="all-3g.40gb")
    world.deployment(real_cluster, namespace, "solo", resources={MIG3: 1}, node=node)
    world.pdb(real_cluster, namespace, "solo", app="solo", min_available=1)
    (pod,) = world.wait(lambda: world.running_pods(real_cluster, namespace, "solo"), what="solo Running")
    plan = resize_plan(node, "all-3g.40gb", {"1g.10gb": 7}, [(namespace, pod["metadata"]["name"], "1g.10gb")])

    report = _apply(rightsizer, plan, dataclasses.replace(SETTINGS, eviction_timeout_s=6))

    (out,) = report.outcomes
    assert out.result in ("failed", "rolled-back"), out
    assert (
        "disruption budget" in out.reason.lower() or "429" in out.reason or "evict" in out.reason.lower()
    ), out.reason
    obj = real_cluster.kube.get("v1", "Node", node)
    assert obj is not None
    assert obj["metadata"]["labels"][proto.CONFIG_LABEL] == "all-3g.40gb"
    assert not obj["spec"].get("unschedulable")
    assert real_cluster.manager.states(node) == [], "the MIG Manager never saw a new config"
    (still,) = world.running_pods(real_cluster, namespace, "solo")
    assert still["metadata"]["name"] == pod["metadata"]["name"]
    dep = real_cluster.kube.get("apps/v1", "Deployment", "solo", namespace)
    assert dep is not None and world.limits_of(dep["spec"]["template"]["spec"]) == {MIG3: "1"}


def test_two_pdbs_over_one_pod_fail_the_node_at_once(
    real_cluster: RealCluster, namespace: str, rightsizer: Path
) -> None:
    """The API server refuses to evict a pod two budgets select (a 500): no waiting for the timeout."""
    node = _node(real_cluster, namespace)
    world.add_gpu_node(real_cluster, node, config="all-3g.40gb")
    world.deployment(real_cluster, namespace, "twice", resources={MIG3: 1}, node=node, replicas=2)
    world.pdb(real_cluster, namespace, "a", app="twice", min_available=0)
    world.pdb(real_cluster, namespace, "b", app="twice", min_available=0)
    pods = world.wait(lambda: len(world.running_pods(real_cluster, namespace, "twice")) == 2 and world.running_pods(real_cluster, namespace, "twice"), what="twice 2/2")  # fmt: skip
    plan = resize_plan(
        node, "all-3g.40gb", {"1g.10gb": 7}, [(namespace, p["metadata"]["name"], "1g.10gb") for p in pods]
    )

    t0 = time.monotonic()
    report = _apply(rightsizer, plan, dataclasses.replace(SETTINGS, eviction_timeout_s=60))
    took = time.monotonic() - t0

    (out,) = report.outcomes
    assert out.result in ("failed", "rolled-back"), out
    assert "more than one" in out.reason.lower() or "two" in out.reason.lower(), out.reason
    assert took < 40, f"failed at once, not after the eviction timeout ({took:.0f}s)"


def test_a_failed_mig_manager_state_rolls_the_node_back(
    real_cluster: RealCluster, namespace: str, rightsizer: Path
) -> None:
    node = _node(real_cluster, namespace)
    world.add_gpu_node(real_cluster, node, config="all-3g.40gb")
    world.deployment(real_cluster, namespace, "reports", resources={MIG3: 1}, node=node)
    (pod,) = world.wait(
        lambda: world.running_pods(real_cluster, namespace, "reports"), what="reports Running"
    )
    real_cluster.manager.failing_nodes[node] = "Xid 79: GPU has fallen off the bus (injected)"
    plan = resize_plan(node, "all-3g.40gb", {"1g.10gb": 7}, [(namespace, pod["metadata"]["name"], "1g.10gb")])

    report = _apply(rightsizer, plan)

    (out,) = report.outcomes
    assert out.result == "rolled-back", out
    obj = real_cluster.kube.get("v1", "Node", node)
    assert obj is not None
    assert obj["metadata"]["labels"][proto.CONFIG_LABEL] == "all-3g.40gb"
    assert obj["metadata"]["annotations"][proto.ANN_STEP] == "rolled-back"
    assert not obj["spec"].get("unschedulable")
    dep = real_cluster.kube.get("apps/v1", "Deployment", "reports", namespace)
    assert dep is not None and world.limits_of(dep["spec"]["template"]["spec"]) == {MIG3: "1"}
    (back,) = world.wait(
        lambda: world.running_pods(real_cluster, namespace, "reports"),
        what="reports Running on 3g.40gb again",
    )
    assert back["spec"]["nodeName"] == node and world.limits_of(back["spec"]) == {MIG3: "1"}


def test_a_workload_the_scheduler_cannot_place_rolls_back_with_its_reason(
    real_cluster: RealCluster, namespace: str, rightsizer: Path
) -> None:
    """The new layout has no 1g.10gb and the workload is pinned there: the replacement stays
    Pending, and the reason is the real scheduler's."""
    node = _node(real_cluster, namespace)
    world.add_gpu_node(real_cluster, node, config="all-3g.40gb")
    world.deployment(real_cluster, namespace, "pinned", resources={MIG3: 1}, node=node)
    (pod,) = world.wait(lambda: world.running_pods(real_cluster, namespace, "pinned"), what="pinned Running")
    plan = resize_plan(node, "all-3g.40gb", {"2g.20gb": 3}, [(namespace, pod["metadata"]["name"], "1g.10gb")])

    report = _apply(rightsizer, plan, dataclasses.replace(SETTINGS, settle_timeout_s=8))

    (out,) = report.outcomes
    assert out.result == "rolled-back", out
    assert "Unschedulable" in out.reason and "nodes are available" in out.reason, out.reason
    dep = real_cluster.kube.get("apps/v1", "Deployment", "pinned", namespace)
    assert dep is not None and world.limits_of(dep["spec"]["template"]["spec"]) == {MIG3: "1"}
