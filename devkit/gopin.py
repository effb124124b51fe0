"""Write (or rewrite) the Go module of a tool under ``devkit/gotools/<dir>/`` from an upstream release.

``python -m devkit.gopin DIR MODULE@VERSION [PACKAGE ...]`` writes ``go.mod`` with one ``tool``
directive per package (each an upstream main) and the upstream module required at the release, copies
the upstream ``go.mod``'s ``replace`` directives into ours (Go applies ``replace`` only in the main
module, so a tool module that depends on a release with replaces needs the same ones, generated here
from that release's own ``go.mod`` rather than copied by hand), then ``go mod tidy`` fills ``go.sum``.
A folder with a main package of its own (``kube/main.go``) needs no ``tool`` packages: tidy reads its
imports. A replace pointing into the upstream repository's own folders cannot apply to a module
fetched from the proxy: it is reported as one line and the pin stops, except with ``--staging``.

``--staging`` is for ``k8s.io/kubernetes``, whose ``go.mod`` requires its staging modules
(``k8s.io/api``, ``k8s.io/client-go``, …) at ``v0.0.0`` and replaces each with its folder
``./staging/src/<module>``. The same modules are published at ``v0.<minor>.<patch>`` for release
``v1.<minor>.<patch>``: each staging module upstream requires is replaced by that version, in one
``replace`` block under a comment naming the command. ``--modfile NAME`` writes ``NAME`` and its sum
file (``go-1.34.mod``, ``go-1.34.sum``) instead of ``go.mod`` and ``go.sum``, for ``go build
-modfile``: one folder, one main, several pinned releases. The control plane's two modules
(``main.go`` imports etcd, kubectl and client-go; ``go mod tidy`` selects them at the versions the
release and its staging modules require, so no ``--require`` is needed):

    python -m devkit.gopin kube k8s.io/kubernetes@v1.37.2 --staging
    python -m devkit.gopin kube k8s.io/kubernetes@v1.34.4 --staging --modfile go-1.34.mod

The ``go`` line is the upstream release's own, so ``go build`` asks for the Go that upstream asks for.
Both files are written in a scratch folder and moved into place only when ``go mod tidy`` succeeded.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from devkit.gobuild import ROOT

STAGING = "./staging/src/"
"""Where k8s.io/kubernetes keeps its staging modules, one folder per module path."""
_RELEASE = re.compile(r"v1\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?")
_MAIN = re.compile(r"^package main\b", re.MULTILINE)


class PinError(RuntimeError):
    pass


def _go(args: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    res = subprocess.run(["go", *args], cwd=cwd, capture_output=True, text=True, check=False, env=env)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PinError(f"go {' '.join(args)}: {tail[0]}")
    return res.stdout


def upstream_mod(module: str, version: str, *, env: dict[str, str] | None = None) -> dict[str, object]:
    """The upstream release's ``go.mod`` as ``go mod edit -json`` reads it."""
    res = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        cwd="/",
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    try:
        info = json.loads(res.stdout)
    except ValueError:
        info = {"Error": (res.stderr.strip().splitlines() or ["no answer"])[-1]}
    gomod = info.get("GoMod")
    if res.returncode != 0 or not gomod:
        raise PinError(f"{module}@{version}: {info.get('Error', 'no go.mod')}")
    parsed: dict[str, object] = json.loads(_go(["mod", "edit", "-json", gomod]))
    return parsed


def _replace_entries(mod: dict[str, object]) -> list[dict[str, dict[str, str]]]:
    return cast("list[dict[str, dict[str, str]]]", mod.get("Replace") or [])


def _is_staging(rep: dict[str, dict[str, str]]) -> bool:
    return not rep["New"].get("Version") and rep["New"]["Path"] == STAGING + rep["Old"]["Path"]


