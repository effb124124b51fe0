"""PodDisruptionBudgets as a real cluster keeps them: the eviction registry, the disruption controller
and a ReplicaSet controller that brings replacements up.

Each rule names the Kubernetes source it follows (paths in kubernetes/kubernetes, v1.32):

- ``pkg/registry/core/pod/storage/eviction.go`` — the ``pods/eviction`` subresource (``EvictionREST``);
- ``pkg/controller/disruption/disruption.go`` — the controller that writes ``PodDisruptionBudget.status``;
- ``pkg/controller/replicaset/replica_set.go`` — replacements for pods that are going away.

The double runs the controllers synchronously after every write (the fastest controller a cluster
could have): the status an eviction reads is the one the controller last wrote, exactly as on a
cluster, and an eviction changes it (``disruptionsAllowed - 1``) until the controller sees the pod
gone and a replacement Ready.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

from tests.support.kubedouble import selectors
from tests.support.kubedouble.errors import ApiError
from tests.support.kubedouble.scheduler import PLACED_BY_RULE
from tests.support.kubedouble.store import Store, now_rfc3339

PDB = "policy/poddisruptionbudgets"
PODS = "/pods"
REPLICASETS = "apps/replicasets"

DELETION_TIMEOUT_S = 120.0
"""disruption.go ``DeletionTimeout = 2 * time.Minute``: an entry of ``status.disruptedPods`` whose pod
is not being deleted by then is dropped (the eviction is assumed not to have happened)."""

MULTIPLE_PDBS = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
)
"""eviction.go, ``len(pdbs) > 1``: a 500 with this message (the API server's own words)."""


def pod_ready(pod: dict[str, Any]) -> bool:
    """``podutil.IsPodReady``: the ``Ready`` condition is ``True`` (the phase alone is not enough)."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _parse_time(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)


def matching_pdbs(store: Store, pod: dict[str, Any]) -> list[dict[str, Any]]:
    """eviction.go ``getPodDisruptionBudgets``: PDBs of the pod's namespace whose selector matches its
    labels; "a PDB with a nil or empty selector ... should match nothing, not everything"."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    out = []
    for pdb in store.view(PDB, pod["metadata"].get("namespace", "")):
        sel = (pdb.get("spec") or {}).get("selector")
        if not sel or not (sel.get("matchLabels") or sel.get("matchExpressions")):
            continue
        if selectors.label_selector_object(sel)(labels):
            out.append(pdb)
    return out


def _scaled(value: int | str, total: int) -> int:
    """``intstr.GetScaledValueFromIntOrPercent(v, total, roundUp=true)``, as the controller calls it."""
    if isinstance(value, str) and value.endswith("%"):
        return -(-int(value[:-1]) * total // 100)
    return int(value)


class DisruptionController:
    """Keeps every PDB's ``status`` as ``disruption.go`` ``trySync`` computes it."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def hook(self, skey: str) -> None:
        if skey in (PODS, PDB, REPLICASETS):
            for pdb in self.store.view(PDB):
                self.sync(pdb)

    def _expected_scale(self, pods: list[dict[str, Any]]) -> int | None:
        """disruption.go ``getExpectedScale``: the sum of ``spec.replicas`` of the pods' controllers
        (each counted once); pods without a controller are "unmanaged" and add nothing; a controller
        that cannot be found is an error ("found no controllers for pod"): None."""
        seen: dict[tuple[str, str], int] = {}
        for pod in pods:
            meta = pod["metadata"]
            refs = [r for r in meta.get("ownerReferences") or [] if r.get("controller")]
            if not refs:
                continue
            ref = refs[0]
            rs = None
            if ref.get("kind") == "ReplicaSet":
                rs = self.store.get(REPLICASETS, meta.get("namespace", ""), ref.get("name", ""))
            if rs is None:
                return None
            seen[(meta.get("namespace", ""), ref["name"])] = int(rs["spec"].get("replicas", 1))
        return sum(seen.values())

    def sync(self, pdb: dict[str, Any]) -> None:
        ns = pdb["metadata"].get("namespace", "")
        spec = pdb.get("spec") or {}
        pred = selectors.label_selector_object(spec.get("selector"))
        pods = [p for p in self.store.view(PODS, ns) if pred(p["metadata"].get("labels") or {})]
        # getExpectedPodCount: maxUnavailable and a percentage minAvailable need the controllers'
        # scale; an integer minAvailable uses the number of pods.
        scale = None
        if spec.get("maxUnavailable") is not None or isinstance(spec.get("minAvailable"), str):
            scale = self._expected_scale(pods)
            if scale is None:  # failSafe: disruptionsAllowed = 0 until the controller can sync
                self._fail_safe(pdb)
                return
        if spec.get("maxUnavailable") is not None and scale is not None:
            expected = scale
            desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
        elif isinstance(spec.get("minAvailable"), str) and scale is not None:
            expected = scale
            desired = _scaled(spec["minAvailable"], expected)
        else:
            expected = len(pods)
            desired = int(spec.get("minAvailable") or 0)
        # buildDisruptedPodMap: keep an entry while its pod exists, is not yet being deleted and the
        # DeletionTimeout has not passed.
        now = dt.datetime.now(dt.UTC)
        by_name = {p["metadata"]["name"]: p for p in pods}
        old = dict((pdb.get("status") or {}).get("disruptedPods") or {})
        disrupted = {
            name: when
            for name, when in old.items()
            if name in by_name
            and not by_name[name]["metadata"].get("deletionTimestamp")
            and (now - _parse_time(when)).total_seconds() < DELETION_TIMEOUT_S
        }
        # countHealthyPods: not being deleted, not in disruptedPods, and Ready.
        healthy = sum(
            1
            for p in pods
            if not p["metadata"].get("deletionTimestamp")
            and p["metadata"]["name"] not in disrupted
            and pod_ready(p)
        )
        # updatePdbStatus: disruptionsAllowed = currentHealthy - desiredHealthy, never below 0, and 0
        # when no pods are expected.
        allowed = healthy - desired
        if expected <= 0 or allowed <= 0:
            allowed = 0
        status = {
            "observedGeneration": pdb["metadata"].get("generation", 1),
            "currentHealthy": healthy,
            "desiredHealthy": desired,
            "expectedPods": expected,
            "disruptionsAllowed": allowed,
            **({"disruptedPods": disrupted} if disrupted else {}),
            "conditions": [
                {
                    "type": "DisruptionAllowed",
                    "status": "True" if allowed > 0 else "False",
                    "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
                    "message": "",
                    "lastTransitionTime": now_rfc3339(),
                    "observedGeneration": pdb["metadata"].get("generation", 1),
                }
            ],
        }
        old_status = dict(pdb.get("status") or {})
        if _same_status(old_status, status):
            return
        pdb["status"] = status
        self.store.put(PDB, pdb, event="MODIFIED")

    def _fail_safe(self, pdb: dict[str, Any]) -> None:
        status = dict(pdb.get("status") or {})
        if status.get("disruptionsAllowed") == 0 and status.get("observedGeneration") is not None:
            return
        status.update(disruptionsAllowed=0, observedGeneration=pdb["metadata"].get("generation", 1))
        pdb["status"] = status
        self.store.put(PDB, pdb, event="MODIFIED")


def _same_status(a: dict[str, Any], b: dict[str, Any]) -> bool:
    def strip(s: dict[str, Any]) -> dict[str, Any]:
        out = dict(s)
        out["conditions"] = [
            {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in s.get("conditions") or []
        ]
        return out

    return strip(a) == strip(b)


def check_eviction(store: Store, pod: dict[str, Any]) -> tuple[bool, dict[str, Any] | None]:
    """``EvictionREST.Create``'s PDB part: (allowed, PDB to record the disruption in), or raises.

    Called under the store lock with the live pod.
    """
    phase = (pod.get("status") or {}).get("phase")
    # canIgnorePDB: terminal, Pending or already-terminating pods are deleted without a PDB check.
    if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get("deletionTimestamp"):
        return True, None
    pdbs = matching_pdbs(store, pod)
    if len(pdbs) > 1:
        raise ApiError(500, "InternalError", MULTIPLE_PDBS)
    if not pdbs:
        return True, None
    pdb = pdbs[0]
    spec, status = pdb.get("spec") or {}, pdb.get("status") or {}
    ready = pod_ready(pod)
    # An unhealthy pod: AlwaysAllow evicts it; IfHealthyBudget (the default) only while the budget
    # is met (``CurrentHealthy >= DesiredHealthy && DesiredHealthy > 0``), without decrementing.
    if not ready and spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow":
        return True, None
    if not ready and status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0) > 0:
        return True, None
    # checkAndDecrement
    name = pdb["metadata"]["name"]
    if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
        raise _too_many(name, f"The disruption budget {name} is still being processed by the server.")
    if status.get("disruptionsAllowed", 0) <= 0:
        raise _too_many(
            name,
            f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy pods "
            f"and has {status.get('currentHealthy', 0)} currently",
        )
    return True, pdb


def record_disruption(store: Store, pdb: dict[str, Any], pod_name: str) -> None:
    """checkAndDecrement: ``DisruptionsAllowed--`` and ``DisruptedPods[pod] = now``, written with
    ``UpdateStatus`` before the pod is deleted, "so it should not consider it as available"."""
    status = pdb.setdefault("status", {})
    status["disruptionsAllowed"] = int(status.get("disruptionsAllowed", 0)) - 1
    status.setdefault("disruptedPods", {})[pod_name] = now_rfc3339()
    store.put(PDB, pdb, event="MODIFIED")


def _too_many(pdb: str, cause: str) -> ApiError:
    return ApiError(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        details={"causes": [{"reason": "DisruptionBudget", "message": cause}]},
    )


class ReplicaSetController:
    """replica_set.go ``manageReplicas``: active pods (``FilterActivePods``: not terminating, not
    Succeeded/Failed) short of ``spec.replicas`` get a replacement from the template.

    A replacement starts ``Pending`` and unscheduled; after the ReplicaSet's annotation
    ``kubedouble/ready-after-s`` seconds it is bound to ``kubedouble/replacement-node`` and becomes
    Running and Ready. Without the annotation it stays Pending (no capacity anywhere).
    """

    READY_AFTER = "kubedouble/ready-after-s"
    NODE = "kubedouble/replacement-node"

    def __init__(self, store: Store) -> None:
        self.store = store
        self._timers: list[threading.Timer] = []
        self._serial = 0

    def hook(self, skey: str) -> None:
        if skey not in (PODS, REPLICASETS):
            return
        for rs in self.store.view(REPLICASETS):
            self._manage(rs)

    def _owned(self, rs: dict[str, Any]) -> list[dict[str, Any]]:
        uid, name = rs["metadata"].get("uid"), rs["metadata"]["name"]
        out = []
        for pod in self.store.view(PODS, rs["metadata"].get("namespace", "")):
            for ref in pod["metadata"].get("ownerReferences") or []:
                if (
                    ref.get("kind") == "ReplicaSet"
                    and ref.get("name") == name
                    and ref.get("uid") in (uid, None)
                ):
                    out.append(pod)
        return out

    def _manage(self, rs: dict[str, Any]) -> None:
        active = [
            p
            for p in self._owned(rs)
            if not p["metadata"].get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]
        missing = int(rs["spec"].get("replicas", 1)) - len(active)
        for _ in range(max(0, missing)):
            self._create(rs)
        owners = rs["metadata"].get("ownerReferences") or []
        if missing < 0 and any(r.get("kind") == "Deployment" for r in owners):
            # getPodsToDelete: unscheduled pods go first, then those not Ready
            def rank(p: dict[str, Any]) -> tuple[bool, bool]:
                return (bool(p["spec"].get("nodeName")), pod_ready(p))

            for pod in sorted(active, key=rank)[:-missing]:
                self.store.remove(PODS, pod["metadata"].get("namespace", ""), pod["metadata"]["name"])

    def _create(self, rs: dict[str, Any]) -> None:
        meta, ns = rs["metadata"], rs["metadata"].get("namespace", "default")
        template = (rs.get("spec") or {}).get("template") or {}
        self._serial += 1
        name = f"{meta['name']}-r{self._serial}"
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": ns,
                "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": meta["name"],
                        "uid": meta.get("uid"),
                        "controller": True,
                    }
                ],
            },
            "spec": dict(template.get("spec") or {"containers": []}),
            "status": {"phase": "Pending"},
        }
        pod["spec"].pop("nodeName", None)
        annotations = meta.get("annotations") or {}
        if self.NODE in annotations:
            pod["metadata"]["annotations"] = {PLACED_BY_RULE: "replicaset"}
        self.store.put(PODS, pod, event="ADDED")
        if self.READY_AFTER not in annotations:
            return
        node = annotations.get(self.NODE, "elsewhere")

        def ready() -> None:
            def change(o: dict[str, Any]) -> None:
                o["spec"]["nodeName"] = node
                o["status"] = {
                    "phase": "Running",
                    "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now_rfc3339()}],
                }

            if not self.store.closed:
                self.store.update(PODS, ns, name, change)

        timer = threading.Timer(float(annotations[self.READY_AFTER]), ready)
        timer.daemon = True
        timer.start()
        self._timers.append(timer)

    def close(self) -> None:
        for t in self._timers:
            t.cancel()
