"""A Kubernetes API server double over real HTTP, with a simulated NVIDIA MIG Manager.

Shared by the adapter's and the rightsizer's tests. It is a real ``ThreadingHTTPServer`` on a free
loopback port, spoken to by the official ``kubernetes`` Python client unmodified::

    from tests.support.kubedouble import KubeDouble

    with KubeDouble() as kube:
        kube.add_node("gpu-a", model="H100 80GB", gpus=8, mig_config="all-1g.10gb")
        kube.add_pod("infer-0", node="gpu-a", resources={"nvidia.com/mig-1g.10gb": 1}, labels={"app": "infer"})
        v1 = kubernetes.client.CoreV1Api(kube.api_client())        # or client_configuration()
        kubectl_ok = kube.write_kubeconfig(tmp_path / "kubeconfig")   # for --kubeconfig flags

What it serves (see :mod:`tests.support.kubedouble.server` for the route table):

- core/v1 ``nodes``, ``pods``, ``configmaps``, ``events``: get, list (``labelSelector``: ``=``, ``==``,
  ``!=``, ``in``, ``notin``, ``key``, ``!key``; ``fieldSelector``: ``metadata.name``,
  ``metadata.namespace``, ``spec.nodeName``, ``status.phase``, ``spec.unschedulable``,
  ``involvedObject.name``), **watch** (``?watch=true``: chunked JSON lines, ``resourceVersion`` replays
  from history, ``timeoutSeconds`` ends the stream), create (``generateName``, 409 AlreadyExists),
  replace (PUT), patch (strategic-merge — what the client sends for a dict body —, merge-patch and
  JSON-patch), delete, ``?dryRun=All``.
- ``pods/{name}/eviction`` (policy/v1 Eviction) with PodDisruptionBudgets as a cluster keeps them
  (:mod:`tests.support.kubedouble.disruption`, each rule citing ``eviction.go`` / ``disruption.go``): 429 when
  ``disruptionsAllowed`` is 0, which each eviction decrements and only a Ready replacement restores;
  500 for a pod under two budgets; expected pods from the ReplicaSet's scale
  (``kube.add_replicaset(..., replacement_ready_after_s=)``: a ReplicaSet controller makes replacements).
- Graceful deletion by default: a deleted/evicted pod on a node keeps a ``deletionTimestamp`` (and its
  GPU) for ``pod_termination_s`` (0.1 s; ``gracePeriodSeconds: 0`` deletes at once).
- policy/v1 ``poddisruptionbudgets``, apps/v1 ``replicasets``, coordination.k8s.io/v1 ``leases``,
  events.k8s.io/v1 ``events`` (one store with core events).
- core/v1 ``secrets``, ``serviceaccounts``, ``services``, ``persistentvolumeclaims``, apps/v1
  ``deployments``, the four RBAC kinds and ``networkpolicies``: stored as given, with no behaviour,
  so that Helm (``--dry-run=server``, its ``lookup``) can map and read what a chart installs.
- ``nvidia.com/v1 clusterpolicies`` (a CRD: strategic-merge patches get 415, as on a real cluster — use
  ``_content_type="application/merge-patch+json"`` or a JSON patch).
- ``authentication.k8s.io/v1`` TokenReview (``kube.add_token(token, user, groups)``) and
  ``authorization.k8s.io/v1`` SubjectAccessReview (``kube.allow(subject, verb, resource, ...)``,
  ``path=`` for non-resource URLs). ``KubeDouble(require_token=True)`` rejects requests without a
  known bearer token (401); ``enforce_rules=True`` also authorizes every request by the same rules (403).
  The built-in admin token (used by ``client_configuration()`` and ``write_kubeconfig``) is in
  ``system:masters``, which is allowed everything.
- ``resourceVersion`` on every object (one global counter); a write carrying a stale
  ``metadata.resourceVersion`` gets **409 Conflict**; ``kube.inject_conflicts("nodes", "gpu-a", 2)``
  makes the next writes conflict; ``kube.inject_fault(503, path_contains="/pods", count=None, skip=2,
  retry_after_s=1)`` any status on any call, once, repeatedly or after N (``Retry-After`` header).
  Errors are ``Status`` JSON (404 NotFound, 409 Conflict/AlreadyExists, 413, 415, 422 Invalid — bad
  label keys/values, ConfigMaps over 1 MiB —, 429 TooManyRequests). Writes that change nothing keep
  the resourceVersion and send no event; unknown top-level and metadata fields are dropped.
- Watches: history bounded (``history_limit``); ``kube.compact()`` / ``kube.expire_watches(n)`` make
  watches from older versions get an in-stream ``ERROR`` 410 Expired; ``allowWatchBookmarks`` gets a
  BOOKMARK every ``bookmark_interval_s``.
- RBAC: ``kube.load_rbac(Path("deploy/rightsizer"))`` enforces the manifests' Roles/ClusterRoles and
  bindings (:mod:`tests.support.kubedouble.rbac`); ``kube.add_service_account(ns, name)`` returns a token.
- Admission: ``kube.load_admission_policies(Path("deploy/rightsizer/admission-policy.yaml"))`` evaluates
  the ValidatingAdmissionPolicies (real CEL) on every later UPDATE and refuses as the API server does
  (:mod:`tests.support.kubedouble.admission`).
- A simulated **MIG Manager** (:mod:`tests.support.kubedouble.migmanager`): on ``nvidia.com/mig.config``
  changes → ``failed`` for names missing from the ConfigMap the ClusterPolicy points at (or for
  layouts without a placement, or with pods still holding the node's GPUs: "In use by another
  client"), else ``pending`` → (``rebooting``) → ``success`` after a few ms, pausing and restoring
  the ``nvidia.com/gpu.deploy.*`` labels, and waiting for the pods of DaemonSets whose nodeSelector
  carries ``nvidia.com/gpu.deploy.client`` to leave. Timing: ``KubeDouble(mig_manager=MigManagerSettings(...))``.
- apps/v1 ``daemonsets`` (``kube.add_daemonset(obj)``) and a simulated DaemonSet controller
  (:mod:`tests.support.kubedouble.daemonsets`): one pod per node its nodeSelector/affinity matches, removed
  (after ``KubeDouble(daemonset_delete_delay_s=…)``) when the node's labels stop matching.

- NVIDIA's DRA driver's kubelet plugin (:mod:`.dradriver`): when a pod labelled
  ``nvidia-dra-driver-gpu-component=kubelet-plugin`` starts on a node, the node's ``gpu.nvidia.com``
  ResourceSlice is published from the MIG layout applied then (v25.12 device names, MIG UUIDs), and
  kept until that pod is replaced, as the driver enumerates devices only at start.
- The device plugin and a scheduler (:mod:`.deviceplugin`, :mod:`.scheduler`): node status carries
  the extended resources of the applied layout (``nvidia.com/mig-<profile>`` per instance under the
  mixed strategy, ``nvidia.com/gpu`` under single and for MIG-off GPUs, each times its GFD
  ``<resource>.replicas`` label); an unbound Pending pod binds where its ``nvidia.com/*`` requests fit
  allocatable less what bound pods use (and its ``nodeSelector`` matches), else stays Pending with
  ``PodScheduled=False``/``Unschedulable`` and a ``FailedScheduling`` Event.
- apps/v1 ``deployments``, ``statefulsets``, batch/v1 ``jobs``, ``cronjobs`` with controllers
  (:mod:`.workloads`) that make pods from the current template (``kube.add_workload(kind, name,
  resources=..., node=...)``); a Job's template is immutable (422).
- ``python -m tests.support.kubedouble --plan plan.json --kubeconfig FILE``: the double as a process,
  seeded with the cluster a plan describes (:mod:`.fromplan`); the demo applies its plan to it.

Inspection: ``kube.node(name)``, ``kube.labels(name)``, ``kube.annotations(name)``, ``kube.pods(node=)``,
``kube.configmap(name)``, ``kube.cluster_policy()``, ``kube.events(involving=)``,
``kube.actions(verb=, resource=, name=)`` (the ordered journal of client writes, evictions and MIG
Manager steps), ``kube.mig_manager.log`` / ``.states(node)``, ``kube.wait_for(pred)``, ``kube.snapshot()``.
"""

from devkit.cluster.migconfig import default_mig_configs
from tests.support.kubedouble.double import ADMIN_TOKEN, ADMIN_USER, KubeDouble
from tests.support.kubedouble.migmanager import IN_USE, MigManagerSettings, MigRecord
from tests.support.kubedouble.store import Action

__all__ = [
    "ADMIN_TOKEN",
    "ADMIN_USER",
    "IN_USE",
    "Action",
    "KubeDouble",
    "MigManagerSettings",
    "MigRecord",
    "default_mig_configs",
]
