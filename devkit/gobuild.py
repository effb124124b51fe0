"""Build the real Go programs the tests run beside the project, from their published Go modules.

Each tool is a small Go module of ours under ``devkit/gotools/<dir>/`` (a ``go.mod`` and a committed
``go.sum`` that pin the upstream release, and for Kubernetes a ``main.go`` that only dispatches to
upstream's own cobra commands). ``python -m devkit.gobuild build [NAME ...]`` builds them into a cache
outside the checkout (``$GPUPILOT_TOOLS_DIR``, default ``~/.cache/gpupilot/tools``), one folder per
tool and content key (the module's files, the flags, the Go version), so a rebuild only happens when
a pin changes; Go's own module and build caches (``go env GOMODCACHE GOCACHE``) keep a changed pin's
rebuild short. The binaries are never committed.

A build that fails, or a module the proxy does not serve, is one line naming the tool and the log
file to read, and exit 1; nothing half-built is left in the cache (each tool is built into a
temporary folder and renamed into place). Builds of one tool are serialised with a lock file, so
parallel test workers and CI wait for one build instead of starting several.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "gotools"
"""Where the tool modules live (``devkit/gotools/<dir>``)."""


class GoToolError(RuntimeError):
    """A tool that cannot be built or found; the message is one line naming it and its log."""


@dataclass(frozen=True)
class Binary:
    name: str
    """The file name the binary gets in the tool's folder."""
    package: str
    """The Go package to build: ``.`` for the module's own main, else an upstream import path."""
    links: tuple[str, ...] = ()
    """Other names for the same binary (symbolic links beside it: ``kubectl`` → ``kube``)."""


@dataclass(frozen=True)
class GoTool:
    name: str
    """What users and tests call it (``kube``, ``prometheus-lts``, …)."""
    directory: str
    """The module's folder under ``devkit/gotools``."""
    release: str
    """The upstream release it pins, as its project names it (``v1.37.2``, ``3.13.5``)."""
    binaries: tuple[Binary, ...]
    ldflags: tuple[str, ...] = ()
    """``-X`` settings that make the binary report its real release (``/version``, ``--version``)."""
    tags: tuple[str, ...] = ()
    modfile: str = ""
    """Another go.mod of the same folder (``go build -modfile``): one main, several pinned releases."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment for ``go build`` (``GOTOOLCHAIN`` where a module needs a newer Go; the
    reason is written beside the tool)."""

    @property
    def module_dir(self) -> Path:
        return ROOT / self.directory


def _kube_version_flags(release: str) -> tuple[str, ...]:
    major, minor = release.lstrip("v").split(".")[:2]
    flags = []
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={release}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate=1970-01-01T00:00:00Z",
        ]
    return tuple(flags)


KUBERNETES_RELEASE = "v1.37.2"
"""The Kubernetes release of the test control plane (devkit/gotools/kube/go.mod pins the same)."""
KUBERNETES_OLDEST = "v1.34.4"
"""The oldest release users run that the e2e also runs on (devkit/gotools/kube/go-1.34.mod)."""

TOOLS: dict[str, GoTool] = {
    tool.name: tool
    for tool in (
        GoTool(
            name="kube",
            directory="kube",
            release=KUBERNETES_RELEASE,
            binaries=(Binary("kube", ".", links=("kubectl",)),),
            ldflags=_kube_version_flags(KUBERNETES_RELEASE),
        ),
        GoTool(
            name="kube-1.34",
            directory="kube",
            release=KUBERNETES_OLDEST,
            binaries=(Binary("kube", ".", links=("kubectl",)),),
            ldflags=_kube_version_flags(KUBERNETES_OLDEST),
            modfile="go-1.34.mod",
        ),
        GoTool(
            name="kube-state-metrics",
            directory="kube-state-metrics",
            release="v2.20.0",
            binaries=(Binary("kube-state-metrics", "k8s.io/kube-state-metrics/v2"),),
            ldflags=(
                "-X github.com/prometheus/common/version.Version=v2.20.0",
                "-X github.com/prometheus/common/version.Branch=release-2.20",
                "-X github.com/prometheus/common/version.Revision=v2.20.0",
            ),
        ),
        GoTool(
            name="kwok",
            directory="kwok",
            release="v0.8.0",
            binaries=(Binary("kwok", "sigs.k8s.io/kwok/cmd/kwok"),),
        ),
    )
}


def cache_root() -> Path:
    """Where built tools live: ``$GPUPILOT_TOOLS_DIR`` or ``~/.cache/gpupilot/tools``."""
    env = os.environ.get("GPUPILOT_TOOLS_DIR", "")
    return Path(env) if env else Path.home() / ".cache" / "gpupilot" / "tools"


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        raise GoToolError("go: not found on PATH (Go 1.26 builds the test tools: see docs/development.md)")
    return go


def _go_version(go: str) -> str:
    res = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False)
    return res.stdout.strip() or "unknown"


