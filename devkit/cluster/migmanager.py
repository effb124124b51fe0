"""A stand-in for NVIDIA's MIG Manager on the real control plane, acting only through the API.

It follows the node-label protocol the real one follows (reference/mig-geometry.md): it watches every
Node's ``nvidia.com/mig.config``; when the value changes to a config it has not applied, it reads the
mig-parted ConfigMap the ClusterPolicy's ``spec.migManager.config.name`` names in the operator
namespace, and

1. an unknown name, or a config that does not fit the node's GPUs → ``nvidia.com/mig.config.state``
   ``failed`` (nothing changes on the node);
2. else ``pending``, the operand ``nvidia.com/gpu.deploy.*`` labels set to ``paused-for-mig-change``;
3. after ``pending_s``: a node listed in :attr:`MigManager.failing_nodes` fails (a GPU that will
   not reset, for rollback tests); a pod still holding a GPU the change re-creates → ``failed``
   ("In use by another client"); it never evicts anything;
4. else the node's ``status.capacity``/``allocatable`` get the extended resources the device plugin
   advertises for the new layout (a status patch, as the kubelet publishes them), GPU Feature
   Discovery's ``nvidia.com/mig-<profile>.count`` labels follow, the operand labels go back to
   ``true`` and the state to ``success``.

After a failure it does not retry until the label changes. Every state it sets is kept in
:attr:`MigManager.log`.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devkit.cluster import deviceplugin
from devkit.cluster.kubeclient import Kube, KubeError
from devkit.cluster.migconfig import check_config, node_resources, reconfigured_gpus
from devkit.cluster.nodes import DEFAULT_CONFIGMAP, OPERATOR_NAMESPACE

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
PAUSED = "paused-for-mig-change"
IN_USE = "In use by another client"


@dataclass(frozen=True)
class MigRecord:
    node: str
    config: str
    state: str
    reason: str = ""


@dataclass
class MigManager:
    kubeconfig: Path
    namespace: str = OPERATOR_NAMESPACE
    pending_s: float = 0.5
    """Time in ``pending`` before the in-use check (the real one waits for the operands to stop)."""
    failing_nodes: dict[str, str] = field(default_factory=dict)
    """node → reason: any new config fails there after ``pending``."""
    applied: dict[str, str] = field(default_factory=dict)
    """Node → the config on its GPUs (seeded from the nodes' labels at start)."""
    log: list[MigRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.kube = Kube(self.kubeconfig)
        self._busy: set[str] = set()
        self._failed: dict[str, str] = {}
        self._known: set[str] = set()
        """Nodes seen at least once."""
        """Node → the config that failed there: not tried again until the label changes."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mig-manager", daemon=True)
        self._workers: list[threading.Thread] = []

    def start(self) -> MigManager:
        for node in self.kube.list("v1", "Node"):
            labels = node["metadata"].get("labels") or {}
            self._known.add(node["metadata"]["name"])
            if labels.get(CONFIG_LABEL) and labels.get(STATE_LABEL) == "success":
                self.applied[node["metadata"]["name"]] = labels[CONFIG_LABEL]
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for worker in self._workers:
            worker.join(timeout=10)

    def states(self, node: str) -> list[str]:
        return [r.state for r in self.log if r.node == node]

    # -- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        delay = 0.2
        while not self._stop.is_set():
            try:
                for _kind, node in self.kube.watch("v1", "Node", timeout_seconds=5):
                    self._consider(node)
                    if self._stop.is_set():
                        return
                delay = 0.2
            except (KubeError, OSError, ValueError) as exc:  # a cut watch: list again after a pause
                self.log.append(MigRecord("", "", "watch-error", str(exc)[:200]))
                self._stop.wait(delay + random.uniform(0, delay))
                delay = min(5.0, delay * 2)
            except Exception as exc:
                self.log.append(MigRecord("", "", "watch-error", repr(exc)[:200]))
                self._stop.wait(1.0)

    def _consider(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        want = labels.get(CONFIG_LABEL, "")
        with self._lock:
            if name not in self._known:
                # a node that joins with its config applied (what GPU Feature Discovery reports)
                self._known.add(name)
                if want and labels.get(STATE_LABEL) == "success":
                    self.applied.setdefault(name, want)
            if not want or name in self._busy or self.applied.get(name) == want:
                return
            if self._failed.get(name) == want:
                return
            self._failed.pop(name, None)
            self._busy.add(name)
        worker = threading.Thread(target=self._reconcile, args=(name, want), daemon=True)
        self._workers.append(worker)
        worker.start()

    # -- one change -----------------------------------------------------------------------------

    def _reconcile(self, node: str, want: str) -> None:
        try:
            self._reconcile_inner(node, want)
        except KubeError as exc:
            self.log.append(MigRecord(node, want, "error", str(exc)[:200]))
        finally:
            with self._lock:
                self._busy.discard(node)

    def _configs(self) -> tuple[str, dict[str, Any] | None, str]:
        name = DEFAULT_CONFIGMAP
        for policy in self.kube.list("nvidia.com/v1", "ClusterPolicy"):
            pointed = (((policy.get("spec") or {}).get("migManager") or {}).get("config") or {}).get("name")
            if pointed:
                name = str(pointed)
        cm = self.kube.get("v1", "ConfigMap", name, self.namespace)
        if cm is None:
            return name, None, f"ConfigMap {self.namespace}/{name} not found"
        data = cm.get("data") or {}
        text = data.get("config.yaml") or next(iter(data.values()), "")
        try:
            doc = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            return name, None, f"ConfigMap {name}: invalid YAML: {str(exc).splitlines()[0]}"
        configs = doc.get("mig-configs") if isinstance(doc, dict) else None
        return name, dict(configs) if isinstance(configs, dict) else {}, ""

    def _reconcile_inner(self, node: str, want: str) -> None:
        cm_name, configs, error = self._configs()
        if configs is None or want not in configs:
            self._set(node, want, "failed", error or f'config "{want}" not found in ConfigMap {cm_name}')
            return
        obj = self.kube.get("v1", "Node", node)
        if obj is None:
            return
        labels = dict(obj["metadata"].get("labels") or {})
        reason = check_config(labels, configs[want])
        if reason:
            self._set(node, want, "failed", reason)
            return
        self._set(node, want, "pending", deploy=PAUSED)
        time.sleep(self.pending_s)
        broken = self.failing_nodes.get(node)
        if broken:
            self._set(node, want, "failed", broken, deploy="true")
            return
        count = int(labels.get("nvidia.com/gpu.count", "1") or 1)
        previous = configs.get(self.applied.get(node, ""))
        holders = self._gpu_holders(node, reconfigured_gpus(previous, configs[want], count))
        if holders:
            self._set(node, want, "failed", f"{IN_USE}: {', '.join(holders)}", deploy="true")
            return
        self._publish(obj, configs[want])
        self.applied[node] = want
        self._set(node, want, "success", deploy="true")

    def _gpu_holders(self, node: str, gpus: set[int] | None) -> list[str]:
        """Pods on ``node`` (not finished) that ask for whole GPUs or MIG devices. Which GPU a pod
        holds is the kubelet's to know, not the API's: any such pod counts as holding every GPU
        (``gpus`` decides nothing here), the conservative side of mig-parted's check."""
        del gpus
        out = []
        for pod in self.kube.list("v1", "Pod", field_selector=f"spec.nodeName={node}"):
            if ((pod.get("status") or {}).get("phase")) in ("Succeeded", "Failed"):
                continue
            for container in (pod.get("spec") or {}).get("containers") or []:
                res = container.get("resources") or {}
                names = set(res.get("limits") or {}) | set(res.get("requests") or {})
                if any(n == deviceplugin.GPU or n.startswith(deviceplugin.MIG_PREFIX) for n in names):
                    out.append(f"{pod['metadata'].get('namespace', '')}/{pod['metadata']['name']}")
                    break
        return out

    def _publish(self, node: dict[str, Any], entries: Any) -> None:
        """What the device plugin and GPU Feature Discovery publish after the re-partition."""
        labels = dict(node["metadata"].get("labels") or {})
        before = {"metadata": {"labels": dict(labels)}, "status": dict(node.get("status") or {})}
        after: dict[str, Any] = {
            "metadata": {"labels": dict(labels)},
            "status": {
                k: dict(v or {}) for k, v in before["status"].items() if k in ("capacity", "allocatable")
            },
        }
        deviceplugin.publish(after, node_resources(labels, entries))
        status_patch: dict[str, Any] = {}
        for part in ("capacity", "allocatable"):
            old = dict(before["status"].get(part) or {})
            new = after["status"][part]
            status_patch[part] = {**dict.fromkeys(set(old) - set(new)), **new}
        name = node["metadata"]["name"]
        self.kube.merge_patch("v1", "Node", name, {"status": status_patch}, subresource="status")
        new_labels = after["metadata"]["labels"]
        label_patch = {**dict.fromkeys(set(labels) - set(new_labels)), **new_labels}
        self.kube.merge_patch("v1", "Node", name, {"metadata": {"labels": label_patch}})

    def _set(
        self, node: str, config: str, state: str, reason: str = "", *, deploy: str | None = None
    ) -> None:
        labels: dict[str, str] = {STATE_LABEL: state}
        if deploy is not None:
            obj = self.kube.get("v1", "Node", node) or {}
            for key in (obj.get("metadata") or {}).get("labels") or {}:
                if key.startswith(DEPLOY_PREFIX):
                    labels[key] = deploy
        if state == "failed":
            self._failed[node] = config
        with contextlib.suppress(KubeError):
            self.kube.merge_patch("v1", "Node", node, {"metadata": {"labels": labels}})
        self.log.append(MigRecord(node, config, state, reason))
