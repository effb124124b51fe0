"""A simulated NVIDIA MIG Manager that follows the real node-label protocol (reference/mig-geometry.md).

It watches every node's ``nvidia.com/mig.config``. When the value changes to a non-empty name:

1. the name must be in the mig-parted config of the ConfigMap that the ClusterPolicy's
   ``spec.migManager.config.name`` names (default ``default-mig-parted-config``) in the operator
   namespace, else ``nvidia.com/mig.config.state=failed``;
2. already applied → ``success``;
3. every entry that applies to the node's GPUs (``devices``, ``device-filter`` against the model in
   ``nvidia.com/gpu.product``) must be well formed and have a placement (:func:`mig_geometry.placement.place`),
   else ``failed``;
4. ``pending``, with the ``nvidia.com/gpu.deploy.*`` operand labels set to ``paused-for-mig-change``
   (``nvidia.com/gpu.deploy.client`` too when the node has it: mig-parted >= v0.15.0); then it waits
   (up to ``client_wait_s``) until no pod remains on the node whose owning DaemonSet has
   ``nvidia.com/gpu.deploy.client`` in its pod template's ``nodeSelector`` (affinity is not looked
   at, as in mig-parted); the simulated DaemonSet controller (:mod:`tests.support.kubedouble.daemonsets`)
   removes those pods when the label changes;
5. after ``pending_s``: if non-terminated pods still request ``nvidia.com/gpu`` or ``nvidia.com/mig-*``
   on a GPU the config re-creates → ``failed`` ("In use by another client"); it never evicts anything.
   As in mig-parted, a GPU whose layout is unchanged is left alone, unless some GPU changes MIG mode
   (then all are reset); which GPU a pod holds comes from its ``kubedouble.test/gpu-indices``
   annotation (without it, or when the old layout is unknown, the pod counts as holding every GPU);
6. optionally ``rebooting`` when MIG mode flips (``with_reboot``), then ``success`` after ``apply_s``,
   with the operand labels restored to ``true`` and the per-profile GFD labels / allocatable updated.

After a failure it does not retry until the label changes. Every step is journalled as a
``mig-manager`` action and kept in :attr:`MigManager.log`.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from devkit.cluster import deviceplugin
from devkit.cluster.migconfig import (
    check_config,
    default_mig_configs,
    node_resources,
    reconfigured_gpus,
)
from tests.support.kubedouble.store import Store

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
DEPLOY_LABELS = (
    "nvidia.com/gpu.deploy.device-plugin",
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.dcgm",
    "nvidia.com/gpu.deploy.nvsm",
    "nvidia.com/gpu.deploy.client",
)
CLIENT_LABEL = "nvidia.com/gpu.deploy.client"
PAUSED = "paused-for-mig-change"
IN_USE = "In use by another client"


@dataclass
class MigManagerSettings:
    namespace: str = "gpu-operator"
    """Namespace of the operator (where the mig-parted ConfigMaps live)."""
    default_configmap: str = "default-mig-parted-config"
    pending_s: float = 0.02
    """Time spent in ``pending`` before the in-use check (the real one waits for operands to stop)."""
    apply_s: float = 0.02
    with_reboot: bool = False
    """``WITH_REBOOT=true``: a MIG mode change passes through ``rebooting``."""
    reboot_s: float = 0.02
    poll_s: float = 0.05
    """Fallback poll; every store write wakes the manager at once anyway."""
    client_wait_s: float = 5.0
    """How long it waits for third-party GPU client pods to leave (mig-parted: 5 minutes)."""
    failing_nodes: dict[str, str] = field(default_factory=dict)
    """node → reason: any new config fails there after ``pending`` (a GPU that will not reset, an
    Xid error): a failure no plan check can foresee. Going back to the applied config still works."""


@dataclass(frozen=True)
class MigRecord:
    node: str
    config: str
    state: str
    reason: str = ""


GPU_INDICES_ANNOTATION = "kubedouble.test/gpu-indices"
"""On a pod: the GPU indices the device plugin gave it (``"0,2"``), which the Kubernetes API does not
show; a pod without it may hold any GPU of its node."""


def node_gpu_holders(store: Store, node: str, gpus: set[int] | None = None) -> list[str]:
    """``ns/name`` of non-terminated pods on ``node`` that request whole GPUs or MIG devices (only
    those that may hold one of ``gpus`` when it is given)."""
    out = []
    for pod in store.view("/pods"):
        if pod.get("spec", {}).get("nodeName") != node:
            continue
        held = ((pod.get("metadata") or {}).get("annotations") or {}).get(GPU_INDICES_ANNOTATION)
        if gpus is not None and held is not None and not {int(i) for i in held.split(",") if i} & gpus:
            continue
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for c in pod.get("spec", {}).get("containers", []):
            res = c.get("resources") or {}
            names = set(res.get("limits") or {}) | set(res.get("requests") or {})
            if any(n == "nvidia.com/gpu" or n.startswith("nvidia.com/mig-") for n in names):
                out.append(f"{pod['metadata'].get('namespace', '')}/{pod['metadata']['name']}")
                break
    return out


@functools.lru_cache(maxsize=32)
def _parsed(text: str) -> Any:
    """A MIG config file as parsed, shared by every reconcile that reads the same text (the default
    file, all models' configs, takes 50 ms to build): read-only to its callers."""
    return yaml.load(text, Loader=_Loader) or {}


@functools.cache
def _default_text() -> str:
    return yaml.dump({"version": "v1", "mig-configs": default_mig_configs()}, Dumper=_Dumper, sort_keys=False)


def default_configmap(settings: MigManagerSettings) -> dict[str, Any]:
    text = _default_text()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": settings.default_configmap, "namespace": settings.namespace},
        "data": {"config.yaml": text},
    }


