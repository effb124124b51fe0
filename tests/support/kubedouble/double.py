"""The :class:`KubeDouble` facade: start/stop, seed objects, inspect what clients did."""

from __future__ import annotations

import copy
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from devkit.cluster import deviceplugin
from devkit.cluster.migconfig import node_resources
from mig_geometry.catalogue import find_model
from tests.support.kubedouble import admission
from tests.support.kubedouble.daemonsets import DAEMONSETS, DaemonSetController
from tests.support.kubedouble.disruption import DisruptionController, ReplicaSetController
from tests.support.kubedouble.dradriver import DraDriver
from tests.support.kubedouble.migmanager import (
    CONFIG_LABEL,
    DEPLOY_LABELS,
    GPU_INDICES_ANNOTATION,
    STATE_LABEL,
    MigManager,
    MigManagerSettings,
    default_configmap,
)
from tests.support.kubedouble.rbac import load_rbac_rules
from tests.support.kubedouble.scheduler import PLACED_BY_RULE, Scheduler
from tests.support.kubedouble.server import Api, AuthConfig, Fault, Rule, Server, make_handler
from tests.support.kubedouble.store import Action, Store, now_rfc3339
from tests.support.kubedouble.workloads import CRONJOBS, DEPLOYMENTS, JOBS, STATEFULSETS, WorkloadControllers

ADMIN_TOKEN = "kubedouble-admin-token"
ADMIN_USER = "kubedouble-admin"


