"""``validate --node``: the node's MIG Manager profile list (v26.3+) is the authority for that node.

Runs against the Kubernetes API double over real HTTP with the official client.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rightsizer.cli import main
from tests.support.kubedouble import KubeDouble


def node_document(counts: dict[str, int], *, device_filter: str | None = None) -> str:
    """What the MIG Manager writes per node: all-disabled plus all-<profile> with the most that fit."""
    configs: dict[str, list[dict[str, object]]] = {"all-disabled": [{"devices": "all", "mig-enabled": False}]}
    for name, count in counts.items():
        entry: dict[str, object] = {"devices": "all", "mig-enabled": True, "mig-devices": {name: count}}
        if device_filter:
            entry = {"device-filter": device_filter, **entry}
        configs[f"all-{name}"] = [entry]
    return yaml.safe_dump({"version": "v1", "mig-configs": configs})


def config_file(tmp_path: Path, devs: dict[str, int], *, filt: str | None = None) -> Path:
    path = tmp_path / "mine.yaml"
    entry: dict[str, object] = {"devices": "all", "mig-enabled": True, "mig-devices": devs}
    if filt:
        entry["device-filter"] = filt
    doc = {"version": "v1", "mig-configs": {"mine": [entry]}}
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
def test_a_gpu_newer_than_the_catalogue_is_checked_against_its_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    future = {"1g.30gb": 7, "1g.60gb": 4, "2g.60gb": 3, "3g.120gb": 2, "4g.120gb": 1, "7g.240gb": 1}
    with KubeDouble() as kube:
        kube.add_node("gpu-x", labels={"nvidia.com/gpu.product": "NVIDIA-X300"})
        kube.add_configmap(
            "gpu-x-mig-config", data={"config.yaml": node_document(future, device_filter="0x3FFF10DE")}
        )
        cfg = kube.write_kubeconfig(tmp_path / "kc")
        ok = config_file(tmp_path, {"1g.30gb": 2, "3g.120gb": 1})
        assert main(["validate", str(ok)]) == 1  # the catalogue alone: these names fit no GPU
        capsys.readouterr()
        assert main(["validate", str(ok), "--node", "gpu-x", "--kubeconfig", str(cfg)]) == 0
        out = capsys.readouterr().out
        assert "offered by node gpu-x's MIG Manager" in out
        assert "note: node gpu-x: its GPU is not in the geometry catalogue; using the 6 profile(s)" in out
        bad = config_file(tmp_path, {"1g.30gb": 8})
        assert main(["validate", str(bad), "--node", "gpu-x", "--kubeconfig", str(cfg)]) == 1
        assert "1g.30gb×8 exceeds the 7 node gpu-x's MIG Manager allows" in capsys.readouterr().err


@pytest.mark.slow
def test_disagreements_with_the_catalogue_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A driver that names the two-slice 1g profile 1g.19gb and does not offer 4g.40gb.
    node_list = {"1g.10gb": 7, "1g.10gb+me": 1, "1g.19gb": 4, "2g.20gb": 3, "3g.40gb": 2, "7g.80gb": 1}
    with KubeDouble() as kube:
        kube.add_node("gpu-a", model="H100 80GB")
        kube.add_configmap("gpu-a-mig-config", data={"config.yaml": node_document(node_list)})
        cfg = kube.write_kubeconfig(tmp_path / "kc")
        args = ["--node", "gpu-a", "--kubeconfig", str(cfg)]
        assert main(["validate", str(config_file(tmp_path, {"1g.19gb": 4})), *args]) == 0
        out = capsys.readouterr().out
        assert "its MIG Manager offers 1g.19gb, which the catalogue's H100 80GB lacks" in out
        assert "the catalogue's H100 80GB has 4g.40gb; its MIG Manager does not list it" in out
        # Unfiltered, it may be another GPU's config in a shared file: not for this node.
        assert main(["validate", str(config_file(tmp_path, {"4g.40gb": 1})), *args]) == 0
        assert "not for this device  profile 4g.40gb is not offered on node gpu-a" in capsys.readouterr().out
        # Filtered to this GPU, it is an error.
        assert main(["validate", str(config_file(tmp_path, {"4g.40gb": 1}, filt="0x233010DE")), *args]) == 1
        assert "profile 4g.40gb is not offered on node gpu-a" in capsys.readouterr().err
        # The node's names still need a placement the catalogue knows: 3g + 3g + 1g does not fit.
        assert main(["validate", str(config_file(tmp_path, {"3g.40gb": 2, "1g.10gb": 1})), *args]) == 1
        assert "no valid placement" in capsys.readouterr().err


@pytest.mark.slow
def test_without_the_per_node_configmap_the_catalogue_is_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with KubeDouble() as kube:
        kube.add_node("gpu-b", model="A100 40GB")
        cfg = kube.write_kubeconfig(tmp_path / "kc")
        path = config_file(tmp_path, {"1g.10gb": 4})
        assert main(["validate", str(path), "--node", "gpu-b", "--kubeconfig", str(cfg)]) == 0
        out = capsys.readouterr().out
        assert "A100-SXM4-40GB" in out and "no ConfigMap gpu-operator/gpu-b-mig-config" in out
        assert (
            main(
                [
                    "validate",
                    str(config_file(tmp_path, {"1g.10gb": 7})),
                    "--node",
                    "gpu-b",
                    "--kubeconfig",
                    str(cfg),
                ]
            )
            == 1
        )


@pytest.mark.slow
def test_unknown_node_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with KubeDouble() as kube:
        cfg = kube.write_kubeconfig(tmp_path / "kc")
        path = config_file(tmp_path, {"1g.10gb": 4})
        assert main(["validate", str(path), "--node", "nope", "--kubeconfig", str(cfg)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("error: node nope: HTTP 404")
