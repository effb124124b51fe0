"""Write (or rewrite) the Go module of a tool under ``devkit/gotools/<dir>/`` from an upstream release.

``python -m devkit.gopin DIR MODULE@VERSION PACKAGE [PACKAGE ...]`` writes ``go.mod`` with one
``tool`` directive per package (each an upstream main) and the upstream module required at the
release, copies the upstream ``go.mod``'s ``replace`` directives into ours (Go applies ``replace``
only in the main module, so a tool module that depends on a release with replaces needs the same ones,
generated here from that release's own ``go.mod`` rather than copied by hand), then ``go mod tidy``
fills ``go.sum``. A replace pointing into the upstream repository's own folders cannot apply to a
module fetched from the proxy: it is reported as one line and the pin stops.

The ``go`` line is the upstream release's own, so ``go build`` asks for the Go that upstream asks for.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from devkit.gobuild import ROOT


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


def replaces(mod: dict[str, object], module: str) -> list[str]:
    """``go mod edit -replace`` arguments for every replace of the upstream module."""
    out = []
    for rep in mod.get("Replace") or []:  # type: ignore[attr-defined]
        old, new = rep["Old"], rep["New"]
        if not new.get("Version"):
            raise PinError(
                f"{module}: its go.mod replaces {old['Path']} with the folder {new['Path']}, "
                "which a module from the proxy does not have; pin that module by hand"
            )
        lhs = f"{old['Path']}@{old['Version']}" if old.get("Version") else old["Path"]
        out.append(f"-replace={lhs}={new['Path']}@{new['Version']}")
    return out


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
) -> Path:
    """Write ``devkit/gotools/<directory>/go.mod`` + ``go.sum`` for ``packages`` of ``module@version``."""
    env = {**os.environ, "GOTOOLCHAIN": toolchain} if toolchain else None
    mod = upstream_mod(module, version, env=env)
    go_line = go_version or str(mod["Go"])
    folder = ROOT / directory
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("go.mod", "go.sum"):
        (folder / name).unlink(missing_ok=True)
    (folder / "go.mod").write_text(
        f"module gpupilot.invalid/devkit/gotools/{directory}\n\ngo {go_line}\n\nrequire {module} {version}\n"
    )
    edits = replaces(mod, module) + [f"-replace={r}" for r in extra_replaces]
    edits += [f"-require={r}" for r in extra_requires] + [f"-tool={p}" for p in packages]
    if edits:
        _go(["mod", "edit", *edits], cwd=folder)
    _go(["mod", "tidy"], cwd=folder, env=env)
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.gopin",
        description="Write a tool's Go module (go.mod with upstream's replaces, go.sum) for an upstream release.",
    )
    parser.add_argument("directory", help="the folder under devkit/gotools")
    parser.add_argument("release", help="MODULE@VERSION, e.g. github.com/prometheus/prometheus@v0.313.5")
    parser.add_argument("packages", nargs="+", help="the upstream main packages to build")
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
        )
    except PinError as exc:
        print(f"devkit.gopin: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