class MigManager:
    def __init__(self, store: Store, settings: MigManagerSettings) -> None:
        self.store = store
        self.settings = settings
        self.applied: dict[str, str] = {}
        """Node → the config actually on its GPUs."""
        self.log: list[MigRecord] = []
        self._seen: dict[str, str] = {}
        self._busy: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubedouble-mig-manager", daemon=True)
        self._workers: list[threading.Thread] = []

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self.store.changed:
            self.store.changed.notify_all()
        self._thread.join(timeout=5)
        for w in self._workers:
            w.join(timeout=5)

    def states(self, node: str) -> list[str]:
        return [r.state for r in self.log if r.node == node]

    # -- the loop -------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            with self.store.changed:
                self.store.changed.wait(timeout=self.settings.poll_s)
            for node in self.store.view("/nodes"):
                name = node["metadata"]["name"]
                labels = node["metadata"].get("labels") or {}
                want = labels.get(CONFIG_LABEL, "")
                if name in self._busy or not want or self._seen.get(name) == want:
                    continue
                self._seen[name] = want
                if self.applied.get(name) == want and labels.get(STATE_LABEL) == "success":
                    continue
                self._busy.add(name)
                worker = threading.Thread(target=self._reconcile, args=(name, want), daemon=True)
                self._workers.append(worker)
                worker.start()

    def _configmap_name(self) -> str:
        for cp in self.store.view("nvidia.com/clusterpolicies"):
            name = ((cp.get("spec") or {}).get("migManager") or {}).get("config", {}).get("name")
            if name:
                return str(name)
        return self.settings.default_configmap

    def _configs(self) -> tuple[str, dict[str, Any] | None, str]:
        cm_name = self._configmap_name()
        cm = self.store.get("/configmaps", self.settings.namespace, cm_name)
        if cm is None:
            return cm_name, None, f"ConfigMap {self.settings.namespace}/{cm_name} not found"
        data = cm.get("data") or {}
        text = data.get("config.yaml") or next(iter(data.values()), "")
        try:
            doc = _parsed(text)
        except yaml.YAMLError as exc:
            return cm_name, None, f"ConfigMap {cm_name}: invalid YAML: {exc}"
        return cm_name, dict(doc.get("mig-configs") or {}) if isinstance(doc, dict) else {}, ""

    def _set(
        self, node: str, config: str, state: str, reason: str = "", *, deploy: str | None = None
    ) -> None:
        def change(obj: dict[str, Any]) -> None:
            labels = obj["metadata"].setdefault("labels", {})
            labels[STATE_LABEL] = state
            if deploy is not None:
                for key in DEPLOY_LABELS:
                    if key in labels:
                        labels[key] = deploy

        # label, journal and log in one step: a reader that sees one of them finds the others
        with self.store.lock:
            self.store.update("/nodes", "", node, change)
            self.store.record("mig-manager", "nodes", "", node, config=config, state=state, reason=reason)
            self.log.append(MigRecord(node, config, state, reason))

    def _reconcile(self, node: str, want: str) -> None:
        try:
            self._reconcile_inner(node, want)
        finally:
            self._busy.discard(node)
            with self.store.changed:
                self.store.changed.notify_all()

    def _reconcile_inner(self, node: str, want: str) -> None:
        cm_name, configs, error = self._configs()
        if configs is None or want not in configs:
            self._set(node, want, "failed", error or f'config "{want}" not found in ConfigMap {cm_name}')
            return
        if self.applied.get(node) == want:
            self._set(node, want, "success", "already applied")
            return
        obj = self.store.get("/nodes", "", node)
        if obj is None:
            return
        reason = check_config(obj["metadata"].get("labels") or {}, configs[want])
        if reason:
            self._set(node, want, "failed", reason)
            return
        has_clients = bool((obj["metadata"].get("labels") or {}).get(CLIENT_LABEL))
        self._set(node, want, "pending", deploy=PAUSED)
        time.sleep(self.settings.pending_s)
        if has_clients and not self._wait_for_clients(node):
            self._set(node, want, "failed", "timeout waiting for GPU client pods to stop", deploy="true")
            return
        broken = self.settings.failing_nodes.get(node)
        if broken:
            self._set(node, want, "failed", broken, deploy="true")
            return
        count = int((obj["metadata"].get("labels") or {}).get("nvidia.com/gpu.count", "1") or 1)
        previous = configs.get(self.applied.get(node, ""))
        holders = node_gpu_holders(self.store, node, reconfigured_gpus(previous, configs[want], count))
        if holders:
            self._set(node, want, "failed", f"{IN_USE}: {', '.join(holders)}", deploy="true")
            return
        was_enabled = self._enabled(configs.get(self.applied.get(node, ""), []))
        if self.settings.with_reboot and was_enabled != self._enabled(configs[want]):
            self._set(node, want, "rebooting")
            time.sleep(self.settings.reboot_s)
        time.sleep(self.settings.apply_s)
        self.applied[node] = want
        self._publish(node, configs[want])
        self._set(node, want, "success", deploy="true")

    def _client_pods(self, node: str) -> list[str]:
        """Pods on ``node`` owned by a DaemonSet whose template nodeSelector has the client key."""
        daemonsets = {ds["metadata"]["uid"]: ds for ds in self.store.view("apps/daemonsets")}
        out = []
        for pod in self.store.view("/pods"):
            if pod.get("spec", {}).get("nodeName") != node:
                continue
            for owner in pod["metadata"].get("ownerReferences") or []:
                ds = daemonsets.get(owner.get("uid", "")) if owner.get("kind") == "DaemonSet" else None
                selector = ((ds or {}).get("spec", {}).get("template", {}).get("spec", {})).get(
                    "nodeSelector"
                ) or {}
                if CLIENT_LABEL in selector:
                    out.append(f"{pod['metadata'].get('namespace', '')}/{pod['metadata']['name']}")
        return out

    def _wait_for_clients(self, node: str) -> bool:
        deadline = time.monotonic() + self.settings.client_wait_s
        waited: list[str] = []
        while True:
            left = self._client_pods(node)
            if not left:
                if waited:
                    self.store.record("mig-manager", "pods", "", node, waited_for=sorted(set(waited)))
                return True
            waited.extend(left)
            if time.monotonic() > deadline or self._stop.is_set():
                return False
            with self.store.changed:
                self.store.changed.wait(timeout=self.settings.poll_s)

    @staticmethod
    def _enabled(entries: Any) -> bool:
        return any(isinstance(e, dict) and e.get("mig-enabled") for e in entries or [])

    def _publish(self, node: str, entries: list[dict[str, Any]]) -> None:
        """What GPU Feature Discovery and the device plugin publish afterwards (:mod:`.deviceplugin`)."""

        def change(obj: dict[str, Any]) -> None:
            deviceplugin.publish(obj, node_resources(obj["metadata"].get("labels") or {}, entries))

        self.store.update("/nodes", "", node, change)
