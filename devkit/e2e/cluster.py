"""The Kubernetes API double standing in for the kube-apiserver of one rendering: HTTPS on
127.0.0.1 with a CA of its own (the ``ca.crt`` pods get), a token per rendered ServiceAccount,
the rendering's RBAC enforced (with the API server's built-in roles), the
``kube-system/extension-apiserver-authentication`` ConfigMap naming the front-proxy CA, and the
aggregation layer that sends ``/apis/GROUP/VERSION`` of each APIService to the adapter through
its ``caBundle`` with the front-proxy client certificate."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from devkit.e2e.render import Obj, Rendering
from devkit.pki import Issued, make_ca
from tests.support.kubedouble import KubeDouble
from tests.support.kubedouble.aggregator import register

FRONT_PROXY_CN = "front-proxy-client"
HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
DISCOVERY_PATHS = (
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/readyz",
    "/version",
    "/version/",
)
HPA_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated")


@dataclass
class Cluster:
    kube: KubeDouble
    ca_cert: Path
    front_proxy_ca: Path
    front_proxy: Issued
    tokens: dict[str, str] = field(default_factory=dict)
    """``namespace/name`` of a ServiceAccount → its bearer token."""

    @property
    def host_port(self) -> tuple[str, int]:
        host, port = self.kube.url.removeprefix("https://").rsplit(":", 1)
        return host, int(port)

    def token(self, namespace: str, service_account: str) -> str:
        key = f"{namespace}/{service_account}"
        if key not in self.tokens:
            self.tokens[key] = self.kube.add_service_account(namespace, service_account)
        return self.tokens[key]

    def aggregate(self, rendering: Rendering, adapter_port: int) -> list[str]:
        """Serve every APIService of the rendering through its caBundle to the adapter on
        127.0.0.1:``adapter_port``; returns their names."""
        names = []
        for api in rendering.of_kind("APIService"):
            register(
                self.kube,
                api,
                address=("127.0.0.1", adapter_port),
                client_cert=self.front_proxy.cert,
                client_key=self.front_proxy.key,
            )
            names.append(api["metadata"]["name"])
        return names

    def stop(self) -> None:
        self.kube.stop()


def start(rendering: Rendering, work: Path) -> Cluster:
    pki = work / "pki"
    pki.mkdir(parents=True, exist_ok=True)
    ca = make_ca(pki, "kube-apiserver-ca", cn="kubernetes")
    serving = ca.issue(
        pki, cn="kube-apiserver", server=True, hosts=("127.0.0.1", "localhost"), stem="apiserver"
    )
    front_ca = make_ca(pki, "front-proxy-ca", cn="front-proxy-ca")
    front = front_ca.issue(pki, cn=FRONT_PROXY_CN, stem="front-proxy-client")
    kube = KubeDouble(tls=(serving.cert, serving.key), require_token=True, run_mig_manager=False)
    kube.start()
    rbac = work / "rbac.yaml"
    rbac.write_text(yaml.safe_dump_all(rendering.objects, sort_keys=False))
    kube.load_rbac(rbac)
    kube.add_configmap(
        "extension-apiserver-authentication",
        namespace="kube-system",
        data={
            "client-ca-file": ca.path.read_text(),
            "requestheader-client-ca-file": front_ca.path.read_text(),
            "requestheader-allowed-names": json.dumps([FRONT_PROXY_CN]),
            "requestheader-username-headers": json.dumps(["X-Remote-User"]),
            "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
            "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"]),
        },
    )
    kube.add_token("hpa-controller-token", HPA_USER, list(HPA_GROUPS))
    # The API server's default ClusterRoleBinding system:discovery (group system:authenticated).
    for path in DISCOVERY_PATHS:
        kube.allow("system:authenticated", "get", path=path)
    cluster = Cluster(kube, ca.path, front_ca.path, front)
    for sa in rendering.of_kind("ServiceAccount"):
        cluster.token(sa["metadata"]["namespace"], sa["metadata"]["name"])
    return cluster


def seed_pods(cluster: Cluster, pods: list[Obj]) -> None:
    """The pods the simulator's series name, as the kubelet would have them running."""
    for pod in pods:
        cluster.kube.add_pod(
            pod["name"], namespace=pod["namespace"], node=pod.get("node"), labels=pod.get("labels") or {}
        )
