"""serve's plan job with auto-apply on reads the nodes NVIDIA's DRA driver manages from the cluster,
as ``plan --kubeconfig`` does (a DynamicMIG node is never planned); without the API it plans from the
series alone."""

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
def test_auto_apply_reads_dynamic_mig_nodes_from_the_cluster(tmp_path: Path) -> None:
    gpus = {0: "GPU-00000000-0000-4000-8000-000000000000"}
    with KubeDouble() as kube:
        kube.add_node("gpu-dyn", gpus=1)
        kube.add_node("gpu-plain", gpus=1)
        kube.store.put(
            SLICES,
            resource_slice("gpu-dyn", gpus=gpus, migs=[MigDevice(0, "1g.10gb", 19, 0, 1)]),
            event="ADDED",
        )
        cfg = config(tmp_path)
        on = dataclasses.replace(
            cfg,
            auto_apply=dataclasses.replace(
                cfg.auto_apply, enabled=True, kubeconfig=kube.write_kubeconfig(tmp_path / "kubeconfig")
            ),
        )
        modes = LiveJobs(on)._node_modes()
    assert modes is not None and set(modes) == {"gpu-dyn"} and modes["gpu-dyn"][0] == DRA_DYNAMIC
    assert LiveJobs(cfg)._node_modes() is None  # auto-apply off: the series alone


@pytest.mark.slow
def test_an_unreachable_api_leaves_the_plan_to_the_series(tmp_path: Path, caplog) -> None:
    cfg = config(tmp_path)
    missing = dataclasses.replace(
        cfg, auto_apply=dataclasses.replace(cfg.auto_apply, enabled=True, kubeconfig=tmp_path / "nope")
    )
    assert LiveJobs(missing)._node_modes() is None
    assert "DRA nodes read from the series only" in caplog.text