class KubeDouble:
    """A Kubernetes API server double on a free loopback port, plus a simulated MIG Manager.

    ``with KubeDouble() as kube:`` starts it; ``kube.url`` is the API server URL. It starts with the
    ClusterPolicy ``cluster-policy`` (``spec.migManager.config.name = default-mig-parted-config``) and the
    operator's default mig-parted ConfigMap in ``gpu-operator`` unless told otherwise.
    """

    def __init__(
        self,
        *,
        mig_manager: MigManagerSettings | None = None,
        run_mig_manager: bool = True,
        pod_termination_s: float = 0.1,
        bookmark_interval_s: float = 60.0,
        history_limit: int = 5000,
        require_token: bool = False,
        enforce_rules: bool = False,
        cluster_policy: bool = True,
        default_mig_configmap: bool = True,
        daemonset_delete_delay_s: float = 0.0,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.store = Store(history_limit=history_limit)
        self.disruption = DisruptionController(self.store)
        self.replicasets = ReplicaSetController(self.store)
        self.workloads = WorkloadControllers(self.store)
        self.scheduler = Scheduler(self.store)
        self.store.hooks += [
            self.workloads.hook,
            self.replicasets.hook,
            self.disruption.hook,
            self.scheduler.hook,
        ]
        self.auth = AuthConfig(require_token=require_token, enforce_rules=enforce_rules)
        self.auth.tokens[ADMIN_TOKEN] = (ADMIN_USER, ("system:masters", "system:authenticated"))
        self.auth.rules.append(Rule("system:masters"))
        self.auth.rules.append(Rule("system:masters", path="*"))
        self.api = Api(
            self.store,
            self.auth,
            pod_termination_s=pod_termination_s,
            bookmark_interval_s=bookmark_interval_s,
        )
        self.mig_settings = mig_manager or MigManagerSettings()
        self.mig_manager = MigManager(self.store, self.mig_settings)
        self._run_mig_manager = run_mig_manager
        self.daemonsets = DaemonSetController(self.store, delete_delay_s=daemonset_delete_delay_s)
        self.dra_driver = DraDriver(self.store, self.mig_manager)
        self.store.hooks.append(self.dra_driver.hook)
        self._server = Server(("127.0.0.1", 0), make_handler(self.api))
        self._scheme = "http"
        if tls is not None:  # (certificate, key): serve HTTPS, as a real API server does
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(str(tls[0]), str(tls[1]))
            self._server.socket = ctx.wrap_socket(self._server.socket, server_side=True)
            self._scheme = "https"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="kubedouble-http", daemon=True
        )
        if cluster_policy:
            self.store.put(
                "nvidia.com/clusterpolicies",
                {
                    "apiVersion": "nvidia.com/v1",
                    "kind": "ClusterPolicy",
                    "metadata": {"name": "cluster-policy"},
                    "spec": {
                        "mig": {"strategy": "mixed"},
                        "migManager": {
                            "enabled": True,
                            "config": {
                                "name": self.mig_settings.default_configmap,
                                "default": "all-disabled",
                            },
                        },
                    },
                    # the operator records where it runs (ClusterPolicyStatus.namespace)
                    "status": {"state": "ready", "namespace": self.mig_settings.namespace},
                },
                event="ADDED",
            )
        if default_mig_configmap:
            self.store.put("/configmaps", default_configmap(self.mig_settings), event="ADDED")

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{self._scheme}://{host!s}:{port}"

    def start(self) -> KubeDouble:
        self._thread.start()
        if self._run_mig_manager:
            self.mig_manager.start()
        self.daemonsets.start()
        return self

    def stop(self) -> None:
        self.store.close()
        if self._run_mig_manager:
            self.mig_manager.stop()
        self.daemonsets.stop()
        self._server.shutdown()
        self._server.server_close()
        self.api.close()
        self.replicasets.close()

    def __enter__(self) -> KubeDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- clients -----------------------------------------------------------------------------------
    def client_configuration(self, token: str | None = ADMIN_TOKEN) -> Any:
        """A ``kubernetes.client.Configuration`` pointing at the double (bearer ``token``)."""
        cfg = client.Configuration(host=self.url)
        if token:
            cfg.api_key = {"BearerToken": token}
            cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return cfg

    def api_client(self, token: str | None = ADMIN_TOKEN) -> Any:
        return client.ApiClient(self.client_configuration(token))

    def write_kubeconfig(self, path: Path, *, token: str = ADMIN_TOKEN, context: str = "kubedouble") -> Path:
        """A kubeconfig file for ``--kubeconfig`` flags (and ``kubectl --kubeconfig``)."""
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": context, "cluster": {"server": self.url}}],
            "users": [{"name": context, "user": {"token": token}}],
            "contexts": [
                {"name": context, "context": {"cluster": context, "user": context, "namespace": "default"}}
            ],
            "current-context": context,
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    # -- authn / authz -------------------------------------------------------------------------
    def add_token(
        self,
        token: str,
        user: str,
        groups: Iterable[str] = (),
        *,
        extra: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """TokenReview of ``token`` authenticates as ``user`` with ``groups`` (and ``extra``); requests
        with it too."""
        self.auth.tokens[token] = (user, tuple(groups))
        self.auth.extras[token] = {k: tuple(v) for k, v in (extra or {}).items()}

    def add_service_account(self, namespace: str, name: str) -> str:
        """A bearer token for ServiceAccount ``namespace/name``, authenticated as the API server does
        (``system:serviceaccount:NS:NAME``, groups ``system:serviceaccounts[:NS]``, a pod-bound token's
        ``extra``); returns the token."""
        token = f"sa-token-{namespace}-{name}"
        self.add_token(
            token,
            f"system:serviceaccount:{namespace}:{name}",
            ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
            extra={
                "authentication.kubernetes.io/pod-name": [f"{name}-0"],
                "authentication.kubernetes.io/pod-uid": [f"uid-{name}-0"],
                "authentication.kubernetes.io/credential-id": [f"JTI={token}"],
            },
        )
        return token

    def load_rbac(
        self, *paths: Path, default_namespace: str = "gpupilot", only: Iterable[str] | None = None
    ) -> int:
        """Enforce the Roles/ClusterRoles and their bindings in these manifests (``deploy/``) from now
        on (``enforce_rules``), for every subject or ``only`` those; returns how many rules were
        loaded. See :mod:`tests.support.kubedouble.rbac`."""
        rules = load_rbac_rules(paths, default_namespace=default_namespace)
        if only is not None:
            keep = set(only)
            rules = [r for r in rules if r.subject in keep]
        self.auth.rules.extend(rules)
        self.auth.enforce_rules = True
        return len(rules)

    def load_admission_policies(self, *paths: Path) -> int:
        """Enforce the ValidatingAdmissionPolicies (with their Deny bindings) in these manifests on
        every later UPDATE; returns how many. See :mod:`tests.support.kubedouble.admission`."""
        bound = admission.load(paths)
        self.api.admission.extend(bound)
        return len(bound)

    def allow(
        self,
        subject: str,
        verb: str = "*",
        resource: str = "*",
        *,
        group: str = "*",
        namespace: str = "*",
        subresource: str = "*",
        name: str = "*",
        path: str | None = None,
    ) -> None:
        """A SubjectAccessReview allow rule; ``subject`` is a user or a group, ``*`` matches anything.

        ``path`` makes it a non-resource rule (``/metrics``, ``/apis/*`` with a trailing ``*`` prefix match).
        """
        self.auth.rules.append(Rule(subject, verb, resource, group, namespace, subresource, name, path))

    # -- faults --------------------------------------------------------------------------------
    def inject_fault(
        self,
        status: int,
        *,
        method: str = "*",
        path_contains: str = "",
        count: int | None = 1,
        skip: int = 0,
        retry_after_s: int | None = None,
        message: str = "injected fault",
    ) -> Fault:
        """Answer requests whose path contains ``path_contains`` (and ``method``) with ``status``: after
        ``skip`` such requests went through, the next ``count`` (``None``: all of them until
        ``clear_faults``). ``retry_after_s`` adds ``Retry-After`` (as API Priority and Fairness does
        on its 429s). Returns the fault (its ``hits`` counts the matching requests seen)."""
        fault = Fault(status, method, path_contains, count, message, skip, retry_after_s)
        self.api.faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self.store.lock:
            self.api.faults.clear()

    def compact(self, up_to: int | None = None) -> None:
        """Expire every watch position up to ``up_to`` (default: now): a watch resuming from an older
        resourceVersion gets an in-stream ``ERROR`` with ``410 Expired`` (as after etcd compaction)."""
        self.store.compact(up_to)

    def expire_watches(self, count: int | None = 1) -> None:
        """The next ``count`` watches that name a resourceVersion get the in-stream ``410 Expired`` at
        once, as under heavy churn with a small watch window; ``None``: every watch, open ones too,
        until called with 0."""
        with self.store.lock:
            self.api.expire_watches = count

    def inject_conflicts(self, resource: str, name: str, count: int = 1) -> None:
        """The next ``count`` PATCH/PUT of ``resource/name`` get 409 Conflict (as if someone wrote first)."""
        for method in ("PATCH", "PUT"):
            self.api.faults.append(
                Fault(
                    409,
                    method,
                    f"/{resource}/{name}",
                    count,
                    f'Operation cannot be fulfilled on {resource} "{name}": '
                    "the object has been modified; please apply your changes to the latest version and try again",
                )
            )

    # -- seeding -------------------------------------------------------------------------------
    def add_node(
        self,
        name: str,
        *,
        model: str = "H100 80GB",
        gpus: int = 8,
        mig_config: str | None = "all-disabled",
        strategy: str = "mixed",
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        unschedulable: bool = False,
    ) -> dict[str, Any]:
        """A GPU node as GPU Feature Discovery labels it, with ``mig_config`` already applied."""
        gpu = find_model(model)
        if gpu is None:
            raise ValueError(f"unknown GPU model {model!r}")
        all_labels = {
            "kubernetes.io/hostname": name,
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": gpu.product_name.replace(" ", "-"),
            "nvidia.com/gpu.count": str(gpus),
            "nvidia.com/gpu.memory": str(gpu.memory_mib),
            "nvidia.com/mig.capable": str(gpu.mig_capable).lower(),
            "nvidia.com/mig.strategy": strategy,
            **dict.fromkeys(DEPLOY_LABELS[:4], "true"),
        }
        if mig_config is not None:
            all_labels[CONFIG_LABEL] = mig_config
            all_labels[STATE_LABEL] = "success"
            self.mig_manager.applied[name] = mig_config
        all_labels.update(labels or {})
        obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": all_labels, "annotations": dict(annotations or {})},
            "spec": {"unschedulable": True} if unschedulable else {},
            "status": {
                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now_rfc3339()}],
                "nodeInfo": _node_info(),
            },
        }
        if mig_config is not None:
            self.mig_manager._seen[name] = mig_config
        _, configs, _ = self.mig_manager._configs()
        if mig_config is None:
            deviceplugin.publish(obj, node_resources(all_labels, []))
        elif configs is not None and mig_config in configs:
            deviceplugin.publish(obj, node_resources(all_labels, configs[mig_config]))
        return self.store.put("/nodes", obj, event="ADDED")

    def add_pod(
        self,
        name: str,
        *,
        namespace: str = "default",
        node: str | None = None,
        resources: Mapping[str, int | str] | None = None,
        labels: Mapping[str, str] | None = None,
        phase: str = "Running",
        ready: bool | None = None,
        owner: tuple[str, str] | None = ("ReplicaSet", "app"),
        gpu_indices: Sequence[int] | None = None,
        schedule: bool = False,
    ) -> dict[str, Any]:
        """A pod (bound to ``node`` when given) whose one container has ``resources`` as limits;
        ``gpu_indices``: the GPUs the device plugin gave it (see :mod:`tests.support.kubedouble.migmanager`).
        An unbound ``Pending`` pod stays as seeded unless ``schedule`` hands it to the scheduler
        (:mod:`tests.support.kubedouble.scheduler`).

        ``ready`` (default: ``phase == "Running"``) sets the ``Ready`` condition, which is what a
        PodDisruptionBudget counts as healthy."""
        limits = {k: str(v) for k, v in (resources or {}).items()}
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels or {})}
        if gpu_indices is not None:
            meta["annotations"] = {GPU_INDICES_ANNOTATION: ",".join(str(i) for i in gpu_indices)}
        if phase == "Pending" and node is None and not schedule:
            meta.setdefault("annotations", {})[PLACED_BY_RULE] = "seeded"
        if owner is not None:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": owner[0],
                    "name": owner[1],
                    "uid": f"uid-{owner[1]}",
                    "controller": True,
                }
            ]
        obj: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.local/app:1",
                        "resources": {"limits": limits, "requests": limits},
                    }
                ],
                **({"nodeName": node} if node else {}),
            },
            "status": {
                "phase": phase,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True" if (phase == "Running" if ready is None else ready) else "False",
                        "lastTransitionTime": now_rfc3339(),
                    }
                ],
            },
        }
        return self.store.put("/pods", obj, event="ADDED")

    def add_daemonset(self, daemonset: Mapping[str, Any], *, namespace: str = "default") -> dict[str, Any]:
        """Store a DaemonSet (e.g. one rendered from deploy/); the simulated controller places its pods."""
        obj = copy.deepcopy(dict(daemonset))
        obj.setdefault("metadata", {}).setdefault("namespace", namespace)
        return self.store.put(DAEMONSETS, obj, event="ADDED")

    def add_replicaset(
        self,
        name: str,
        *,
        namespace: str = "default",
        replicas: int,
        labels: Mapping[str, str],
        nodes: Sequence[str | None] = (),
        resources: Mapping[str, int | str] | None = None,
        replacement_ready_after_s: float | None = 0.0,
        replacement_node: str = "elsewhere",
    ) -> dict[str, Any]:
        """A ReplicaSet (the scale a PDB's ``maxUnavailable`` or percentage counts against). Add its
        pods are created too: ``{name}-{i}`` on ``nodes[i]``. A pod that goes away is replaced at once by
        a Pending pod that becomes Ready on ``replacement_node`` ``replacement_ready_after_s`` later
        (``None``: never — nowhere to schedule it)."""
        limits = {k: str(v) for k, v in (resources or {}).items()}
        annotations = {ReplicaSetController.NODE: replacement_node}
        if replacement_ready_after_s is not None:
            annotations[ReplicaSetController.READY_AFTER] = str(replacement_ready_after_s)
        obj = {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": annotations,
                "uid": f"uid-{name}",
            },
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": dict(labels)},
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {
                        "containers": [
                            {
                                "name": "main",
                                "image": "registry.local/app:1",
                                "resources": {"limits": limits, "requests": limits},
                            }
                        ]
                    },
                },
            },
        }
        with self.store.lock:  # the pods first, then the ReplicaSet: no spurious replacements
            for i, node in enumerate(nodes):
                self.add_pod(
                    f"{name}-{i}",
                    namespace=namespace,
                    node=node,
                    resources=resources,
                    labels=labels,
                    owner=("ReplicaSet", name),
                )
            return self.store.put("apps/replicasets", obj, event="ADDED")

    def add_workload(
        self,
        kind: str,
        name: str,
        *,
        namespace: str = "default",
        replicas: int = 1,
        resources: Mapping[str, int | str],
        node: str | None = None,
        strategy: str | None = None,
    ) -> dict[str, Any]:
        """A Deployment, StatefulSet, Job or CronJob whose pods (label ``app: name``, one container
        ``main`` with ``resources`` as requests and limits, ``nodeSelector`` on ``node`` when given)
        the double's controllers make and its scheduler places."""
        limits = {k: str(v) for k, v in resources.items()}
        pod_spec: dict[str, Any] = {
            "containers": [
                {
                    "name": "main",
                    "image": "registry.local/app:1",
                    "resources": {"limits": dict(limits), "requests": dict(limits)},
                }
            ]
        }
        if node is not None:
            pod_spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        template = {"metadata": {"labels": {"app": name}}, "spec": pod_spec}
        spec: dict[str, Any]
        if kind == "CronJob":
            spec = {"schedule": "0 * * * *", "jobTemplate": {"spec": {"template": template}}}
        elif kind == "Job":
            spec = {"parallelism": replicas, "template": template}
        else:
            spec = {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template}
            if strategy is not None and kind == "Deployment":
                spec["strategy"] = {"type": strategy}
        skey = {"Deployment": DEPLOYMENTS, "StatefulSet": STATEFULSETS, "Job": JOBS, "CronJob": CRONJOBS}[
            kind
        ]
        group = "batch/v1" if kind in ("Job", "CronJob") else "apps/v1"
        obj = {
            "apiVersion": group,
            "kind": kind,
            "metadata": {"name": name, "namespace": namespace, "generation": 1},
            "spec": spec,
        }
        return self.store.put(skey, obj, event="ADDED")

    def workload(self, kind: str, name: str, *, namespace: str = "default") -> dict[str, Any] | None:
        skey = {"Deployment": DEPLOYMENTS, "StatefulSet": STATEFULSETS, "Job": JOBS, "CronJob": CRONJOBS}[
            kind
        ]
        return self.store.get(skey, namespace, name)

    def add_pdb(
        self,
        name: str,
        *,
        namespace: str = "default",
        match_labels: Mapping[str, str],
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
        unhealthy_pod_eviction_policy: str | None = None,
    ) -> dict[str, Any]:
        spec: dict[str, Any] = {"selector": {"matchLabels": dict(match_labels)}}
        if unhealthy_pod_eviction_policy is not None:
            spec["unhealthyPodEvictionPolicy"] = unhealthy_pod_eviction_policy
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        obj = {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
        return self.store.put("policy/poddisruptionbudgets", obj, event="ADDED")

    def add_hpa(self, doc: Mapping[str, Any], *, status: Mapping[str, Any]) -> dict[str, Any]:
        """An ``autoscaling/v2`` HorizontalPodAutoscaler as written, with the given status."""
        obj = {**copy.deepcopy(dict(doc)), "status": dict(status)}
        return self.store.put("autoscaling/horizontalpodautoscalers", obj, event="ADDED")

    def add_pod_metrics(
        self, name: str, *, namespace: str = "default", usage: Mapping[str, str], container: str = "main"
    ) -> dict[str, Any]:
        """metrics-server's PodMetrics for one pod (one container, a 30 s window, measured now)."""
        obj = {
            "apiVersion": "metrics.k8s.io/v1beta1",
            "kind": "PodMetrics",
            "metadata": {"name": name, "namespace": namespace},
            "timestamp": now_rfc3339(),
            "window": "30s",
            "containers": [{"name": container, "usage": dict(usage)}],
        }
        return self.store.put("metrics.k8s.io/pods", obj, event="ADDED")

    def add_configmap(
        self, name: str, *, namespace: str = "gpu-operator", data: Mapping[str, str]
    ) -> dict[str, Any]:
        obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": dict(data),
        }
        return self.store.put("/configmaps", obj, event="ADDED")

    def set_node_label(self, node: str, key: str, value: str | None) -> None:
        """Change a label behind the clients' back (e.g. someone else relabels the node)."""

        def change(obj: dict[str, Any]) -> None:
            labels = obj["metadata"].setdefault("labels", {})
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value

        self.store.update("/nodes", "", node, change)

    def delete_pod(self, name: str, *, namespace: str = "default") -> None:
        self.store.remove("/pods", namespace, name)

    # -- inspection ----------------------------------------------------------------------------
    def node(self, name: str) -> dict[str, Any]:
        obj = self.store.get("/nodes", "", name)
        if obj is None:
            raise KeyError(f"no node {name}")
        return obj

    def labels(self, node: str) -> dict[str, str]:
        return dict(self.node(node)["metadata"].get("labels") or {})

    def annotations(self, node: str) -> dict[str, str]:
        return dict(self.node(node)["metadata"].get("annotations") or {})

    def pods(self, *, node: str | None = None, namespace: str | None = None) -> list[dict[str, Any]]:
        return [
            p
            for p in self.store.list("/pods", namespace)
            if node is None or p["spec"].get("nodeName") == node
        ]

    def configmap(self, name: str, *, namespace: str = "gpu-operator") -> dict[str, Any] | None:
        return self.store.get("/configmaps", namespace, name)

    def cluster_policy(self, name: str = "cluster-policy") -> dict[str, Any] | None:
        return self.store.get("nvidia.com/clusterpolicies", "", name)

    def events(self, *, involving: str | None = None) -> list[dict[str, Any]]:
        """Events from both APIs (core/v1 ``involvedObject``, events.k8s.io/v1 ``regarding``)."""
        out = []
        for ev in self.store.list("events"):
            target = ev.get("involvedObject") or ev.get("regarding") or {}
            if involving is None or target.get("name") == involving:
                out.append(ev)
        return out

    def actions(
        self, *, verb: str | None = None, resource: str | None = None, name: str | None = None
    ) -> list[Action]:
        """The journal of client writes and MIG Manager steps, in order (``seq`` increases)."""
        with self.store.lock:
            items = list(self.store.journal)
        return [
            a
            for a in items
            if (verb is None or a.verb == verb)
            and (resource is None or a.resource == resource)
            and (name is None or a.name == name)
        ]

    def wait_for(
        self, predicate: Callable[[], bool], *, timeout: float = 5.0, what: str = "condition"
    ) -> None:
        deadline = time.monotonic() + timeout
        pause = 0.005  # quick for what is nearly there, then backing off to 50 ms for long waits
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(pause)
            pause = min(pause * 1.5, 0.05)
        raise TimeoutError(f"kubedouble: timed out after {timeout}s waiting for {what}")

    def snapshot(self) -> dict[tuple[str, str, str], dict[str, Any]]:
        """Every stored object (for 'dry-run changed nothing' assertions); resourceVersions included."""
        with self.store.lock:
            return copy.deepcopy(self.store._objects)


def _node_info() -> dict[str, str]:
    return {
        "architecture": "amd64",
        "bootID": "",
        "containerRuntimeVersion": "containerd://1.7.0",
        "kernelVersion": "6.1.0",
        "kubeProxyVersion": "v1.32.0",
        "kubeletVersion": "v1.32.0",
        "machineID": "",
        "operatingSystem": "linux",
        "osImage": "Ubuntu 22.04",
        "systemUUID": "",
    }
