"""The rightsizer's error tree: every class has one root, and ``cli.main`` turns it into one line."""

from __future__ import annotations

import pytest

from rightsizer import cli
from rightsizer.apply.configmap import ConfigMapError
from rightsizer.apply.settings import ApplyError
from rightsizer.clients.kube import KubeError, NotFoundError
from rightsizer.clients.prometheus import PrometheusError, PrometheusUnavailable
from rightsizer.commands import validate
from rightsizer.errors import InputError, RightsizerError
from rightsizer.migparted.config import MigPartedError
from rightsizer.plan.model import PlanError
from rightsizer.plan.pipeline import NoInventoryError
from rightsizer.serve.config import ServeConfigError


@pytest.mark.parametrize("cls", [PlanError, MigPartedError, ServeConfigError])
def test_input_errors_exit_2(cls: type[RightsizerError]) -> None:
    assert issubclass(cls, InputError)
    assert cls("x").exit_code == 2


@pytest.mark.parametrize(
    "cls",
    [
        ConfigMapError,
        ApplyError,
        KubeError,
        NotFoundError,
        PrometheusError,
        PrometheusUnavailable,
        NoInventoryError,
    ],
)
def test_failures_exit_1(cls: type[RightsizerError]) -> None:
    assert issubclass(cls, RightsizerError)
    assert not issubclass(cls, InputError)
    assert cls("x").exit_code == 1


@pytest.mark.parametrize(
    ("err", "code"), [(InputError("bad flag --x"), 2), (PrometheusUnavailable("down"), 1)]
)
def test_main_catches_the_tree_once(
    err: RightsizerError,
    code: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path,
) -> None:
    def boom(args: object) -> int:
        raise err

    monkeypatch.setattr(validate, "run", boom)
    f = tmp_path / "c.yaml"
    f.write_text("version: v1\nmig-configs: {}\n")
    assert cli.main(["validate", str(f)]) == code
    out = capsys.readouterr()
    assert out.err.strip() == f"gpupilot-rightsizer validate: error: {err}"
    assert "Traceback" not in out.err
