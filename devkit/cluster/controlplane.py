"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and KWOK, each its own process of the ``kube``/``kwok`` binaries that
:mod:`devkit.gobuild` builds from upstream's Go modules.

Everything runs in one process group of its own (the first component starts a new session, the
others join it), and every component is told to die with the Python process that started it
(``PR_SET_PDEATHSIG``), so stopping (or a Ctrl-C, or a killed test run) leaves nothing behind and no
process is ever ended by name. Each component logs to ``<dir>/logs/<component>.log``; a component
that exits or does not become ready is one line naming it and its log.

The API server runs with RBAC and Node authorization, the default admission plugins plus
NodeRestriction (as kubeadm), ServiceAccount token signing (TokenRequest works), the aggregation
layer's front-proxy client certificate and request-header CA, and an audit log of every request at
Metadata level (``<dir>/audit.log``: the e2e reads the 403s from it).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from devkit import gobuild, pki
from devkit.cluster import pki as clusterpki
from devkit.process import free_port

STAGES = Path(__file__).with_name("stages.yaml")
PR_SET_PDEATHSIG = 1
SHM = Path("/dev/shm")  # noqa: S108 - a private mkdtemp folder inside it, removed on stop


class ClusterError(RuntimeError):
    """A component that could not start or become ready; one line naming it and its log."""


@dataclass(frozen=True)
class Settings:
    hpa_sync_period: str = "5s"
    """The HPA controller's resync (15 s upstream): tests see a decision within seconds."""
    node_monitor_grace_period: str = "40s"
    extra_apiserver_flags: Sequence[str] = ()
    extra_controller_manager_flags: Sequence[str] = ()
    ready_timeout: float = 90.0
    kube_tool: str = "kube"
    """Which build of the components (:data:`devkit.gobuild.TOOLS`): ``kube`` (the newest release
    pinned) or ``kube-1.34`` (the oldest release users run that the tests cover)."""


