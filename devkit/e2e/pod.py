"""One rendered pod run from its image with buildah, as the kubelet would start it: the rendered
command, args and env (fieldRefs filled, the API server's service variables added), each
ConfigMap, Secret, emptyDir and hostPath volume a host folder bind-mounted at its mount path with
the file modes Kubernetes gives (0644 unless ``defaultMode``/``mode`` says otherwise), the
service-account token, ``ca.crt`` and namespace at /var/run/secrets/kubernetes.io/serviceaccount
when the pod mounts a token, and the pod's user (``runAsUser``/``runAsGroup``, else the image's)."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from devkit.e2e.render import ROOT, Obj, Rendering, Workload

ARCHIVES = ROOT / "dist" / "images"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
NODE = "e2e-node"
BUILDAH_NOISE = ("Error: exit status", "subprocess exited with status", "error running container")


class PodError(RuntimeError):
    pass


LOCK = Path("/tmp/gpupilot-images.lock")  # noqa: S108 (the lock the Makefile and CI take by this name)
"""`make images` holds it (flock) while it writes dist/images; reading an archive takes it shared."""


@contextlib.contextmanager
def images_lock() -> Iterator[None]:
    with LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def from_archive(service: str, name: str = "") -> str:
    """A new working container of the service's image archive; its id."""
    cmd = [
        "buildah",
        "from",
        "--pull-never",
        *(["--name", name] if name else []),
        f"oci-archive:{archive(service)}",
    ]
    with images_lock():
        res = subprocess.run(cmd, env=buildah_env(), capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise PodError(f"buildah from {archive(service).name}: {res.stderr.strip()[-300:]}")
    return res.stdout.strip().splitlines()[-1]


def in_rootfs(rootfs: Path, path: str) -> str:
    """``path`` with the image's symbolic links resolved, as the container runtime resolves a mount's
    destination (Debian's /var/run is a link to /run: a mount at /var/run/… lands in /run/…)."""
    parts = [p for p in path.split("/") if p]
    resolved: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        here = rootfs.joinpath(*resolved, part)
        if here.is_symlink() and hops < 40:
            hops += 1
            target = os.readlink(here)
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                resolved = []
            continue
        if part == "..":
            resolved = resolved[:-1]
        elif part != ".":
            resolved.append(part)
    return "/" + "/".join(resolved)


def buildah_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("STORAGE_DRIVER", "vfs")
    env.setdefault("BUILDAH_ISOLATION", "chroot")
    return env


def archive(service: str) -> Path:
    return ARCHIVES / f"gpupilot-{service}.oci.tar"


def _mode(volume: Obj, item: Obj | None) -> int:
    if item is not None and "mode" in item:
        return int(item["mode"])
    source = volume.get("configMap") or volume.get("secret") or {}
    return int(source.get("defaultMode", 0o644))


def _write(directory: Path, files: dict[str, bytes], volume: Obj, items: list[Obj] | None) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    chosen = {i["key"]: i for i in items} if items else {k: None for k in files}
    for key, item in chosen.items():
        if key not in files:
            raise PodError(f"volume {volume['name']}: key {key} not in its source")
        path = directory / (item["path"] if item else key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[key])
        path.chmod(_mode(volume, item))


class ApiAccess(Protocol):
    """What a pod needs of its cluster: the API server's address, the CA that signed it, and a
    token of a ServiceAccount (:class:`devkit.e2e.cluster.Cluster`)."""

    @property
    def ca_cert(self) -> Path: ...

    @property
    def host_port(self) -> tuple[str, int]: ...

    def token(self, namespace: str, service_account: str) -> str: ...


@dataclass
class PodRun:
    """The files and the buildah command line of one pod; :meth:`start` runs it."""

    workload: Workload
    rendering: Rendering
    cluster: ApiAccess | None
    secrets: dict[str, Obj]
    work: Path
    mounts: list[tuple[Path, str, bool]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    container_id: str = ""
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    # -- files ------------------------------------------------------------------------------------
    def prepare(self) -> PodRun:
        w, c = self.workload, self.workload.container
        volumes = {v["name"]: v for v in w.spec.get("volumes", [])}
        root = self.work / f"{w.kind.lower()}-{w.name}"
        root.mkdir(parents=True, exist_ok=True)
        for vm in c.get("volumeMounts", []):
            vol = volumes[vm["name"]]
            host = root / "volumes" / vm["name"]
            if "configMap" in vol:
                cm = self.rendering.find("ConfigMap", vol["configMap"]["name"])
                if cm is None:
                    raise PodError(f"{w.name}: ConfigMap {vol['configMap']['name']} is not in the rendering")
                files = {k: str(v).encode() for k, v in (cm.get("data") or {}).items()}
                _write(host, files, vol, vol["configMap"].get("items"))
            elif "secret" in vol:
                name = vol["secret"]["secretName"]
                secret = self.rendering.find("Secret", name) or self.secrets.get(name)
                if secret is None:
                    raise PodError(f"{w.name}: Secret {name} is created by nothing in the rendering")
                files = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
                _write(host, files, vol, vol["secret"].get("items"))
            elif "emptyDir" in vol or "persistentVolumeClaim" in vol:
                host.mkdir(parents=True, exist_ok=True)
                host.chmod(0o777)
            elif "hostPath" in vol:
                host.mkdir(parents=True, exist_ok=True)  # this machine is no node: an empty folder
                self.notes.append(f"hostPath {vol['hostPath']['path']} -> an empty folder")
            else:
                raise PodError(f"{w.name}: volume {vm['name']}: kind not stood in for: {sorted(vol)}")
            self.mounts.append((host, vm["mountPath"], bool(vm.get("readOnly"))))
        if w.spec.get("automountServiceAccountToken", True) and self.cluster is not None:
            sa = w.spec.get("serviceAccountName", "default")
            files = {
                "token": self.cluster.token(w.namespace, sa).encode(),
                "ca.crt": self.cluster.ca_cert.read_bytes(),
                "namespace": w.namespace.encode(),
            }
            _write(root / "serviceaccount", files, {"name": "kube-api-access"}, None)
            self.mounts.append((root / "serviceaccount", SA_DIR, True))
        self.env = self._env()
        self.args = [*c.get("command", []), *c.get("args", [])]
        return self

    def _env(self) -> dict[str, str]:
        w = self.workload
        env: dict[str, str] = {"HOSTNAME": f"{w.name}-e2e"}
        if self.cluster is not None:
            host, port = self.cluster.host_port
            env |= {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port)}
        fields = {
            "spec.nodeName": NODE,
            "metadata.name": f"{w.name}-e2e",
            "metadata.namespace": w.namespace,
            "spec.serviceAccountName": w.spec.get("serviceAccountName", "default"),
        }
        for e in w.container.get("env", []):
            if "value" in e:
                env[e["name"]] = str(e["value"])
            elif "fieldRef" in e.get("valueFrom", {}):
                env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
            else:
                raise PodError(
                    f"{w.name}: env {e['name']}: valueFrom {sorted(e['valueFrom'])} not stood in for"
                )
        return env

    def user(self) -> str:
        sc = self.workload.spec.get("securityContext") or {}
        csc = self.workload.container.get("securityContext") or {}
        uid = csc.get("runAsUser", sc.get("runAsUser"))
        gid = csc.get("runAsGroup", sc.get("runAsGroup"))
        if uid is None:
            return ""
        return f"{uid}:{gid}" if gid is not None else str(uid)

    def replace_port(self, old: int, new: int) -> None:
        """Map a rendered port that this machine already uses: in the flags, or in a mounted file."""
        changed = False
        for i, a in enumerate(self.args):
            for form in (f"={old}", f":{old}"):
                if a.endswith(form):
                    self.args[i] = a[: -len(form)] + form[0] + str(new)
                    changed = True
        if not changed:
            for host, _, _ in self.mounts:
                for f in host.rglob("*"):
                    if f.is_file() and f":{old}" in f.read_text(errors="ignore"):
                        f.chmod(0o644)
                        f.write_text(f.read_text().replace(f":{old}", f":{new}"))
                        changed = True
        if not changed:
            raise PodError(f"{self.workload.name}: port {old} is taken here and nothing rendered sets it")
        self.notes.append(f"port {old} taken on this machine: mapped to {new}")

    # -- running --------------------------------------------------------------------------------
    def command(self) -> list[str]:
        cmd = ["buildah", "run", "--isolation", "chroot"]
        if self.user():
            cmd += ["--user", self.user()]
        rootfs = subprocess.run(
            ["buildah", "mount", self.container_id],
            env=buildah_env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        try:
            for host, path, ro in self.mounts:
                cmd += ["-v", f"{host}:{in_rootfs(Path(rootfs), path)}:{'ro' if ro else 'rw'}"]
        finally:
            subprocess.run(
                ["buildah", "umount", self.container_id], env=buildah_env(), capture_output=True, check=False
            )
        for k, v in self.env.items():
            cmd += ["--env", f"{k}={v}"]
        return [*cmd, self.container_id, "--", *self.args]

    def start(self) -> PodRun:
        self.container_id = from_archive(self.workload.service, f"e2e-{self.workload.name}-{os.getpid()}")
        self.log = self.work / f"{self.workload.kind.lower()}-{self.workload.name}.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=buildah_env(), start_new_session=True,
            )  # fmt: skip
        return self

    def wait(self, timeout: float) -> int | None:
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def output(self) -> list[str]:
        if self.log is None or not self.log.exists():
            return []
        lines = self.log.read_text(errors="replace").splitlines()
        return [ln for ln in lines if ln.strip() and not ln.startswith(BUILDAH_NOISE)]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
        if self.container_id:
            subprocess.run(
                ["buildah", "rm", self.container_id], env=buildah_env(), capture_output=True, check=False
            )
            self.container_id = ""


def run_once(workload: Workload, *cmd: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A command in a fresh container of the workload's image (a client beside the pods)."""
    ctr = from_archive(workload.service)
    try:
        return subprocess.run(
            ["buildah", "run", "--isolation", "chroot", ctr, "--", *cmd],
            env=buildah_env(), capture_output=True, text=True, check=False, timeout=timeout,
        )  # fmt: skip
    finally:
        subprocess.run(["buildah", "rm", ctr], env=buildah_env(), capture_output=True, check=False)
