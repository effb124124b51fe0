"""Objects the real-cluster tests build: a GPU node of their own (labelled and advertised as the
GPU Operator and the device plugin would), GPU workloads, PodDisruptionBudgets, the chart's
rightsizer installed with auto-apply (its RBAC and admission policies) and a kubeconfig holding that
ServiceAccount's token, and waits on what the controllers do."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from devkit.cluster import deviceplugin
from devkit.cluster.migconfig import default_mig_configs, node_resources
from devkit.cluster.nodes import NODE_RESOURCES
from tests.kube.conftest import REPO, RealCluster

CHART = REPO / "deploy" / "helm" / "gpupilot"
RELEASE_NS = "gpupilot"
RIGHTSIZER = f"system:serviceaccount:{RELEASE_NS}:gpupilot-rightsizer"
H100 = {"product": "NVIDIA-H100-80GB-HBM3", "memory": "81559"}


def add_gpu_node(
    cluster: RealCluster, name: str, *, config: str, gpus: int = 1, strategy: str = "mixed", pool: str = ""
) -> None:
    """An H100 node on a built-in mig-parted config, its extended resources as the device plugin
    would advertise them; the MIG Manager stand-in knows it as applied."""
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "type": "kwok",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": H100["product"],
        "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": H100["memory"],
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": strategy,
        "nvidia.com/mig.config": config,
        "nvidia.com/mig.config.state": "success",
        "nvidia.com/gpu.deploy.device-plugin": "true",
        **({"pool": pool} if pool else {}),
    }
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"capacity": dict(NODE_RESOURCES), "allocatable": dict(NODE_RESOURCES)},
    }
    deviceplugin.publish(obj, node_resources(labels, default_mig_configs()[config]))
    cluster.kube.create(obj)
    cluster.manager.applied[name] = config
    wait(lambda: node_ready(cluster, name), what=f"node {name} Ready", timeout=60)


def node_ready(cluster: RealCluster, name: str) -> bool:
    node = cluster.kube.get("v1", "Node", name) or {}
    conds = (node.get("status") or {}).get("conditions") or []
    taints = (node.get("spec") or {}).get("taints") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds) and not any(
        t["key"] == "node.kubernetes.io/not-ready" for t in taints
    )


def deployment(
    cluster: RealCluster,
    namespace: str,
    name: str,
    *,
    resources: Mapping[str, int],
    node: str = "",
    pool: str = "",
    replicas: int = 1,
) -> None:
    """A GPU Deployment pinned to ``node``, or free to run on any node labelled ``pool=<pool>``."""
    labels = {"app": name}
    selector = {"kubernetes.io/hostname": node} if node else {"pool": pool}
    cluster.kube.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "nodeSelector": selector,
                        "terminationGracePeriodSeconds": 0,
                        "containers": [
                            {
                                "name": "main",
                                "image": "registry.invalid/infer:1",
                                "resources": {
                                    "requests": {k: str(v) for k, v in resources.items()},
                                    "limits": {k: str(v) for k, v in resources.items()},
                                },
                            }
                        ],
                    },
                },
            },
        }
    )


def pdb(cluster: RealCluster, namespace: str, name: str, *, app: str, min_available: int) -> None:
    cluster.kube.apply(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": app}}},
        }
    )


def running_pods(cluster: RealCluster, namespace: str, app: str) -> list[dict[str, Any]]:
    pods = cluster.kube.list("v1", "Pod", namespace=namespace, label_selector=f"app={app}")
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") == "Running"
        and any(c["type"] == "Ready" and c["status"] == "True" for c in (p["status"].get("conditions") or []))
    ]


def limits_of(pod_spec: Mapping[str, Any]) -> dict[str, str]:
    return dict(pod_spec["containers"][0]["resources"]["limits"])


def wait(check: Callable[[], Any], *, what: str, timeout: float = 90, every: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def install_chart(cluster: RealCluster, *, extra: tuple[str, ...] = ()) -> None:
    """The chart as users install it (``helm upgrade --install --wait``) with the parts the
    real-cluster tests exercise: the exporter (DRA on: its ResourceSlice reader role) and the
    rightsizer with auto-apply (its RBAC and admission policies); the adapter is make e2e's."""
    settings = [
        "adapter.enabled=false",
        "exporter.serviceMonitor.enabled=false",
        "exporter.dra.enabled=true",
        "rightsizer.autoApply.enabled=true",
        "rightsizer.serviceMonitor.enabled=false",
        "monitoring.prometheusRules.enabled=false",
        "prometheus.url=http://127.0.0.1:9",
        *extra,
    ]
    helm = REPO / ".venv" / "bin" / "helm"
    cmd = [str(helm), "upgrade", "--install", "gpupilot", str(CHART), "--namespace", RELEASE_NS, "--create-namespace",
           "--wait", "--timeout", "3m", "--kubeconfig", str(cluster.kubeconfig)]  # fmt: skip
    for s in settings:
        cmd += ["--set", s]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)
    assert res.returncode == 0, res.stderr[-800:]


def service_account_token(cluster: RealCluster, namespace: str, name: str) -> str:
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    answer = cluster.kube.create_raw(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body)
    return str(answer["status"]["token"])


def service_account_kubeconfig(cluster: RealCluster, where: Path, namespace: str, name: str) -> Path:
    """A kubeconfig with a TokenRequest token of ``namespace/name``: the rendered RBAC decides."""
    token = service_account_token(cluster, namespace, name)
    return Path(cluster.cp.token_kubeconfig(where / f"{name}.kubeconfig", token))


def refused(cluster: RealCluster, user: str, *, since: float = 0.0) -> list[str]:
    """403s the API server answered ``user`` (the audit log), after ``since`` (Unix seconds)."""
    import datetime as dt  # noqa: PLC0415
    import json  # noqa: PLC0415

    out = []
    with Path(cluster.cp.audit_log).open(errors="replace") as f:
        for line in f:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if (event.get("user") or {}).get("username") != user:
                continue
            if (event.get("responseStatus") or {}).get("code") != 403:
                continue
            stamp = dt.datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00")).timestamp()
            if stamp < since:
                continue
            ref = event.get("objectRef") or {}
            out.append(
                f"{event['verb']} {ref.get('resource')}/{ref.get('subresource', '')} {ref.get('namespace', '')}/{ref.get('name', '')}"
            )
    return out