def replaces(mod: dict[str, object], module: str, *, staging: bool = False) -> list[str]:
    """``go mod edit -replace`` arguments for every replace of the upstream module that names a
    version (with ``staging``, its staging folders are left to :func:`staging_replaces`)."""
    out = []
    for rep in _replace_entries(mod):
        old, new = rep["Old"], rep["New"]
        if staging and _is_staging(rep):
            continue
        if not new.get("Version"):
            hint = "" if staging else " (or --staging, where it is ./staging/src/<module>)"
            raise PinError(
                f"{module}: its go.mod replaces {old['Path']} with the folder {new['Path']}, "
                f"which a module from the proxy does not have; pin that module by hand{hint}"
            )
        lhs = f"{old['Path']}@{old['Version']}" if old.get("Version") else old["Path"]
        out.append(f"-replace={lhs}={new['Path']}@{new['Version']}")
    return out


def staging_version(version: str) -> str:
    """The staging modules' version of Kubernetes release ``version``: v1.37.2 -> v0.37.2."""
    match = _RELEASE.fullmatch(version)
    if match is None:
        raise PinError(
            f"{version}: --staging needs a Kubernetes release v1.MINOR.PATCH (its modules are v0.MINOR.PATCH)"
        )
    return f"v0.{match[1]}.{match[2]}{match[3] or ''}"


def staging_replaces(mod: dict[str, object], version: str) -> list[tuple[str, str]]:
    """(module, published version) for each module the release requires and replaces with its own
    ``./staging/src/<module>`` folder; staging modules it does not require (the samples) are left out,
    as Go would ignore their replaces."""
    required = {str(req["Path"]) for req in cast("list[dict[str, object]]", mod.get("Require") or [])}
    published = staging_version(version)
    pairs = {
        rep["Old"]["Path"]: published
        for rep in _replace_entries(mod)
        if _is_staging(rep) and rep["Old"]["Path"] in required
    }
    return sorted(pairs.items())


def replace_block(pairs: Sequence[tuple[str, str]], comment: str) -> str:
    """One ``replace ( … )`` block under a ``//`` comment line (empty without pairs)."""
    if not pairs:
        return ""
    lines = "".join(f"\t{path} => {path} {version}\n" for path, version in pairs)
    return f"\n// {comment}\nreplace (\n{lines})\n"


def module_files(modfile: str) -> tuple[str, str]:
    """The module file and its sum file, as ``go build -modfile`` names them: x.mod -> x.sum."""
    if not modfile.endswith(".mod") or modfile == ".mod" or "/" in modfile or modfile.startswith("."):
        raise PinError(f"--modfile {modfile}: give a file name ending in .mod (go.mod, go-1.34.mod)")
    return modfile, modfile.removesuffix(".mod") + ".sum"


def command(
    directory: str,
    release: str,
    packages: Sequence[str],
    *,
    go_version: str = "",
    toolchain: str = "",
    extra_replaces: Sequence[str] = (),
    extra_requires: Sequence[str] = (),
    staging: bool = False,
    modfile: str = "go.mod",
) -> str:
    """The ``python -m devkit.gopin`` command line that writes this module (named in its go.mod)."""
    args = [directory, release, *packages]
    args += ["--staging"] * staging + [a for r in extra_requires for a in ("--require", r)]
    args += [a for r in extra_replaces for a in ("--replace", r)]
    args += ["--go", go_version] * bool(go_version) + ["--toolchain", toolchain] * bool(toolchain)
    args += ["--modfile", modfile] * (modfile != "go.mod")
    return "python -m devkit.gopin " + shlex.join(args)


def has_main(folder: Path) -> bool:
    """Whether the folder holds a main package of its own (a Go file saying ``package main``)."""
    return any(_MAIN.search(path.read_text()) for path in folder.glob("*.go"))


def _install(source: Path, target: Path) -> None:
    part = target.with_name(f".{target.name}.part")
    shutil.copyfile(source, part)
    os.replace(part, target)


