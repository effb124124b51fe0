"""The exporter DaemonSet as shipped, against the simulated MIG Manager's pause protocol.

mig-parted >= v0.15.0 (GPU Operator >= v26.7.0) pauses ``nvidia.com/gpu.deploy.client`` and waits
for the pods of every DaemonSet whose ``nodeSelector`` carries that key; node affinity is not looked
at. The test renders deploy/exporter (which leaves on dcgm-exporter's pause, any operator version) and
with its mig-pause-client component with the real kustomize, places it with the simulated
DaemonSet controller, relabels the node, and reads the journal's order.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_manifests import DEPLOY, find
from tests.support.kubedouble import KubeDouble, MigManagerSettings
from tests.support.yamldocs import load_all

NODE_LABELS = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.deploy.client": "true",
    "nvidia.com/gpu.deploy.dcgm-exporter": "true",
    "nvidia.com/gpu.deploy.device-plugin": "true",
}


def client_daemonset(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOY / "exporter", tmp_path)],
                "components": [os.path.relpath(DEPLOY / "exporter" / "mig-pause-client", tmp_path)],
            }
        )
    )
    out = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True, check=True)
    return next(d for d in load_all(out.stdout) if d["kind"] == "DaemonSet")


def run_reconfiguration(daemonset: dict[str, Any]) -> tuple[list[tuple[str, str, dict[str, Any]]], list[str]]:
    settings = MigManagerSettings(pending_s=0.01, apply_s=0.01, client_wait_s=5.0)
    with KubeDouble(mig_manager=settings, daemonset_delete_delay_s=0.3) as kube:
        kube.add_node("gpu-a", model="H100 80GB", gpus=1, mig_config="all-disabled")
        kube.store.update(
            "/nodes", "", "gpu-a", lambda n: n["metadata"].setdefault("labels", {}).update(NODE_LABELS)
        )
        kube.add_daemonset(daemonset, namespace="gpupilot")
        kube.wait_for(lambda: len(kube.pods(node="gpu-a")) == 1, what="the exporter on gpu-a")
        kube.store.update(
            "/nodes",
            "",
            "gpu-a",
            lambda n: n["metadata"]["labels"].update({"nvidia.com/mig.config": "all-1g.10gb"}),
        )
        kube.wait_for(
            lambda: kube.mig_manager.states("gpu-a")[-1:] == ["success"], timeout=10, what="success"
        )
        kube.wait_for(
            lambda: len(kube.actions(verb="daemonset-controller")) == 3, what="the exporter back on gpu-a"
        )
        journal = [(a.verb, a.name, dict(a.detail)) for a in kube.actions()]
        return journal, kube.mig_manager.states("gpu-a")


def order(journal: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    steps = []
    for verb, _name, detail in journal:
        if verb == "mig-manager" and "state" in detail:
            steps.append(f"state:{detail['state']}")
        elif verb == "daemonset-controller":
            steps.append(f"exporter:{detail['op']}")
        elif verb == "mig-manager" and "waited_for" in detail:
            steps.append("waited")
    return steps


@pytest.mark.slow
def test_mig_manager_waits_for_the_client_component(tmp_path: Path) -> None:
    journal, states = run_reconfiguration(client_daemonset(tmp_path))
    assert states == ["pending", "success"]
    steps = order(journal)
    assert steps[:4] == ["exporter:create", "state:pending", "exporter:delete", "waited"], steps
    assert steps.index("state:success") > steps.index("waited"), steps
    assert steps.count("exporter:create") == 2, "back once the label is true again"


@pytest.mark.slow
def test_affinity_alone_is_invisible_to_the_mig_manager() -> None:
    """The shipped default (every operator version) leaves on the pause, but nobody waits for it."""
    journal, _ = run_reconfiguration(find("exporter", "DaemonSet", "gpupilot-exporter"))
    steps = order(journal)
    assert "waited" not in steps
    assert steps.index("state:success") < steps.index("exporter:delete"), (
        "reconfiguration finished while the exporter still held NVML handles: " + repr(steps)
    )
