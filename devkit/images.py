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
4. Each archive is started again (``buildah from oci-archive:…`` + ``buildah run`` as the image's
   own user, chroot isolation: the host's loopback) and its commands run for real, the same calls
   ``make extras`` runs in a venv with only that service's extra (:mod:`devkit.walk`): the
   rightsizer's ``plan``, ``report`` and ``serve`` (until its first report answers on ``/report/``)
   against a real Prometheus on the host over a day of the demo fleet; the adapter's
   ``explain-hpa --state``, ``convert-config``, ``replay-hpa`` and ``serve`` (until the metrics API
   answers); the exporter's ``--backend nvml --once`` to its one-line no-GPU message (no GPU here);
   the exporter holds none of the simulator's dependencies. The working containers are removed
   afterwards, failed or not.

Run it under ``flock /tmp/gpupilot-images.lock`` where several builds may share the machine.

Any step failing ends the run with one line naming the step and the command's last output line.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from devkit import walk
from devkit.prometheus import PrometheusServer

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
IMAGE_UID = "65532"
"""The images' user (gpupilot), as the Dockerfile sets it."""
IMAGE_WORK = "/walk"
"""Where the checks' scratch folder is mounted inside a container."""
OUTPUT_FILES = (".stdout", ".stderr")
"""A command's output in that folder (see :func:`walk_image`)."""


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
    except BaseException:  # interrupted too: no working container left behind
        subprocess.run(["buildah", "rm", ctr], env=buildah_env(), capture_output=True, check=False)
        raise


def store_ids(kind: str) -> set[str]:
    """IDs of buildah's ``images`` (every one, intermediate included) or ``containers`` now."""
    trunc = "--no-trunc" if kind == "images" else "--notruncate"
    cmd = ["buildah", kind, "--all", "--quiet", trunc]
    res = subprocess.run(cmd, env=buildah_env(), capture_output=True, text=True, check=False)
    return set(res.stdout.split()) if res.returncode == 0 else set()


def remove_new(images: set[str], containers: set[str]) -> None:
    """Remove the containers and images (the base, intermediate stages, each service's image and the
    copies `buildah from oci-archive:` pulls) this run added to buildah's store; the archives stay."""
    for ctr in sorted(store_ids("containers") - containers):
        subprocess.run(["buildah", "rm", ctr], env=buildah_env(), capture_output=True, check=False)
    for image in sorted(store_ids("images") - images):
        subprocess.run(
            ["buildah", "rmi", "--force", image], env=buildah_env(), capture_output=True, check=False
        )


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


@contextmanager
def container(step: str, archive: Path) -> Iterator[str]:
    """A working container of ``archive``, removed afterwards whatever happens."""
    name = f"gpupilot-check-{archive.name.split('.')[0]}-{os.getpid()}"
    ctr = run(f"{step} (buildah from)", ["buildah", "from", "--name", name, f"oci-archive:{archive}"]).strip()
    try:
        yield ctr
    finally:
        subprocess.run(["buildah", "rm", ctr], env=buildah_env(), capture_output=True, check=False)


def in_container(step: str, archive: Path, *cmd: str) -> subprocess.CompletedProcess[str]:
    with container(step, archive) as ctr:
        return subprocess.run(
            ["buildah", "run", ctr, "--", *cmd],
            env=buildah_env(),
            capture_output=True,
            text=True,
            check=False,
        )


def walk_image(service: str, archive: Path, *, prom: str) -> list[walk.Outcome]:
    """The service's calls (:data:`devkit.walk.CALLS`) inside one working container of ``archive``,
    as the image's user, ``{work}`` a host folder mounted at /walk (owned by that user). Without
    ``prom`` the calls that need Prometheus are left out."""
    host_work = Path(tempfile.mkdtemp(prefix=f"gpupilot-image-{service}-"))
    try:
        walk.prepare(host_work)
        subprocess.run(["chown", "-R", f"{IMAGE_UID}:{IMAGE_UID}", str(host_work)], check=True)
        calls = [c for c in walk.CALLS[service] if prom or not c.prometheus]
        with container(f"{service} walk", archive) as ctr:

            def wrap(argv: Sequence[str]) -> list[str]:
                # the command's output into files of the mounted folder, not through buildah's relay
                # of it (which now and then hands back nothing from a command that printed)
                to_files = f'exec "$@" >{IMAGE_WORK}/{OUTPUT_FILES[0]} 2>{IMAGE_WORK}/{OUTPUT_FILES[1]}'
                volume = f"{host_work}:{IMAGE_WORK}"
                return ["buildah", "run", "--volume", volume, ctr, "--", "sh", "-c", to_files, "sh", *argv]

            place = walk.Place(work=IMAGE_WORK, prom=prom)
            files = (host_work / OUTPUT_FILES[0], host_work / OUTPUT_FILES[1])
            return [
                walk.run_call(c, place, wrap=wrap, env=buildah_env(), host_work=host_work, output_files=files)
                for c in calls
            ]
    finally:
        shutil.rmtree(host_work, ignore_errors=True)


def check_contents(service: str, archive: Path) -> None:
    """The image runs as gpupilot (uid 65532); the exporter's holds none of the simulator's or the
    analysis stack's modules."""
    uid = in_container(f"{service} user", archive, "id", "-u").stdout.strip()
    if uid != IMAGE_UID:
        raise ImageBuildError(f"{archive.name}: runs as uid {uid or '?'}, not gpupilot ({IMAGE_UID})")
    if service != "exporter":
        return
    probe = "import importlib.util as u, sys; f = [m for m in sys.argv[1:] if u.find_spec(m)]; sys.exit(','.join(f) or 0)"
    res = in_container("exporter contents", archive, "python3", "-c", probe, *EXPORTER_FORBIDDEN)
    if res.returncode != 0:
        raise ImageBuildError(
            f"{archive.name}: holds {res.stderr.strip()} (the simulator's or analysis stack)"
        )


def check_image(service: str, archive: Path, *, prom: str) -> list[walk.Outcome]:
    """:func:`check_contents`, then :func:`walk_image`; a failed call ends the run with its line."""
    check_contents(service, archive)
    outcomes = walk_image(service, archive, prom=prom)
    for line in walk.summary([(service, o) for o in outcomes]):
        print(f"    {walk.shorten(line, IMAGE_WORK)}", flush=True)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise ImageBuildError(f"{archive.name}: '{failed[0].command}': {failed[0].why}")
    return outcomes


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

    server: PrometheusServer | None = None
    scratch = Path(tempfile.mkdtemp(prefix="gpupilot-images-"))
    before = store_ids("images"), store_ids("containers")
    try:
        timed("base image", build_base, out, suite=args.suite)
        timed("wheels", build_wheels, out)
        data = timed("history", walk.history, scratch / "history", python=sys.executable)
        assert isinstance(data, Path)
        server = PrometheusServer(data, log_file=scratch / "prometheus.log").start()
        for service in args.only or SERVICES:
            name = f"{args.repository}-{service}:{tag}"
            archive = timed(f"{service} image", build_image, service, out, name=name)
            assert isinstance(archive, Path)
            print(f"    {archive.relative_to(ROOT) if ROOT in archive.parents else archive}: {name}")
            timed(f"{service} run", check_image, service, archive, prom=server.url)
    except (ImageBuildError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
        remove_new(*before)
    for step, seconds in times.items():
        print(f"{step:<20} {seconds:7.1f} s")
    print(f"{'total':<20} {sum(times.values()):7.1f} s")
    for service in args.only or SERVICES:
        archive = out / f"gpupilot-{service}.oci.tar"
        print(f"{archive.name:<32} {archive.stat().st_size / 2**20:7.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