def pin(
    directory: str,
    module: str,
    version: str,
    packages: Sequence[str],
    *,
    go_version: str = "",
    toolchain: str = "",
    extra_replaces: Sequence[str] = (),
    extra_requires: Sequence[str] = (),
    staging: bool = False,
    modfile: str = "go.mod",
) -> Path:
    """Write ``devkit/gotools/<directory>/<modfile>`` and its sum for ``packages`` of ``module@version``
    (or, with none, for the folder's own main package)."""
    mod_name, sum_name = module_files(modfile)
    folder = ROOT / directory
    if mod_name != "go.mod" and not (folder / "go.mod").is_file():
        raise PinError(
            f"{folder}: --modfile {mod_name} needs the folder's go.mod beside it (go finds the module by it)"
        )
    if not packages and not has_main(folder):
        raise PinError(f"{folder}: no main package of its own; name the upstream main packages to build")
    published = staging_version(version) if staging else ""
    env = {**os.environ, "GOTOOLCHAIN": toolchain} if toolchain else None
    mod = upstream_mod(module, version, env=env)
    go_line = go_version or str(mod["Go"])
    staged = staging_replaces(mod, version) if staging else []
    if staging and not staged:
        raise PinError(
            f"{module}: --staging: its go.mod replaces no module it requires with {STAGING}<module>"
        )
    how = command(
        directory,
        f"{module}@{version}",
        packages,
        go_version=go_version,
        toolchain=toolchain,
        extra_replaces=extra_replaces,
        extra_requires=extra_requires,
        staging=staging,
        modfile=mod_name,
    )
    edits = replaces(mod, module, staging=staging) + [f"-replace={r}" for r in extra_replaces]
    edits += [f"-require={r}" for r in extra_requires] + [f"-tool={p}" for p in packages]
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gopin-") as tmp:
        scratch = Path(tmp) / directory
        shutil.copytree(folder, scratch, ignore=shutil.ignore_patterns("*.mod", "*.sum", ".*"))
        gomod = scratch / "go.mod"
        gomod.write_text(
            f"module gpupilot.invalid/devkit/gotools/{directory}\n\ngo {go_line}\n\nrequire {module} {version}\n"
        )
        if edits:
            _go(["mod", "edit", *edits], cwd=scratch)
        # The staging block after go mod edit, so that a replace of another kind is not put under its comment.
        comment = f"{module} {version}'s staging modules as published at {published}: {how}"
        gomod.write_text(gomod.read_text() + replace_block(staged, comment))
        _go(["mod", "tidy"], cwd=scratch, env=env)
        _install(gomod, folder / mod_name)
        _install(scratch / "go.sum", folder / sum_name)
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.gopin",
        description="Write a tool's Go module (go.mod with upstream's replaces, go.sum) for an upstream release.",
    )
    parser.add_argument("directory", help="the folder under devkit/gotools")
    parser.add_argument("release", help="MODULE@VERSION, e.g. github.com/prometheus/prometheus@v0.313.5")
    parser.add_argument(
        "packages",
        nargs="*",
        help="the upstream main packages to build (none where the folder has a main package of its own)",
    )
    parser.add_argument("--go", default="", help="the go line (default: the upstream release's)")
    parser.add_argument(
        "--toolchain", default="", help="GOTOOLCHAIN for go mod tidy, where the release needs a newer Go"
    )
    parser.add_argument(
        "--replace",
        action="append",
        default=[],
        metavar="OLD=NEW@VERSION",
        help="a replace of our own beside upstream's (say why next to the tool in devkit/gobuild.py)",
    )
    parser.add_argument(
        "--require",
        action="append",
        default=[],
        metavar="MODULE@VERSION",
        help="another module to pin beside it (a Go file of the tool module imports it)",
    )
    parser.add_argument(
        "--staging",
        action="store_true",
        help="replace upstream's ./staging/src/<module> folders (k8s.io/kubernetes) by those modules as "
        "published at v0.MINOR.PATCH for release v1.MINOR.PATCH",
    )
    parser.add_argument(
        "--modfile",
        default="go.mod",
        metavar="NAME",
        help="write NAME (e.g. go-1.34.mod, for go build -modfile) and its .sum instead of go.mod and go.sum",
    )
    args = parser.parse_args(argv)
    module, _, version = args.release.partition("@")
    if not version:
        print(f"devkit.gopin: {args.release}: give MODULE@VERSION", file=sys.stderr)
        return 2
    try:
        folder = pin(
            args.directory,
            module,
            version,
            args.packages,
            go_version=args.go,
            toolchain=args.toolchain,
            extra_replaces=args.replace,
            extra_requires=args.require,
            staging=args.staging,
            modfile=args.modfile,
        )
    except PinError as exc:
        print(f"devkit.gopin: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
