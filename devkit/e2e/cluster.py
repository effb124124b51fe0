"""A rendering installed into a real control plane (:mod:`devkit.cluster`) as users install it.

The chart with ``helm install --wait``, an overlay with ``kubectl apply --server-side`` (kubectl
v1.37, built with the control plane): the API server validates every object, compiles the
ValidatingAdmissionPolicies, and the controllers, the scheduler and KWOK's simulated kubelets take
it from there. The workloads' processes then run from the images (:mod:`devkit.e2e.pod`) with the
token of their own ServiceAccount (a TokenRequest), so the rendered RBAC authorizes every call they
make; the API server's audit log tells which calls it refused.

The adapter is reached through the real aggregator: each of the rendering's APIServices keeps its
Service, which becomes an ``ExternalName`` to ``localhost`` (Endpoints may not hold loopback
addresses and no kube-proxy runs here), with the APIService's ``service.port`` the adapter's local
port. The aggregator still checks the adapter's certificate against the APIService's ``caBundle``
for ``<service>.<namespace>.svc``.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devkit.cluster import ControlPlane, Settings
from devkit.cluster.kubeclient import Kube, KubeError, wait_for
from devkit.cluster.migmanager import MigManager
from devkit.cluster.nodes import OPERATOR_NAMESPACE, add_from_scenario
from devkit.e2e.render import CHART, Obj, Rendering, _tool

TOKEN_SECONDS = 3600 * 4
SA_PREFIX = "system:serviceaccount:"
SERIES_NODE = "gpu-h100-a"
"""The node whose simulated exporter the e2e's Prometheus scrapes."""


class InstallError(RuntimeError):
    pass


