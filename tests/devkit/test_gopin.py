"""devkit.gopin without the network: Kubernetes' staging replaces mapped to the published modules,
folder replaces refused otherwise, module file names for ``go build -modfile``, and the control plane's
committed go.mod files naming the command that writes them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from devkit import gobuild
from devkit.gopin import (
    PinError,
    command,
    has_main,
    main,
    module_files,
    replace_block,
    replaces,
    staging_replaces,
    staging_version,
)


def _staging(path: str) -> dict[str, dict[str, str]]:
    return {"Old": {"Path": path}, "New": {"Path": f"./staging/src/{path}"}}


KUBERNETES: dict[str, object] = {
    "Module": {"Path": "k8s.io/kubernetes"},
    "Go": "1.26.0",
    "Require": [
        {"Path": "github.com/spf13/cobra", "Version": "v1.10.0"},
        {"Path": "k8s.io/kubectl", "Version": "v0.0.0"},
        {"Path": "k8s.io/api", "Version": "v0.0.0"},
        {"Path": "k8s.io/sample-apiserver", "Version": "v0.0.0"},
    ],
    "Replace": [
        _staging("k8s.io/api"),
        _staging("k8s.io/kubectl"),
        _staging("k8s.io/sample-apiserver"),
        _staging("k8s.io/sample-controller"),  # replaced, never required
        {"Old": {"Path": "example.com/fork"}, "New": {"Path": "example.com/fork", "Version": "v1.2.3"}},
    ],
}


def test_staging_modules_upstream_requires_map_to_the_published_release() -> None:
    assert staging_replaces(KUBERNETES, "v1.37.2") == [
        ("k8s.io/api", "v0.37.2"),
        ("k8s.io/kubectl", "v0.37.2"),
        ("k8s.io/sample-apiserver", "v0.37.2"),
    ]


def test_with_staging_the_versioned_replaces_are_still_copied() -> None:
    assert replaces(KUBERNETES, "k8s.io/kubernetes", staging=True) == [
        "-replace=example.com/fork=example.com/fork@v1.2.3"
    ]


def test_without_staging_a_folder_replace_stops_the_pin_and_names_the_option() -> None:
    with pytest.raises(
        PinError, match=r"replaces k8s.io/api with the folder ./staging/src/k8s.io/api.*--staging"
    ):
        replaces(KUBERNETES, "k8s.io/kubernetes")


@pytest.mark.parametrize("folder", ["./staging/src/k8s.io/apimachinery", "../api", "./staging/src/"])
def test_a_folder_that_is_not_the_modules_own_staging_folder_is_refused_with_staging(folder: str) -> None:
    mod: dict[str, object] = {
        "Require": [{"Path": "k8s.io/api", "Version": "v0.0.0"}],
        "Replace": [{"Old": {"Path": "k8s.io/api"}, "New": {"Path": folder}}],
    }
    assert staging_replaces(mod, "v1.37.2") == []
    with pytest.raises(PinError, match=re.escape(f"with the folder {folder}, ")):
        replaces(mod, "k8s.io/kubernetes", staging=True)


@pytest.mark.parametrize(
    ("release", "published"),
    [
        ("v1.37.2", "v0.37.2"),
        ("v1.34.4", "v0.34.4"),
        ("v1.38.0-rc.1", "v0.38.0-rc.1"),
        ("v1.100.10", "v0.100.10"),
    ],
)
def test_staging_version(release: str, published: str) -> None:
    assert staging_version(release) == published


@pytest.mark.parametrize("release", ["1.37.2", "v2.0.0", "v1.37", "v0.37.2", "v1.37.2 "])
def test_a_release_that_is_not_v1_minor_patch_is_refused(release: str) -> None:
    with pytest.raises(PinError, match=re.escape("needs a Kubernetes release v1.MINOR.PATCH")):
        staging_version(release)


def test_replace_block_is_one_block_under_its_comment() -> None:
    block = replace_block([("k8s.io/api", "v0.37.2"), ("k8s.io/kubectl", "v0.37.2")], "made by X")
    assert block == (
        "\n// made by X\nreplace (\n"
        "\tk8s.io/api => k8s.io/api v0.37.2\n"
        "\tk8s.io/kubectl => k8s.io/kubectl v0.37.2\n)\n"
    )
    assert replace_block([], "made by X") == ""


@pytest.mark.parametrize(
    ("modfile", "files"),
    [
        ("go.mod", ("go.mod", "go.sum")),
        ("go-1.34.mod", ("go-1.34.mod", "go-1.34.sum")),
        ("a.mod.mod", ("a.mod.mod", "a.mod.sum")),
    ],
)
def test_module_files_are_named_as_go_build_modfile_names_them(modfile: str, files: tuple[str, str]) -> None:
    assert module_files(modfile) == files


@pytest.mark.parametrize("modfile", ["go-1.34", "go.sum", ".mod", "sub/go.mod", "../go.mod", ".go.mod"])
def test_a_modfile_that_is_not_a_plain_mod_file_name_is_refused(modfile: str) -> None:
    with pytest.raises(PinError, match=re.escape(f"--modfile {modfile}: give a file name ending in .mod")):
        module_files(modfile)


def test_a_bad_modfile_is_one_line_before_any_download(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kube", "k8s.io/kubernetes@v1.37.2", "--staging", "--modfile", "go-1.34"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("devkit.gopin: --modfile go-1.34: ")


def test_a_folder_needs_packages_or_a_main_of_its_own(tmp_path: Path) -> None:
    assert not has_main(tmp_path)
    (tmp_path / "crds.go").write_text("//go:build tools\n\npackage tools\n")
    assert not has_main(tmp_path)
    (tmp_path / "main.go").write_text("// Command x.\npackage main\n\nfunc main() {}\n")
    assert has_main(tmp_path)
    assert has_main(gobuild.ROOT / "kube")


def test_the_command_renders_every_option_once() -> None:
    how = command(
        "kube",
        "k8s.io/kubernetes@v1.34.4",
        [],
        staging=True,
        extra_requires=["go.etcd.io/etcd/server/v3@v3.6.4"],
        extra_replaces=["a=b@v1.0.0"],
        go_version="1.24.0",
        toolchain="go1.26.8",
        modfile="go-1.34.mod",
    )
    assert how == (
        "python -m devkit.gopin kube k8s.io/kubernetes@v1.34.4 --staging"
        " --require go.etcd.io/etcd/server/v3@v3.6.4 --replace a=b@v1.0.0 --go 1.24.0"
        " --toolchain go1.26.8 --modfile go-1.34.mod"
    )
    assert command("x", "m@v1", ["m/cmd/a", "m/cmd/b"]) == "python -m devkit.gopin x m@v1 m/cmd/a m/cmd/b"


@pytest.mark.parametrize(("tool", "etcd"), [("kube", "v3.7.0"), ("kube-1.34", "v3.6.4")])
def test_the_control_planes_module_names_the_command_that_writes_it(tool: str, etcd: str) -> None:
    spec = gobuild.TOOLS[tool]
    modfile = spec.modfile or "go.mod"
    text = (spec.module_dir / modfile).read_text()
    how = command("kube", f"k8s.io/kubernetes@{spec.release}", [], staging=True, modfile=modfile)
    comment = f"// k8s.io/kubernetes {spec.release}'s staging modules as published at {staging_version(spec.release)}: {how}\nreplace (\n"
    assert comment in text
    assert f"\tk8s.io/kubernetes {spec.release}\n" in text
    assert f"\tgo.etcd.io/etcd/server/v3 {etcd}\n" in text
