"""The workloads behind a node's disrupted pods, and the request changes a plan makes to them.

A plan that moves a pod from ``nvidia.com/mig-3g.40gb`` to ``nvidia.com/mig-1g.10gb`` (mixed strategy)
only works if the pod's replacement asks for the new resource: the replacement comes from its
controller's pod template, so the template is what changes. Owners are followed as the controllers
own pods: Pod → ReplicaSet → Deployment, Pod → StatefulSet. A pod without a controller (a bare pod)
is not re-created after eviction, and a Job's pod template is immutable (the API server refuses the
change): pods of those whose profile changes are refused, with what to do.

Pure parts (moves, template patches, the node annotation's codec) take plain dicts; :func:`resolve`
reads owners through :class:`rightsizer.clients.kube.Kube`.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rightsizer.apply.protocol import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from rightsizer.clients.kube import Kube, NotFoundError
from rightsizer.errors import RightsizerError
from rightsizer.plan.model import DisruptedPod, NodePlan

ANN_WORKLOADS = "gpupilot.io/workloads"
"""Node annotation, written with the cordon: JSON list of the workloads the node's change disrupts
and the request moves apply makes to their templates (``Change.to_json``); rollback reads it back."""
ANN_WORKLOAD_MODE = "gpupilot.io/workloads-mode"
"""Node annotation: ``patch`` (apply changed the templates itself) or ``gitops`` (someone else did)."""
ANN_CHANGED_BY = "gpupilot.io/requests-changed-by"
"""Workload annotation: the plan id that changed its GPU request (set with the template patch)."""

TEMPLATE_PATHS = {
    "Deployment": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
}
"""Where each kind apply patches keeps its pod template."""


class WorkloadRefused(RightsizerError):
    """A disrupted pod's request cannot be changed (bare pod, Job, conflicting moves): nothing is evicted."""


Move = tuple[str, str, int]
"""``(old resource, new resource, count)``: ``count`` devices of ``old`` become ``new``."""


@dataclass(frozen=True)
class Change:
    """One workload a node's change disrupts, and the moves its pod template gets (none: unchanged)."""

    kind: str
    namespace: str
    name: str
    replicas: int
    selector: Mapping[str, str]
    moves: tuple[Move, ...] = ()
    pods: tuple[str, ...] = field(default=())
    """The disrupted pods (``ns/name``) it owns on the node."""

    @property
    def ref(self) -> str:
        return f"{self.kind.lower()}/{self.namespace}/{self.name}"

    @property
    def old_request(self) -> str:
        return ", ".join(f"{old}: {n}" for old, _, n in self.moves)

    @property
    def new_request(self) -> str:
        return ", ".join(f"{new}: {n}" for _, new, n in self.moves)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "replicas": self.replicas,
            "selector": dict(self.selector),
            "moves": [list(m) for m in self.moves],
            "pods": list(self.pods),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Change:
        return cls(
            kind=str(doc["kind"]),
            namespace=str(doc["namespace"]),
            name=str(doc["name"]),
            replicas=int(doc.get("replicas", 1)),
            selector={str(k): str(v) for k, v in (doc.get("selector") or {}).items()},
            moves=tuple((str(m[0]), str(m[1]), int(m[2])) for m in doc.get("moves") or []),
            pods=tuple(str(p) for p in doc.get("pods") or []),
        )


def encode(changes: Sequence[Change]) -> str:
    return json.dumps([c.to_json() for c in changes], separators=(",", ":"), sort_keys=True)


def decode(text: str | None) -> tuple[Change, ...]:
    """The changes a node's annotation records; ``()`` when absent or unreadable (nothing to undo)."""
    if not text:
        return ()
    try:
        return tuple(Change.from_json(d) for d in json.loads(text))
    except (ValueError, KeyError, TypeError, IndexError, RecursionError):
        return ()


def pod_moves(pod: DisruptedPod, *, strategy: str) -> tuple[Move, ...]:
    """The request moves the plan gives ``pod``: held MIG devices whose target profile differs.

    Under the ``single`` strategy every device is ``nvidia.com/gpu`` whatever its profile: no move."""
    if strategy == "single":
        return ()
    held = [d for d in pod.devices if d.profile]
    moved: Counter[tuple[str, str]] = Counter()
    for device, target in zip(held, pod.targets, strict=False):
        if target.profile and target.profile != device.profile:
            moved[(MIG_RESOURCE_PREFIX + device.profile, MIG_RESOURCE_PREFIX + target.profile)] += 1
    return tuple((old, new, n) for (old, new), n in sorted(moved.items()))


def gpu_requests(pod_spec: Mapping[str, Any]) -> Counter[str]:
    """GPU resources (``nvidia.com/gpu``, ``nvidia.com/mig-*``) a pod spec asks for, summed over containers."""
    out: Counter[str] = Counter()
    for c in pod_spec.get("containers") or []:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for name, value in merged.items():
            if name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX):
                try:
                    out[name] += int(str(value))
                except ValueError:
                    continue
    return out


def moved_requests(requests: Mapping[str, int], moves: Iterable[Move]) -> Counter[str]:
    out = Counter(requests)
    for old, new, n in moves:
        take = min(n, out[old])
        out[old] -= take
        out[new] += take
    return +out