@dataclass
class Cluster:
    """One rendering's control plane: tokens for its ServiceAccounts, kubectl, helm, the aggregator path."""

    cp: ControlPlane
    kube: Kube
    manager: MigManager
    tokens: dict[str, str] = field(default_factory=dict)

    @property
    def ca_cert(self) -> Path:
        return self.cp.ca_file

    @property
    def host_port(self) -> tuple[str, int]:
        return "127.0.0.1", self.cp.apiserver_port

    @property
    def kubeconfig(self) -> Path:
        return self.cp.admin_kubeconfig

    def token(self, namespace: str, service_account: str) -> str:
        """A bound token of that ServiceAccount, from the API server's TokenRequest."""
        key = f"{namespace}/{service_account}"
        if key not in self.tokens:
            body = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": TOKEN_SECONDS},
            }
            path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"
            try:
                answer = self.kube.create_raw(path, body)
            except KubeError as exc:
                raise InstallError(f"TokenRequest for ServiceAccount {key}: {exc}") from None
            self.tokens[key] = str(answer["status"]["token"])
        return self.tokens[key]

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 180) -> str:
        kubectl = self.cp.kubectl
        res = subprocess.run(
            [str(kubectl), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise InstallError(f"kubectl {' '.join(args[:3])}: {last}")
        return res.stdout

    def helm_install(self, release: str, namespace: str, settings: list[str], *, timeout: str = "5m") -> str:
        cmd = [_tool("helm"), "install", release, str(CHART), "--namespace", namespace, "--create-namespace",
               "--wait", "--timeout", timeout, "--kubeconfig", str(self.kubeconfig)]  # fmt: skip
        for s in settings:
            cmd += ["--set", s]
        res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
        if res.returncode != 0:
            last = (res.stderr.strip().splitlines() or ["no output"])[-1]
            raise InstallError(f"helm install --wait: {last}")
        return res.stdout

    def helm_test(
        self, release: str, namespace: str, *, log: Path, timeout: str = "4m"
    ) -> subprocess.Popen[bytes]:
        """``helm test`` in the background: it creates the test hooks and waits for the pod's phase."""
        cmd = [
            _tool("helm"),
            "test",
            release,
            "--namespace",
            namespace,
            "--timeout",
            timeout,
            "--kubeconfig",
            str(self.kubeconfig),
        ]
        with log.open("wb") as out:
            return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def report_exit(self, namespace: str, pod: str, container: str, code: int) -> None:
        """What a kubelet reports when the pod's only container exits with ``code`` (a pod that
        does not restart): phase Succeeded or Failed, the container terminated with that code."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": container,
                    "image": "",
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": code,
                            "reason": "Completed" if code == 0 else "Error",
                            "startedAt": now,
                            "finishedAt": now,
                        }
                    },
                }
            ],
        }
        self.kube.merge_patch("v1", "Pod", pod, {"status": status}, namespace=namespace, subresource="status")

    def helm_manifest(self, release: str, namespace: str) -> list[Obj]:
        """What the release installed (its manifest and its hooks), as the cluster has it: a
        second ``helm template`` would mint other certificates."""
        objs: list[Obj] = []
        for what in ("manifest", "hooks"):
            cmd = [
                _tool("helm"),
                "get",
                what,
                release,
                "--namespace",
                namespace,
                "--kubeconfig",
                str(self.kubeconfig),
            ]
            res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
            if res.returncode != 0:
                last = (res.stderr.strip().splitlines() or ["no output"])[-1]
                raise InstallError(f"helm get {what}: {last}")
            objs += [d for d in yaml.safe_load_all(res.stdout) if d]
        return objs

    def apply_server_side(self, objects: list[Obj], *, manager: str = "gpupilot-e2e") -> str:
        """``kubectl apply --server-side`` of the objects (namespaces first, as kubectl orders them)."""
        text = yaml.safe_dump_all(objects, sort_keys=False)
        return self.kubectl("apply", "--server-side", f"--field-manager={manager}", "-f", "-", stdin=text)

    def wait_rollout(self, rendering: Rendering, *, timeout: float = 180) -> list[str]:
        """Every Deployment and DaemonSet of the rendering available, as ``helm --wait`` waits."""
        done = []
        for w in rendering.workloads():
            if w.kind in ("Deployment", "DaemonSet"):
                self.kubectl(
                    "rollout",
                    "status",
                    f"{w.kind.lower()}/{w.name}",
                    "-n",
                    w.namespace,
                    f"--timeout={int(timeout)}s",
                )
                done.append(f"{w.kind}/{w.name}")
        return done

    def aggregate(self, rendering: Rendering, adapter_port: int) -> list[str]:
        """Point every APIService of the rendering at the adapter on localhost:``adapter_port``
        through its own Service (made an ExternalName); wait until the aggregator calls it Available."""
        names = []
        for api in rendering.of_kind("APIService"):
            svc = api["spec"]["service"]
            patch = {
                "spec": {
                    "type": "ExternalName",
                    "externalName": "localhost",
                    "clusterIP": None,
                    "clusterIPs": None,
                    "selector": None,
                    "ipFamilies": None,
                    "ipFamilyPolicy": None,
                    "internalTrafficPolicy": None,
                    "sessionAffinity": None,
                }
            }
            self.kube.merge_patch("v1", "Service", svc["name"], patch, namespace=svc["namespace"])
            name = api["metadata"]["name"]
            self.kube.merge_patch(
                "apiregistration.k8s.io/v1", "APIService", name, {"spec": {"service": {"port": adapter_port}}}
            )
            names.append(name)
        for name in names:
            wait_for(lambda n=name: self.available(n), timeout=60, what=f"APIService {name} Available")  # type: ignore[misc]
        return names

    def available(self, apiservice: str) -> bool:
        obj = self.kube.get("apiregistration.k8s.io/v1", "APIService", apiservice) or {}
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Available" and c.get("status") == "True" for c in conds)

    def refused(self, *, user_prefix: str = SA_PREFIX) -> list[str]:
        """Every request the API server answered 403 for a user starting with ``user_prefix``
        (the audit log), as ``user verb resource [subresource] namespace/name``."""
        out = []
        for event in audit_events(self.cp.audit_log):
            user = (event.get("user") or {}).get("username", "")
            code = (event.get("responseStatus") or {}).get("code")
            if code != 403 or not user.startswith(user_prefix):
                continue
            ref = event.get("objectRef") or {}
            what = ref.get("resource", event.get("requestURI", ""))
            if ref.get("subresource"):
                what += "/" + ref["subresource"]
            where = "/".join(p for p in (ref.get("namespace"), ref.get("name")) if p)
            out.append(f"{user} {event.get('verb')} {what} {where}".rstrip())
        return sorted(set(out))

    def audited_users(self, prefix: str) -> dict[str, int]:
        """User → requests in the audit log, for users starting with ``prefix``."""
        counts: dict[str, int] = {}
        for event in audit_events(self.cp.audit_log):
            user = (event.get("user") or {}).get("username", "")
            if user.startswith(prefix):
                counts[user.removeprefix(SA_PREFIX)] = counts.get(user.removeprefix(SA_PREFIX), 0) + 1
        return counts

    def kinds_without_crd(self, objects: list[Obj]) -> set[str]:
        """Kinds of ``objects`` this API server does not serve (CRDs not installed here)."""
        missing = set()
        for kind, api_version in {(o["kind"], o["apiVersion"]) for o in objects}:
            try:
                self.kube.resource(api_version, kind)
            except Exception:
                missing.add(kind)
        return missing

    def stop(self) -> None:
        self.manager.stop()
        self.cp.stop()


def seed_pods(cluster: Cluster, pods: list[Obj]) -> None:
    """The pods the simulator's series name, created with those names on the node the series come
    from (bound there, as the scheduler would have): KWOK reports them Running."""
    for ns in sorted({p["namespace"] for p in pods}):
        cluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for pod in pods:
        cluster.kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod["name"],
                    "namespace": pod["namespace"],
                    "labels": pod.get("labels") or {},
                },
                "spec": {
                    "nodeName": pod.get("node") or SERIES_NODE,
                    "containers": [{"name": "main", "image": "registry.invalid/simulated:1"}],
                },
            }
        )


def audit_events(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with path.open(errors="replace") as f:
            for line in f:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue
    except OSError:
        return


def start(
    work: Path, scenario: Path, *, operator_namespace: str = OPERATOR_NAMESPACE, kube_tool: str = "kube"
) -> Cluster:
    """A control plane (of the release ``kube_tool`` builds) with the scenario's GPU nodes, the GPU
    Operator's objects in ``operator_namespace`` and the MIG Manager stand-in."""
    cp = ControlPlane(work / "cluster", Settings(kube_tool=kube_tool)).start()
    try:
        add_from_scenario(cp.admin_kubeconfig, scenario, operator_namespace=operator_namespace)
        manager = MigManager(cp.admin_kubeconfig, namespace=operator_namespace).start()
    except BaseException:
        cp.stop()
        raise
    cluster = Cluster(cp, Kube(cp.admin_kubeconfig), manager)
    try:
        wait_for(lambda: _nodes_ready(cluster.kube), timeout=60, what="the GPU nodes Ready")
    except KubeError:
        cluster.stop()
        raise
    return cluster


def _nodes_ready(kube: Kube) -> bool:
    nodes = kube.list("v1", "Node")
    return bool(nodes) and all(
        any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (n.get("status") or {}).get("conditions") or []
        )
        and not any(
            t.get("key") == "node.kubernetes.io/not-ready" for t in (n.get("spec") or {}).get("taints") or []
        )
        for n in nodes
    )