@dataclass
class Component:
    name: str
    cmd: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class ControlPlane:
    """Start with :meth:`start` (or as a context manager), stop with :meth:`stop`."""

    directory: Path
    settings: Settings = field(default_factory=Settings)
    components: list[Component] = field(default_factory=list)
    pgid: int | None = None
    apiserver_port: int = 0
    etcd_port: int = 0
    certs: clusterpki.ClusterPKI | None = None
    etcd_data: Path | None = None

    # --- paths ---------------------------------------------------------------------------------

    @property
    def logs(self) -> Path:
        return self.directory / "logs"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def release(self) -> str:
        return gobuild.TOOLS[self.settings.kube_tool].release

    @property
    def kubectl(self) -> Path:
        """The kubectl of the same release."""
        return gobuild.binary(self.settings.kube_tool).with_name("kubectl")

    @property
    def admin_kubeconfig(self) -> Path:
        return self.directory / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.directory / "audit.log"

    @property
    def ca_file(self) -> Path:
        assert self.certs is not None
        return self.certs.ca.path

    def kubeconfig_for(self, name: str, client: pki.Issued) -> Path:
        return pki.write_kubeconfig(
            self.directory / f"{name}.kubeconfig", server=self.url, ca_cert=self.ca_file, client=client
        )

    def token_kubeconfig(self, path: Path, token: str, *, name: str = "gpupilot") -> Path:
        """A kubeconfig that authenticates with a bearer ``token`` (a ServiceAccount's)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": name, "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}
            ],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    # --- life cycle ----------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        started = time.monotonic()
        kube = str(gobuild.binary(self.settings.kube_tool))
        kwok = str(gobuild.binary("kwok"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        certs = self.certs = clusterpki.mint(self.directory / "pki")
        self.etcd_port, peer = free_port(), free_port()
        self.apiserver_port = free_port()
        data = self.etcd_data = _etcd_data_dir(self.directory)
        try:
            self._spawn(
                "etcd",
                [
                    kube,
                    "etcd",
                    "--name=gpupilot",
                    f"--data-dir={data}",
                    f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                    f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                    f"--listen-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
                    f"--initial-cluster=gpupilot=http://127.0.0.1:{peer}",
                    "--unsafe-no-fsync=true",
                    "--quota-backend-bytes=2147483648",
                    "--log-level=warn",
                ],
            )
            self._wait("etcd", lambda: _http_ok(f"http://127.0.0.1:{self.etcd_port}/health"))
            self._spawn("kube-apiserver", [kube, "kube-apiserver", *self._apiserver_flags(certs)])
            admin = pki.write_kubeconfig(
                self.admin_kubeconfig, server=self.url, ca_cert=self.ca_file, client=certs.admin
            )
            self._wait("kube-apiserver", lambda: self._get_ok("/readyz"))
            cm_port, sched_port = free_port(), free_port()
            cm_kubeconfig = self.kubeconfig_for("controller-manager", certs.controller_manager)
            self._spawn(
                "kube-controller-manager",
                [
                    kube,
                    "kube-controller-manager",
                    f"--kubeconfig={cm_kubeconfig}",
                    f"--authentication-kubeconfig={cm_kubeconfig}",
                    f"--authorization-kubeconfig={cm_kubeconfig}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={cm_port}",
                    f"--cert-dir={self.directory / 'controller-manager-certs'}",
                    "--leader-elect=false",
                    "--controllers=*",
                    "--use-service-account-credentials=true",
                    f"--service-account-private-key-file={certs.sa_private}",
                    f"--root-ca-file={certs.ca.path}",
                    f"--cluster-signing-cert-file={certs.ca.path}",
                    f"--cluster-signing-key-file={certs.ca_key}",
                    f"--horizontal-pod-autoscaler-sync-period={self.settings.hpa_sync_period}",
                    f"--node-monitor-grace-period={self.settings.node_monitor_grace_period}",
                    *self.settings.extra_controller_manager_flags,
                ],
            )
            sched_kubeconfig = self.kubeconfig_for("scheduler", certs.scheduler)
            self._spawn(
                "kube-scheduler",
                [
                    kube,
                    "kube-scheduler",
                    f"--kubeconfig={sched_kubeconfig}",
                    f"--authentication-kubeconfig={sched_kubeconfig}",
                    f"--authorization-kubeconfig={sched_kubeconfig}",
                    "--bind-address=127.0.0.1",
                    f"--secure-port={sched_port}",
                    f"--cert-dir={self.directory / 'scheduler-certs'}",
                    "--leader-elect=false",
                ],
            )
            kwok_kubeconfig = self.kubeconfig_for("kwok", certs.kwok)
            self._spawn(
                "kwok",
                [
                    kwok,
                    f"--kubeconfig={kwok_kubeconfig}",
                    f"--config={self._stages()}",
                    "--manage-all-nodes=true",
                    "--node-lease-duration-seconds=40",
                    "--cidr=10.244.0.1/16",
                    "--node-ip=127.0.0.1",
                ],
            )
            self._wait("kube-controller-manager", lambda: _https_ok(f"https://127.0.0.1:{cm_port}/healthz"))
            self._wait("kube-scheduler", lambda: _https_ok(f"https://127.0.0.1:{sched_port}/healthz"))
            # the serviceaccount controller creates every namespace's ``default`` ServiceAccount:
            # without it no pod can be created there
            self._wait(
                "kube-controller-manager",
                lambda: self._get_ok("/api/v1/namespaces/default/serviceaccounts/default"),
                what="the default ServiceAccount",
            )
            self._wait(
                "kube-apiserver",
                lambda: self._get_ok(
                    "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"
                ),
                what="extension-apiserver-authentication",
            )
        except BaseException:
            self.stop()
            raise
        (self.directory / "ready").write_text(
            json.dumps(
                {"url": self.url, "kubeconfig": str(admin), "seconds": round(time.monotonic() - started, 1)}
            )
        )
        return self

    def stop(self) -> None:
        """End every component, the last started first (the API server shuts down cleanly while etcd
        is still there), each given 10 s after SIGTERM; then SIGKILL to whatever is left of the group."""
        if self.pgid is not None:
            for comp in reversed(self.components):
                if comp.proc is None or comp.proc.poll() is not None:
                    continue
                comp.proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    comp.proc.wait(timeout=10)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, signal.SIGKILL)
            for comp in self.components:
                if comp.proc is not None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        comp.proc.wait(timeout=5)
            self.pgid = None
        if self.etcd_data is not None and self.etcd_data.is_relative_to(SHM):
            shutil.rmtree(self.etcd_data, ignore_errors=True)
            self.etcd_data = None

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive(self) -> list[str]:
        """The components still running."""
        return [c.name for c in self.components if c.proc is not None and c.proc.poll() is None]

    # --- internals -----------------------------------------------------------------------------

    def _apiserver_flags(self, certs: clusterpki.ClusterPKI) -> list[str]:
        policy = self.directory / "audit-policy.yaml"
        policy.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "audit.k8s.io/v1",
                    "kind": "Policy",
                    "omitStages": ["RequestReceived"],
                    "rules": [{"level": "Metadata"}],
                }
            )
        )
        return [
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={self.apiserver_port}",
            "--endpoint-reconciler-type=none",
            f"--service-cluster-ip-range={clusterpki.SERVICE_CIDR}",
            f"--tls-cert-file={certs.apiserver.cert}",
            f"--tls-private-key-file={certs.apiserver.key}",
            f"--client-ca-file={certs.ca.path}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={certs.sa_public}",
            f"--service-account-signing-key-file={certs.sa_private}",
            f"--requestheader-client-ca-file={certs.front_proxy_ca.path}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={certs.proxy_client.cert}",
            f"--proxy-client-key-file={certs.proxy_client.key}",
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-maxsize=200",
            "--profiling=false",
            "--cert-dir=" + str(self.directory / "apiserver-certs"),
            *self.settings.extra_apiserver_flags,
        ]

    def _stages(self) -> Path:
        """Our KWOK stages, the nodes reporting the kubelet release of the control plane's."""
        text = STAGES.read_text().replace("{{ Version | Quote }}", json.dumps(self.release))
        path = self.directory / "kwok-stages.yaml"
        path.write_text(text)
        return path

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                process_group=0 if self.pgid is None else self.pgid,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - prctl only, before exec
            )
        if self.pgid is None:
            self.pgid = proc.pid
        self.components.append(Component(name, cmd, log, proc))

    def _wait(self, name: str, ready: Callable[[], bool], *, what: str = "") -> None:
        comp = next(c for c in self.components if c.name == name)
        deadline = time.monotonic() + self.settings.ready_timeout
        while time.monotonic() < deadline:
            for c in self.components:
                if c.proc is not None and c.proc.poll() is not None:
                    raise ClusterError(
                        f"{c.name} exited with {c.proc.returncode} while starting; see {c.log}: {_last_line(c.log)}"
                    )
            if ready():
                return
            time.sleep(0.2)
        label = f"{name} ({what})" if what else name
        raise ClusterError(
            f"{label} not ready after {self.settings.ready_timeout:.0f}s; see {comp.log}: {_last_line(comp.log)}"
        )

    def _ssl_context(self) -> ssl.SSLContext:
        assert self.certs is not None
        ctx = ssl.create_default_context(cafile=str(self.certs.ca.path))
        ctx.load_cert_chain(str(self.certs.admin.cert), str(self.certs.admin.key))
        return ctx

    def _get_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.url + path, context=self._ssl_context(), timeout=3) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False


def _etcd_data_dir(directory: Path) -> Path:
    """etcd's data in memory where the machine has /dev/shm (fsync is off anyway), else on disk."""
    if SHM.is_dir() and os.access(SHM, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="gpupilot-etcd-", dir=SHM))
    return directory / "etcd"


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _https_ok(url: str) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the component's self-signed serving certificate
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""