def content_key(tool: GoTool, go_version: str) -> str:
    """A digest of everything that decides the binaries: the module's files (its own go.mod and
    go.sum, or its ``modfile`` and that file's sum), flags, tags, Go. A binary's other names (its
    links) are made when missing, without a rebuild."""
    digest = hashlib.sha256()
    modfile = Path(tool.modfile or "go.mod")
    own = {modfile.name, modfile.with_suffix(".sum").name}
    for path in sorted(tool.module_dir.rglob("*")):
        if path.is_file() and (path.suffix in {".go", ".yaml"} or path.name in own):
            digest.update(path.relative_to(tool.module_dir).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    for part in (*tool.ldflags, *tool.tags, *sorted(f"{k}={v}" for k, v in tool.env.items()), go_version):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def log_path(tool: GoTool) -> Path:
    return cache_root() / "logs" / f"{tool.name}.log"


@contextmanager
def _locked(name: str) -> Iterator[None]:
    lock = cache_root() / f".{name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def tool_dir(tool: GoTool) -> Path:
    """The folder the tool's binaries are (or will be) in for its current pin."""
    return cache_root() / f"{tool.name}-{tool.release}-{content_key(tool, _go_version(_go()))}"


def built(name: str) -> Path | None:
    """The folder of ``name``'s binaries when they are built for the current pin, else None."""
    tool = TOOLS[name]
    try:
        folder = tool_dir(tool)
    except GoToolError:
        return None
    return folder if (folder / ".complete").is_file() else None


def _run_logged(cmd: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: Path) -> int:
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(cmd)}\n".encode())
        out.flush()
        return subprocess.run(
            list(cmd), cwd=cwd, env=dict(env), stdout=out, stderr=subprocess.STDOUT, check=False
        ).returncode


def _failure_line(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    for line in lines:
        if "not available" in line or "unknown revision" in line or "cannot find module" in line:
            return line.strip()[:200]
    return lines[-1].strip()[:200] if lines else ""


def build(name: str, *, progress: bool = True) -> Path:
    """Build ``name`` (when not already built for its pin) and return the folder of its binaries."""
    if name not in TOOLS:
        raise GoToolError(f"{name}: no such tool (known: {', '.join(sorted(TOOLS))})")
    tool = TOOLS[name]
    go = _go()
    with _locked(name):
        folder = tool_dir(tool)
        if (folder / ".complete").is_file():
            _links(tool, folder)
            return folder
        log = log_path(tool)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_bytes(b"")
        env = {**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=readonly", **tool.env}
        if progress:
            print(f"==> building {tool.name} {tool.release} from its Go modules (log: {log})", flush=True)
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f".{tool.name}-", dir=cache_root()) as tmp:
            modfile = [f"-modfile={tool.modfile}"] if tool.modfile else []
            if _run_logged([go, "mod", "download", *modfile], cwd=tool.module_dir, env=env, log=log) != 0:
                raise GoToolError(
                    f"{tool.name}: its Go modules could not be downloaded ({_failure_line(log)}); see {log}"
                )
            for binary in tool.binaries:
                cmd = [go, "build", *modfile, "-trimpath", "-o", str(Path(tmp) / binary.name)]
                flags = ["-s", "-w", *tool.ldflags]
                cmd += ["-ldflags", " ".join(flags)]
                if tool.tags:
                    cmd += ["-tags", ",".join(tool.tags)]
                cmd.append(binary.package)
                if _run_logged(cmd, cwd=tool.module_dir, env=env, log=log) != 0:
                    raise GoToolError(
                        f"{tool.name}: go build of {binary.package} failed ({_failure_line(log)}); see {log}"
                    )
                for link in binary.links:
                    (Path(tmp) / link).symlink_to(binary.name)
            (Path(tmp) / ".complete").write_text(
                f"{tool.release} built in {time.monotonic() - started:.0f}s\n"
            )
            os.chmod(tmp, 0o755)  # noqa: S103 - binaries others (the images, CI) run
            os.replace(tmp, folder)
            Path(tmp).mkdir()  # TemporaryDirectory removes it on exit
        _prune(tool, keep=folder)
        if progress:
            print(
                f"==> {tool.name} {tool.release} built in {time.monotonic() - started:.0f}s: {folder}",
                flush=True,
            )
        return folder


def _links(tool: GoTool, folder: Path) -> None:
    for b in tool.binaries:
        for link in b.links:
            if not (folder / link).is_symlink():
                (folder / link).symlink_to(b.name)


def _prune(tool: GoTool, *, keep: Path) -> None:
    """Remove the tool's earlier builds (other pins or keys): the cache holds one per tool."""
    for old in cache_root().glob(f"{tool.name}-*"):
        parts = old.name.rsplit("-", 2)
        if old != keep and old.is_dir() and len(parts) == 3 and parts[0] == tool.name:
            shutil.rmtree(old, ignore_errors=True)


def binary(name: str, member: str | None = None, *, build_missing: bool = True) -> Path:
    """The path of one binary of tool ``name`` (``member``: its file name, default the tool's first)."""
    tool = TOOLS[name]
    folder = build(name, progress=True) if build_missing else built(name)
    if folder is None:
        raise GoToolError(f"{name} {tool.release} is not built: run 'python -m devkit.gobuild build {name}'")
    path = folder / (member or tool.binaries[0].name)
    if not path.is_file():
        raise GoToolError(f"{name}: no binary {path.name} in {folder}")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.gobuild",
        description="Build (or locate) the Go programs the tests run, from their pinned Go modules.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build the named tools (all when none is named) unless already built")
    b.add_argument("names", nargs="*", metavar="NAME", help=f"one of: {', '.join(sorted(TOOLS))}")
    p = sub.add_parser("path", help="print the path of a tool's binary (exit 1 when it is not built)")
    p.add_argument("name", metavar="NAME")
    p.add_argument("member", nargs="?", metavar="BINARY", help="the binary's file name (default: the first)")
    sub.add_parser("list", help="every tool, its release and whether it is built")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            for name in args.names or sorted(TOOLS):
                build(name)
        elif args.command == "path":
            if args.name not in TOOLS:
                raise GoToolError(f"{args.name}: no such tool (known: {', '.join(sorted(TOOLS))})")
            print(binary(args.name, args.member, build_missing=False))
        else:
            for name, tool in sorted(TOOLS.items()):
                folder = built(name)
                print(f"{name:<16} {tool.release:<10} {folder if folder else 'not built'}")
    except GoToolError as exc:
        print(f"devkit.gobuild: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
