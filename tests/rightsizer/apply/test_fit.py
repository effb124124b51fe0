"""The fit check before eviction: what the node advertises after the change, per resource replicas."""

from __future__ import annotations

from typing import Any

from rightsizer.apply.fit import advertised, replicas_of, shortfall
from rightsizer.apply.workloads import Change
from rightsizer.plan.model import GpuLayout

MIG1 = "nvidia.com/mig-1g.10gb"


def _pod(name: str, request: dict[str, int]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": name, "labels": {"app": "infer"}},
        "spec": {
            "nodeName": "gpu-a",
            "containers": [{"name": "c", "resources": {"limits": {k: str(v) for k, v in request.items()}}}],
        },
        "status": {"phase": "Running"},
    }


def test_gfd_replicas_labels_apply_to_the_resource_they_name_only():
    labels = {
        "nvidia.com/gpu.replicas": "4",
        "nvidia.com/mig-3g.40gb.replicas": "2",
        "nvidia.com/gpu.count": "2",
        "nvidia.com/mig-1g.10gb.replicas": "1",
    }
    assert replicas_of(labels) == {"nvidia.com/gpu": 4, "nvidia.com/mig-3g.40gb": 2}
    layout = [GpuLayout(0, True, {"1g.10gb": 7}), GpuLayout(1, False)]
    # a time-slicing config replicating nvidia.com/gpu leaves the 7 MIG devices at 7 (not 28)
    assert advertised(layout, strategy="mixed", replicas=replicas_of(labels)) == {
        MIG1: 7,
        "nvidia.com/gpu": 4,
    }


def test_eight_1g_replacements_do_not_fit_seven_instances_under_gpu_time_slicing():
    node = {
        "metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.replicas": "4"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    pods = [_pod(f"infer-{i}", {MIG1: 1}) for i in range(8)]
    change = Change(
        "Deployment", "ml", "infer", 8, {"app": "infer"}, (), tuple(f"ml/infer-{i}" for i in range(8))
    )
    why = shortfall(
        node="gpu-a",
        proposed=[GpuLayout(0, True, {"1g.10gb": 7})],
        strategy="mixed",
        nodes=[node],
        pods=pods,
        evicted={("ml", f"infer-{i}") for i in range(8)},
        changes=[change],
    )
    assert why.startswith(f"{MIG1}: 8 needed") and "but 7 free after the change (gpu-a: 7" in why
