"""The chart's settings for shared and renamed GPUs: exporter.sharing.virtualGpus passes
--kubernetes-virtual-gpus (dcgm-exporter 4.5.3's KUBERNETES_VIRTUAL_GPUS) and exporter.resourceNames
--nvidia-resource-names (NVIDIA_RESOURCE_NAMES), rendered with the real helm and read back by the
exporter's own flag parser; off by default; a name that is not domain/name is refused by the schema."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.commands.cli import parse_settings
from tests.deploy.test_helm import CHART, run_helm, template


def _exporter_args(*sets: str) -> list[str]:
    (ds,) = (o for o in template("defaults", *sets) if o["kind"] == "DaemonSet")
    container: dict[str, Any] = ds["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["gpupilot-exporter"]
    args: list[str] = container["args"]
    return args


@pytest.mark.slow
def test_shared_gpu_settings_are_off_by_default() -> None:
    args = _exporter_args()
    assert not [a for a in args if a.startswith(("--kubernetes-virtual-gpus", "--nvidia-resource-names"))]
    settings = parse_settings(args, environ={"NODE_NAME": "gpu-node-1"})
    assert settings.layout.virtual_gpus is False and settings.resource_names == ()


@pytest.mark.slow
def test_virtual_gpus_and_resource_names_reach_the_exporter() -> None:
    args = _exporter_args(
        "exporter.sharing.virtualGpus=true",
        "exporter.processes.enabled=true",
        "exporter.resourceNames={nvidia.com/a100,example.com/gpu.shared}",
    )
    assert "--kubernetes-virtual-gpus" in args
    assert "--nvidia-resource-names=nvidia.com/a100,example.com/gpu.shared" in args
    settings = parse_settings(args, environ={"NODE_NAME": "gpu-node-1"})
    assert settings.layout.virtual_gpus is True
    assert settings.resource_names == ("nvidia.com/a100", "example.com/gpu.shared")


@pytest.mark.slow
def test_virtual_gpus_without_process_access_fail_in_one_line() -> None:
    """Each pod's share of a shared GPU comes from the processes NVML lists (hostPID): without them
    every pod would read 0 % and an HPA on it would scale to its minimum. The chart refuses."""
    res = run_helm("template", "gpupilot", str(CHART), "--set", "exporter.sharing.virtualGpus=true")
    assert res.returncode != 0
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert "exporter.sharing.virtualGpus needs exporter.processes.enabled=true" in line


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "where"),
    [
        ("exporter.resourceNames={a100}", "/exporter/resourceNames/0"),
        ("exporter.resourceNames={nvidia.com/a100,nvidia.com/a100}", "/exporter/resourceNames"),
        ("exporter.sharing.virtualGpus=yes", "/exporter/sharing/virtualGpus"),
        ("exporter.sharing.vgpus=true", "/exporter/sharing"),
    ],
)
def test_the_schema_refuses_bad_sharing_values(setting: str, where: str) -> None:
    res = run_helm("template", "gpupilot", str(CHART), "--set", setting)
    assert res.returncode != 0
    assert where in res.stderr, res.stderr
