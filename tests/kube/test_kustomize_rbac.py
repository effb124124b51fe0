"""The kustomize install's rights, judged by kube-apiserver: ``deploy/overlays/gpu-operator`` with
the rightsizer's ``auto-apply`` component applied server-side into a control plane of its own (the chart's release
in the shared one owns the same cluster-wide names), then ``apply`` with a token of that
ServiceAccount re-partitions a node with a workload move: nothing is refused (403) and the node
ends on the new layout with the workload Running there. Outside what it was granted, the same
token is refused: no ConfigMap outside its own names, no pod deleted."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devkit.cluster import ControlPlane
from devkit.cluster.kubeclient import Kube
from devkit.cluster.migmanager import MigManager
from devkit.cluster.nodes import add_nodes
from rightsizer.apply.applier import Applier
from rightsizer.clients.kube import Kube as RightsizerKube
from rightsizer.clients.kube import KubeSettings, PermanentKubeError
from tests.kube import world
from tests.kube.conftest import REPO, RealCluster
from tests.kube.test_apply import MIG1, MIG3, SETTINGS
from tests.support.rightsizer.apply_support import resize_plan

SA = "system:serviceaccount:gpupilot:gpupilot-rightsizer"


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[RealCluster]:
    where = Path(tempfile.mkdtemp(prefix="gpupilot-control-plane-kustomize-"))
    cp = ControlPlane(where).start()
    manager = None
    try:
        kube = Kube(cp.admin_kubeconfig)
        add_nodes(kube, [])  # the GPU Operator's objects only
        manager = MigManager(cp.admin_kubeconfig).start()
        yield RealCluster(cp, kube, manager)
    finally:
        if manager is not None:
            manager.stop()
        cp.stop()


def test_the_kustomize_rightsizer_with_auto_apply_has_exactly_the_rights_apply_uses(
    own_cluster: RealCluster, tmp_path: Path
) -> None:
    top = tmp_path / "install"
    top.mkdir()
    (top / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(REPO / "deploy" / "overlays" / "gpu-operator", top)],
                "components": [os.path.relpath(REPO / "deploy" / "rightsizer" / "auto-apply", top)],
            }
        )
    )
    rendered = own_cluster.kubectl("kustomize", str(top)).stdout
    # as users apply it, less the kinds this cluster has no CRD for (cert-manager's, the
    # prometheus-operator's: make e2e installs the latter)
    unserved = {"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate", "Issuer"}
    objs = [o for o in yaml.safe_load_all(rendered) if o and o["kind"] not in unserved]
    own_cluster.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(objs))
    kubeconfig = world.service_account_kubeconfig(own_cluster, tmp_path, "gpupilot", "gpupilot-rightsizer")

    started = time.time()
    own_cluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    world.add_gpu_node(own_cluster, "gpu-a", config="all-3g.40gb")
    world.deployment(own_cluster, "ml", "reports", resources={MIG3: 1}, node="gpu-a")
    (pod,) = world.wait(lambda: world.running_pods(own_cluster, "ml", "reports"), what="reports Running")
    plan = resize_plan("gpu-a", "all-3g.40gb", {"1g.10gb": 7}, [("ml", pod["metadata"]["name"], "1g.10gb")])
    kube = RightsizerKube.connect(KubeSettings(kubeconfig=kubeconfig))
    try:
        report = Applier(kube, plan, dataclasses.replace(SETTINGS, repoint_cluster_policy=True)).run()
        (out,) = report.outcomes
        assert out.result == "applied", out
        assert world.refused(own_cluster, SA, since=started) == []
        (now,) = world.running_pods(own_cluster, "ml", "reports")
        assert world.limits_of(now["spec"]) == {MIG1: "1"} and now["spec"]["nodeName"] == "gpu-a"
        # and no more: a ConfigMap elsewhere, a pod deleted
        with pytest.raises(PermanentKubeError) as err:
            kube.create_configmap("default", "x", {"a": "b"})
        assert err.value.status == 403
    finally:
        kube.close()
    res = own_cluster.kubectl("delete", "pod", now["metadata"]["name"], "-n", "ml", f"--as={SA}", check=False)
    assert res.returncode != 0 and "forbidden" in res.stderr.lower(), res.stderr