def template_of(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    node: Any = obj
    for key in TEMPLATE_PATHS[kind]:
        node = (node or {}).get(key) or {}
    return dict(node)


def moved_containers(containers: Sequence[Mapping[str, Any]], moves: Iterable[Move]) -> list[dict[str, Any]]:
    """The containers with ``moves`` applied to their limits and requests (first holders first)."""
    out = [copy.deepcopy(dict(c)) for c in containers]
    for old, new, n in moves:
        left = n
        for c in out:
            res = c.setdefault("resources", {})
            held = {**(res.get("limits") or {}), **(res.get("requests") or {})}.get(old)
            if left <= 0 or held is None:
                continue
            q = int(str(held))
            take = min(q, left)
            left -= take
            for part in ("limits", "requests"):
                values = res.get(part)
                if values is None or old not in values:
                    continue
                rest = q - take
                if rest:
                    values[old] = str(rest)
                else:
                    del values[old]
                values[new] = str(int(str(values.get(new, 0))) + take)
    return out


def has_moves_applied(template: Mapping[str, Any], moves: Iterable[Move]) -> bool:
    """The template asks for every move's new resource and none of the old (the change is live)."""
    asks = gpu_requests(template.get("spec") or {})
    return all(asks[new] > 0 and asks[old] == 0 for old, new, _ in moves)


def template_patch(
    obj: Mapping[str, Any], kind: str, moves: Sequence[Move], *, plan_id: str
) -> dict[str, Any]:
    """A JSON merge patch of the pod template's containers, guarded by the object's resourceVersion."""
    template = template_of(obj, kind)
    containers = moved_containers((template.get("spec") or {}).get("containers") or [], moves)
    inner: dict[str, Any] = {"spec": {"containers": containers}}
    for key in reversed(TEMPLATE_PATHS[kind]):
        inner = {key: inner}
    meta = obj.get("metadata") or {}
    inner["metadata"] = {
        "resourceVersion": meta.get("resourceVersion"),
        "annotations": {ANN_CHANGED_BY: plan_id or None},
    }
    return inner


def reverse(moves: Sequence[Move]) -> tuple[Move, ...]:
    return tuple((new, old, n) for old, new, n in moves)


def label_selector(selector: Mapping[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def _controller(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def owner_of(kube: Kube, pod: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | str:
    """``(kind, object)`` of the workload whose template makes ``pod``, or why there is none to change."""
    meta = pod.get("metadata") or {}
    ns, name = meta.get("namespace", ""), meta.get("name", "")
    ref = _controller(pod)
    if ref is None:
        return f"pod {ns}/{name} has no controller (a bare pod is not re-created after eviction)"
    kind = str(ref.get("kind", ""))
    if kind in ("Job", "CronJob"):
        return (
            f"pod {ns}/{name} belongs to Job {ref.get('name')}, whose pod template is immutable; let it "
            "finish or recreate it with the new request, then run apply again"
        )
    if kind not in TEMPLATE_PATHS:
        return f"pod {ns}/{name} is controlled by a {kind} ({ref.get('name')}), which apply does not change"
    try:
        obj = kube.get_workload(kind, ns, str(ref.get("name")))
    except NotFoundError:
        return f"pod {ns}/{name}: its {kind} {ref.get('name')} is gone"
    if kind == "ReplicaSet":
        parent = _controller(obj)
        if parent is not None and parent.get("kind") == "Deployment":
            try:
                return "Deployment", kube.get_workload("Deployment", ns, str(parent.get("name")))
            except NotFoundError:
                return f"pod {ns}/{name}: its Deployment {parent.get('name')} is gone"
    return kind, obj


def resolve(
    kube: Kube, pn: NodePlan, pods: Sequence[Mapping[str, Any]], evicted: set[tuple[str, str]]
) -> tuple[Change, ...]:
    """The workloads of the pods apply evicts from the node, with the moves the plan gives them.

    Raises :class:`WorkloadRefused` when a pod whose request must change cannot have it changed, or when
    two pods of one workload would need different requests. Pods whose owner cannot be followed and
    whose request stays are left out (nothing to change, nothing to wait for)."""
    planned = {(p.namespace, p.name): pod_moves(p, strategy=pn.mig_strategy) for p in pn.pods_disrupted}
    by_ref: dict[tuple[str, str, str], Change] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if key not in evicted:
            continue
        moves = planned.get(key, ())
        owner = owner_of(kube, pod)
        if isinstance(owner, str):
            if moves:
                raise WorkloadRefused(f"{owner}; it would need {_moves_text(moves)}")
            continue
        kind, obj = owner
        ometa, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        ref = (kind, str(ometa.get("namespace", "")), str(ometa.get("name", "")))
        found = by_ref.get(ref)
        if found is not None and found.moves and moves and found.moves != moves:
            raise WorkloadRefused(
                f"pods of {kind.lower()}/{ref[1]}/{ref[2]} would need different requests "
                f"({_moves_text(found.moves)} vs {_moves_text(moves)}); one template cannot say both"
            )
        pods_of = (*(found.pods if found else ()), f"{key[0]}/{key[1]}")
        by_ref[ref] = Change(
            kind=kind,
            namespace=ref[1],
            name=ref[2],
            replicas=int(spec.get("replicas", 1)),
            selector={
                str(k): str(v) for k, v in ((spec.get("selector") or {}).get("matchLabels") or {}).items()
            },
            moves=moves or (found.moves if found else ()),
            pods=pods_of,
        )
    return tuple(by_ref[k] for k in sorted(by_ref))


def _moves_text(moves: Sequence[Move]) -> str:
    return ", ".join(f"{old} → {new}" + (f" ×{n}" if n > 1 else "") for old, new, n in moves)
