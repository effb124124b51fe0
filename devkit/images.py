"""``make images``: the three service images without a Docker engine, then each one started.

Steps (each timed; the times and the archive sizes are printed at the end):

1. ``dist/images/base.tar``: a Debian bookworm root file system (python3, python3-venv,
   ca-certificates) built by ``mmdebstrap`` from Debian's packages, imported into buildah as
   ``localhost/gpupilot-base:bookworm``. Kept between runs; delete the file to rebuild it.
2. ``dist/images/wheels``: wheels of gpupilot and every dependency of the three services, built on
   this host by its own pip with its own settings (index, mirror, proxy, constraints). The image
   build then installs from that folder only (``--no-index``), so no index setting of this machine
   reaches an image, and the build needs no network.
3. ``buildah build --target SERVICE`` of the Dockerfile (vfs storage, chroot isolation: no daemon,
   no user namespaces needed), pushed to ``dist/images/gpupilot-SERVICE.oci.tar`` under the name the
   chart pulls (``localhost/gpupilot/gpupilot-SERVICE:VERSION`` unless ``--repository``/``--tag``).
4. Each archive is started again (``buildah from oci-archive:…`` + ``buildah run``): its entry
   point answers ``--help``; the exporter's ``--once`` ends with its one-line no-GPU message on a
   machine without a GPU; the exporter holds none of the simulator's dependencies.

Any step failing ends the run with one line naming the step and the command's last output line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "dist" / "images"
SERVICES = ("exporter", "adapter", "rightsizer")
BASE_IMAGE = "localhost/gpupilot-base:bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "libstdc++6")
"""libstdc++6: grpcio's extension links it (the exporter's pod-resources client, the adapter's KEDA
scaler); Debian's essential variant leaves it out."""
# No documentation, manual pages or translations in the base (about a third of its size).
DPKG_EXCLUDES = ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/locale/*", "/usr/share/info/*")
EXPORTER_FORBIDDEN = ("numpy", "aiohttp", "pandas", "scipy", "matplotlib", "kubernetes")
NO_GPU_MESSAGE = "gpupilot-exporter: backend nvml unavailable:"


class ImageBuildError(RuntimeError):
    pass


def buildah_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("STORAGE_DRIVER", "vfs")
    env.setdefault("BUILDAH_ISOLATION", "chroot")
    return env


def run(step: str, cmd: Sequence[str], *, capture: bool = True) -> str:
    res = subprocess.run(
        list(cmd), cwd=ROOT, env=buildah_env(), capture_output=capture, text=True, check=False
    )
    if res.returncode != 0:
        # stderr last: where buildah and pip say what went wrong
        lines = ((res.stdout or "") + (res.stderr or "")).strip().splitlines() if capture else []
        last = lines[-1] if lines else f"exit status {res.returncode}"
        raise ImageBuildError(f"{step}: {' '.join(cmd[:3])} … failed: {last}")
    return res.stdout or ""


def version() -> str:
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if line.startswith("version = "):
            return line.split("=", 1)[1].strip().strip('"')
    raise ImageBuildError("pyproject.toml: no version line")


def build_base(out: Path, *, suite: str) -> None:
    tar = out / "base.tar"
    if not tar.is_file():
        partial = out / "base.partial.tar"  # mmdebstrap picks the format by the extension
        cmd = ["mmdebstrap", "--variant=essential", "--include=" + ",".join(BASE_PACKAGES)]
        cmd += [f"--dpkgopt=path-exclude={p}" for p in DPKG_EXCLUDES]
        run("base (mmdebstrap)", [*cmd, suite, str(partial)])
        partial.replace(tar)
    ctr = run("base (buildah from scratch)", ["buildah", "from", "scratch"]).strip()
    try:
        run("base (buildah add)", ["buildah", "add", ctr, str(tar), "/"])
        run("base (buildah config)", ["buildah", "config", "--cmd", "/bin/sh", ctr])
        run("base (buildah commit)", ["buildah", "commit", "--rm", ctr, BASE_IMAGE])
    except ImageBuildError:
        subprocess.run(["buildah", "rm", ctr], env=buildah_env(), capture_output=True, check=False)
        raise


def build_wheels(out: Path) -> None:
    wheels = out / "wheels"
    if wheels.exists():
        shutil.rmtree(wheels)
    extras = ",".join(SERVICES)
    run(
        "wheels (pip wheel)",
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), f".[{extras}]"],
    )


def build_image(service: str, out: Path, *, name: str) -> Path:
    archive = out / f"gpupilot-{service}.oci.tar"
    run(
        f"{service} (buildah build)",
        [
            "buildah", "build", "--pull=never", "--layers=false",
            "--build-arg", f"BASE={BASE_IMAGE}", "--target", service, "--tag", name, ".",
        ],
    )  # fmt: skip
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    run(f"{service} (buildah push)", ["buildah", "push", name, f"oci-archive:{partial}:{name}"])
    partial.replace(archive)
    return archive


def in_container(step: str, archive: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    ctr = run(f"{step} (buildah from)", ["buildah", "from", f"oci-archive:{archive}"]).strip()
    try:
        return subprocess.run(
            ["buildah", "run", ctr, "--", *cmd],
            env=buildah_env(),
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        subprocess.run(["buildah", "rm", ctr], env=buildah_env(), capture_output=True, check=False)


def smoke_test(service: str, archive: Path) -> None:
    entry = f"gpupilot-{service}"
    res = in_container(f"{service} --help", archive, entry, "--help")
    if res.returncode != 0 or "usage:" not in res.stdout:
        raise ImageBuildError(f"{archive.name}: '{entry} --help' exit {res.returncode}: {res.stderr.strip()}")
    if service != "exporter":
        return
    res = in_container("exporter --once", archive, entry, "--once")
    # buildah adds its own lines after the command's output ("subprocess exited with status N",
    # "Error: exit status N").
    buildah_lines = ("Error: exit status", "subprocess exited with status")
    lines = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith(buildah_lines)]
    last = (lines or [""])[-1]
    if res.returncode != 1 or not last.startswith(NO_GPU_MESSAGE):
        raise ImageBuildError(
            f"{archive.name}: '{entry} --once' without a GPU: exit {res.returncode}, last line {last!r}"
        )
    probe = "import importlib.util as u, sys; f = [m for m in sys.argv[1:] if u.find_spec(m)]; sys.exit(','.join(f) or 0)"
    res = in_container("exporter contents", archive, "python3", "-c", probe, *EXPORTER_FORBIDDEN)
    if res.returncode != 0:
        raise ImageBuildError(
            f"{archive.name}: holds {res.stderr.strip()} (the simulator's or analysis stack)"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.images", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (default dist/images)")
    parser.add_argument("--repository", default="localhost/gpupilot/gpupilot", help="image name prefix")
    parser.add_argument("--tag", default="", help="image tag (default: the package version)")
    parser.add_argument("--suite", default="bookworm", help="Debian suite of the base (default bookworm)")
    parser.add_argument("--only", choices=SERVICES, action="append", help="build only this service")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print(
            "error: make images runs as root (buildah's chroot isolation, mmdebstrap's root mode): sudo make images"
        )
        return 2
    for tool in ("buildah", "mmdebstrap"):
        if shutil.which(tool) is None:
            print(
                f"error: {tool} not found: run 'make image-tools' (apt-get install buildah mmdebstrap)",
                file=sys.stderr,
            )
            return 2
    tag = args.tag or version()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}

    def timed(step: str, fn: object, *a: object, **kw: object) -> object:
        start = time.monotonic()
        print(f"==> {step}", flush=True)
        result = fn(*a, **kw)  # type: ignore[operator]
        times[step] = time.monotonic() - start
        return result

    try:
        timed("base image", build_base, out, suite=args.suite)
        timed("wheels", build_wheels, out)
        for service in args.only or SERVICES:
            name = f"{args.repository}-{service}:{tag}"
            archive = timed(f"{service} image", build_image, service, out, name=name)
            assert isinstance(archive, Path)
            timed(f"{service} start", smoke_test, service, archive)
            print(f"    {archive.relative_to(ROOT) if ROOT in archive.parents else archive}: {name}")
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for step, seconds in times.items():
        print(f"{step:<20} {seconds:7.1f} s")
    print(f"{'total':<20} {sum(times.values()):7.1f} s")
    for service in args.only or SERVICES:
        archive = out / f"gpupilot-{service}.oci.tar"
        print(f"{archive.name:<32} {archive.stat().st_size / 2**20:7.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
