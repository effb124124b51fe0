"""KEDA's operator and metrics server (built from ``github.com/kedacore/keda/v2`` by
:mod:`devkit.gobuild`) beside the test control plane, as KEDA runs in a cluster: its CRDs applied
(from the module, ``config/crd/bases``), its metrics server behind the APIService
``v1beta1.external.metrics.k8s.io`` (an ExternalName Service on ``localhost``), the operator's own
certificate rotation writing the Secret both processes mount (a kubelet would mount it; this writes
its files), the operator serving the metrics server over mutual-TLS gRPC.

``with Keda(control_plane, work) as keda:`` starts both and waits until the APIService is Available;
leaving the block stops them and removes the APIService (another extension server may want it).
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
from pathlib import Path
from types import TracebackType

from devkit import gobuild
from devkit.cluster.controlplane import ControlPlane
from devkit.cluster.kubeclient import Kube, KubeError, wait_for
from devkit.process import die_with_parent, free_port, stop_process

NAMESPACE = "keda"
APISERVICE = "v1beta1.external.metrics.k8s.io"


def crds() -> Path:
    """KEDA's CRDs as its module ships them, from Go's module cache."""
    tool = gobuild.TOOLS["keda"]
    res = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", "github.com/kedacore/keda/v2"],
        cwd=tool.module_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    if res.returncode != 0:
        raise KubeError(f"KEDA's module is not in Go's cache: {res.stderr.strip()[-200:]}")
    return Path(res.stdout.strip()) / "config" / "crd" / "bases"


class Keda:
    def __init__(self, cp: ControlPlane, work: Path) -> None:
        self.cp = cp
        self.work = work
        self.kube = Kube(cp.admin_kubeconfig)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.operator: subprocess.Popen[bytes] | None = None
        self.metrics: subprocess.Popen[bytes] | None = None

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
            "POD_NAMESPACE": NAMESPACE,
            "WATCH_NAMESPACE": "",
        }

    def _spawn(self, name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        with (self.work / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._env(),
                preexec_fn=die_with_parent,  # noqa: PLW1509
            )
        self.procs.append(proc)
        return proc

    def start(self) -> Keda:
        assert self.cp.certs is not None
        folder = gobuild.binary("keda").parent
        self.work.mkdir(parents=True, exist_ok=True)
        certs = self.work / "certs"
        certs.mkdir(exist_ok=True)
        kc = str(self.cp.admin_kubeconfig)
        res = subprocess.run(
            [str(self.cp.kubectl), f"--kubeconfig={kc}", "apply", "--server-side", "-f", str(crds())],
            capture_output=True,
            text=True,
            check=False,
        )
        if res.returncode != 0:
            raise KubeError(f"KEDA's CRDs: {res.stderr.strip()[-300:]}")
        self.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        metrics_port, grpc_port = free_port(), free_port()
        self.kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "keda-metrics-apiserver", "namespace": NAMESPACE},
                "spec": {"type": "ExternalName", "externalName": "localhost"},
            }
        )
        self.kube.apply(
            {
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": APISERVICE},
                "spec": {
                    "group": "external.metrics.k8s.io",
                    "version": "v1beta1",
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                    "service": {
                        "name": "keda-metrics-apiserver",
                        "namespace": NAMESPACE,
                        "port": metrics_port,
                    },
                },
            }
        )
        operator_cmd = [
            str(folder / "keda"),
            f"--kubeconfig={kc}",
            f"--metrics-bind-address=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{free_port()}",
            f"--metrics-service-bind-address=127.0.0.1:{grpc_port}",
            f"--cert-dir={certs}",
            "--enable-cert-rotation=true",
            "--enable-webhook-patching=false",
            "--zap-log-level=error",
        ]
        # First start: the rotator writes the Secret kedaorg-certs and exits for the pod to restart
        # with it mounted; write its files where a kubelet would, and start again.
        first = self._spawn("keda-operator-first", operator_cmd)
        secret = wait_for(
            lambda: (self.kube.get("v1", "Secret", "kedaorg-certs", NAMESPACE) or {}).get("data"),
            timeout=180,
            what="KEDA's certificate Secret",
        )
        with contextlib.suppress(subprocess.TimeoutExpired):
            first.wait(timeout=30)
        stop_process(first)
        for name, value in secret.items():
            (certs / name).write_bytes(base64.b64decode(value))
        self.operator = self._spawn("keda-operator", operator_cmd)
        self.metrics = self._spawn(
            "keda-metrics",
            [
                str(folder / "keda-adapter"),
                *(
                    f"--{flag}={kc}"
                    for flag in (
                        "kubeconfig",
                        "lister-kubeconfig",
                        "authentication-kubeconfig",
                        "authorization-kubeconfig",
                    )
                ),
                f"--secure-port={metrics_port}",
                "--bind-address=127.0.0.1",
                f"--cert-dir={certs}",
                f"--tls-cert-file={certs / 'tls.crt'}",
                f"--tls-private-key-file={certs / 'tls.key'}",
                f"--requestheader-client-ca-file={self.cp.certs.front_proxy_ca.path}",
                "--requestheader-allowed-names=front-proxy-client",
                f"--metrics-service-address=127.0.0.1:{grpc_port}",
                "--metrics-service-grpc-authority=keda-operator.keda.svc.cluster.local",
                f"--port={free_port()}",
                f"--profiling-bind-address=127.0.0.1:{free_port()}",
            ],
        )
        # the operator's rotation also fills the APIService's caBundle
        wait_for(
            self._available, timeout=120, what=f"APIService {APISERVICE} Available (KEDA's metrics server)"
        )
        return self

    def _available(self) -> bool:
        for proc in (self.operator, self.metrics):
            if proc is not None and proc.poll() is not None:
                raise KubeError(f"a KEDA process exited with {proc.returncode}; see {self.work}")
        obj = self.kube.get("apiregistration.k8s.io/v1", "APIService", APISERVICE) or {}
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Available" and c.get("status") == "True" for c in conds)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)
        with contextlib.suppress(KubeError):
            self.kube.delete("apiregistration.k8s.io/v1", "APIService", APISERVICE)

    def __enter__(self) -> Keda:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
