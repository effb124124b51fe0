"""serve's plan job reads the nodes from the cluster wherever it reaches the API (in its pod, or
auto_apply.kubeconfig), as ``plan --kubeconfig`` does: the nodes NVIDIA's DRA driver manages (a
DynamicMIG node is never planned) and each node's MIG strategy and config labels; without the API
it plans from the series alone and says so once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from devkit.cluster.draslices import MigDevice, resource_slice
from rightsizer.commands.serve import LiveJobs
from rightsizer.plan.management import DRA_DYNAMIC
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer.serve_support import config

SLICES = "resource.k8s.io/resourceslices"


@pytest.mark.slow
def test_serve_reads_dynamic_mig_nodes_and_labels_from_the_cluster(tmp_path: Path) -> None:
    gpus = {0: "GPU-00000000-0000-4000-8000-000000000000"}
    with KubeDouble() as kube:
        kube.add_node("gpu-dyn", gpus=1)
        kube.add_node("gpu-plain", gpus=1, strategy="single")
        kube.store.put(
            SLICES,
            resource_slice("gpu-dyn", gpus=gpus, migs=[MigDevice(0, "1g.10gb", 19, 0, 1)]),
            event="ADDED",
        )
        cfg = config(tmp_path)
        reachable = dataclasses.replace(
            cfg,
            auto_apply=dataclasses.replace(
                cfg.auto_apply, kubeconfig=kube.write_kubeconfig(tmp_path / "kubeconfig")
            ),
        )
        view = LiveJobs(reachable)._cluster()  # auto-apply off: read all the same
    assert view is not None and set(view.modes) == {"gpu-dyn"} and view.modes["gpu-dyn"][0] == DRA_DYNAMIC
    assert view.labels["gpu-plain"]["nvidia.com/mig.strategy"] == "single"


@pytest.mark.slow
def test_an_unreachable_api_leaves_the_plan_to_the_series(tmp_path: Path, caplog) -> None:
    cfg = config(tmp_path)
    missing = dataclasses.replace(
        cfg, auto_apply=dataclasses.replace(cfg.auto_apply, enabled=True, kubeconfig=tmp_path / "nope")
    )
    jobs = LiveJobs(missing)
    assert jobs._cluster() is None and jobs._cluster() is None
    assert caplog.text.count("node labels and DRA nodes read from Prometheus only") == 1
