"""The forged-annotation attack against the real control plane: a node's own kubelet identity
(``system:node:<name>``, group ``system:nodes``: the Node authorizer and NodeRestriction let it write
its own Node's annotations) writes an in-flight change naming a workload on another node; an
``apply`` under the chart's RBAC and admission policies, with the rightsizer's ServiceAccount token,
sets it aside: the victim's GPU request and the attacking node stay as they were, and the plan's own
node is changed. The same scenario as the API double's test (tests/support/rightsizer/forged_node)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from rightsizer.apply.applier import Applier
from rightsizer.clients.kube import Kube, KubeSettings
from tests.kube import world
from tests.kube.conftest import RealCluster
from tests.kube.test_apply import SETTINGS
from tests.support.rightsizer import forged_node as attack
from tests.support.rightsizer.apply_support import resize_plan

MIG3 = "nvidia.com/mig-3g.40gb"


@pytest.fixture(scope="module")
def rightsizer(real_cluster: RealCluster, chart: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart installed (once per run: the ``chart`` fixture); its rightsizer's token."""
    where = tmp_path_factory.mktemp("rightsizer-forged")
    return world.service_account_kubeconfig(real_cluster, where, world.RELEASE_NS, "gpupilot-rightsizer")


def kubelet_kubeconfig(cluster: RealCluster, node: str, where: Path) -> Path:
    """A client certificate for the node's kubelet, issued by the cluster CA as the TLS bootstrap does."""
    cert = cluster.cp.certs.ca.issue(
        where, cn=f"system:node:{node}", orgs=("system:nodes",), stem=f"kubelet-{node}"
    )
    return Path(cluster.cp.kubeconfig_for(f"kubelet-{node}", cert))


def test_a_kubelets_forged_in_flight_annotations_steer_nothing(
    real_cluster: RealCluster, namespace: str, rightsizer: Path, tmp_path: Path
) -> None:
    started = time.time()
    planned, forger, victims = (f"{namespace[:36]}-{n}" for n in ("gpu", "evil", "other"))
    world.add_gpu_node(real_cluster, planned, config="all-3g.40gb")
    world.add_gpu_node(real_cluster, forger, config="all-3g.40gb")
    world.add_gpu_node(real_cluster, victims, config="all-disabled")
    world.deployment(real_cluster, namespace, "reports", resources={MIG3: 1}, node=planned)
    world.deployment(real_cluster, namespace, attack.VICTIM, resources={attack.GPU: 1}, node=victims)
    (pod,) = world.wait(
        lambda: world.running_pods(real_cluster, namespace, "reports"), what="reports Running"
    )
    target = attack.Target.from_kubeconfigs(
        rightsizer=rightsizer,
        node=kubelet_kubeconfig(real_cluster, forger, tmp_path),
        admin=real_cluster.kubeconfig,
    )
    assert attack.node_may_write_record(target, SETTINGS.namespace) == 403  # the record is out of reach
    attack.rollback_attack(target, forger, previous="all-1g.10gb", config="all-3g.40gb", namespace=namespace)
    before = attack.node_state(target, forger)
    assert (
        before["annotations"]["gpupilot.io/step"] == "cordoned"
    )  # the real API server let the node write it
    untouched = attack.victim_requests(target, namespace)
    plan = resize_plan(
        planned, "all-3g.40gb", {"1g.10gb": 7}, [(namespace, pod["metadata"]["name"], "1g.10gb")]
    )
    kube = Kube.connect(KubeSettings(kubeconfig=rightsizer))
    try:
        report = Applier(kube, plan, dataclasses.replace(SETTINGS)).run()
    finally:
        kube.close()
    assert [(o.node, o.result) for o in report.outcomes] == [(planned, "applied")]
    assert (
        attack.victim_requests(target, namespace)
        == untouched
        == {f"{part}/{attack.GPU}": "1" for part in ("limits", "requests")}
    )
    assert attack.node_state(target, forger) == before
    assert world.refused(real_cluster, world.RIGHTSIZER, since=started) == []
