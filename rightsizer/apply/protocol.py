"""The node-side protocol of ``apply``: annotations, steps, patches and decisions (pure functions).

A node moves through these steps, each recorded in ``gpupilot.io/step`` before the next begins, so a
killed apply can be resumed (or rolled back) from exactly where it stopped::

    (label = plan's current config)
        → cordoned   (annotations plan-id, previous-config, was-unschedulable, workloads; spec.unschedulable=true)
        → requests-set (the disrupted workloads' pod templates ask for the new GPU resource)
        → drained    (the pods holding the node's GPUs evicted through the Eviction API)
        → relabeled  (nvidia.com/mig.config=<target>, stale nvidia.com/mig.config.state removed)
        → settling   (the MIG Manager said success; node uncordoned; waiting for the workloads)
        → done       (every disrupted workload Running and Ready with its new request)
      or → rolled-back (previous label and workload templates restored, node uncordoned, reason in
                        gpupilot.io/reason)

``gpupilot.io/workloads`` (:mod:`rightsizer.apply.workloads`) shows, before any template changes,
which workloads the node's change disrupts and the request moves their templates get.

The annotations are for people and the next run to read, never the authority: whoever holds the
node's kubelet credentials can rewrite them. What a run has in flight, and which workloads it
changed, is kept in the in-flight record (:mod:`rightsizer.apply.record`), where nodes cannot write;
the functions below are given nodes as the record shows them (:func:`rightsizer.apply.record.trusted_view`).

In-flight work belongs to the cluster, not to the run that started it: a node left at an in-flight
step by any run (another plan, a replica that died) is finished by the next run whose plan moves it
to the same config from the same one, and rolled back by any other (:func:`decide`,
:func:`orphan_decision`). ``gpupilot.io/cordoned-at`` records when the node was cordoned, so the
nodes disrupted on a day are read from the cluster (:func:`cordoned_at`).

Every patch carries the ``resourceVersion`` it was computed from: a concurrent writer (the MIG Manager
itself writes the state label) turns it into a 409 that the caller answers by re-reading and re-deciding.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
ANN_PLAN = "gpupilot.io/plan-id"
ANN_PREVIOUS = "gpupilot.io/previous-config"
ANN_TARGET = "gpupilot.io/target-config"
ANN_STEP = "gpupilot.io/step"
ANN_WAS_UNSCHEDULABLE = "gpupilot.io/was-unschedulable"
ANN_REASON = "gpupilot.io/reason"
ANN_CORDONED_AT = "gpupilot.io/cordoned-at"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


class Step(StrEnum):
    STARTING = "starting"
    """Only in the in-flight record (:mod:`rightsizer.apply.record`): recorded, cordon not confirmed."""
    CORDONED = "cordoned"
    REQUESTS_SET = "requests-set"
    DRAINED = "drained"
    RELABELED = "relabeled"
    SETTLING = "settling"
    DONE = "done"
    ROLLED_BACK = "rolled-back"


IN_FLIGHT = (Step.STARTING, Step.CORDONED, Step.REQUESTS_SET, Step.DRAINED, Step.RELABELED, Step.SETTLING)
"""In the order a change goes through them."""


@dataclass(frozen=True)
class NodeView:
    """What the protocol needs from a node object."""

    name: str
    resource_version: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    unschedulable: bool

    @property
    def config(self) -> str:
        return self.labels.get(CONFIG_LABEL, "")

    @property
    def state(self) -> str:
        return self.labels.get(STATE_LABEL, "")

    @property
    def plan_id(self) -> str:
        return self.annotations.get(ANN_PLAN, "")

    @property
    def step(self) -> str:
        return self.annotations.get(ANN_STEP, "")

    @property
    def previous(self) -> str:
        return self.annotations.get(ANN_PREVIOUS, "")

    @property
    def was_unschedulable(self) -> bool:
        return self.annotations.get(ANN_WAS_UNSCHEDULABLE, "false") == "true"

    @property
    def target(self) -> str:
        return self.annotations.get(ANN_TARGET, "")

    @property
    def in_flight(self) -> bool:
        """Left between cordon and done/rolled-back (by any run)."""
        return self.step in IN_FLIGHT


def view(obj: Mapping[str, Any]) -> NodeView:
    meta = obj.get("metadata") or {}
    return NodeView(
        name=str(meta.get("name", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        uid=str(meta.get("uid", "")),
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        unschedulable=bool((obj.get("spec") or {}).get("unschedulable", False)),
    )


@dataclass(frozen=True)
class Decision:
    """``action``: start | resume | skip | done | rollback. ``step`` is where a resume picks up;
    ``rollback``: another run's in-flight work this plan does not finish."""

    action: str
    reason: str = ""
    step: Step | None = None


def decide(node: NodeView, *, plan_id: str, current: str, target: str) -> Decision:
    """What to do with ``node`` for a plan that moves it from ``current`` to ``target`` config."""
    if node.plan_id == plan_id and node.step:
        return _marked_by_this_plan(node, plan_id)
    if node.in_flight:
        return orphan_decision(node, current=current, target=target)
    if node.config == target and node.state == "success":
        return Decision("done", f"already on {target}")
    if node.config != current:
        return Decision(
            "skip",
            f"changed since the plan: {CONFIG_LABEL} is {node.config or '(unset)'!r}, the plan expected {current!r}",
        )
    if node.state not in ("", "success"):
        return Decision(
            "skip", f"{STATE_LABEL}={node.state}: the MIG Manager is busy or failed; not touching it"
        )
    return Decision("start")


def orphan_decision(node: NodeView, *, current: str | None, target: str | None) -> Decision:
    """Another run's in-flight work on ``node``: resumed when this plan moves the node from the same
    config to the same one (its target is still what the fleet's usage asks for), else rolled back.
    ``current``/``target`` None: the node is not in this plan."""
    left = f"plan {node.plan_id or '(unknown)'} left this node at step {node.step}"
    if target is not None and node.target == target and node.previous == current:
        return Decision(
            "resume", f"{left}; finishing it (this plan also moves it to {target})", Step(node.step)
        )
    why = "this plan does not change it" if target is None else f"this plan wants {target}, not {node.target}"
    return Decision("rollback", f"{left}; rolling it back ({why})")


def cordoned_at(node: NodeView) -> dt.datetime | None:
    """When a run cordoned ``node`` for a MIG change (None: never, or an unreadable stamp)."""
    text = node.annotations.get(ANN_CORDONED_AT, "")
    try:
        stamp = dt.datetime.fromisoformat(text) if text else None
    except ValueError:
        return None
    if stamp is None:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.UTC)


def _marked_by_this_plan(node: NodeView, plan_id: str) -> Decision:
    """A node this plan's annotations already mark: done, rolled back, or where to resume."""
    if node.step == Step.DONE:
        return Decision("done", f"already applied by plan {plan_id}")
    if node.step == Step.ROLLED_BACK:
        reason = node.annotations.get(ANN_REASON, "")
        return Decision("skip", f"rolled back earlier by this plan ({reason}); make a new plan to retry")
    if node.step in IN_FLIGHT:
        return Decision("resume", f"resuming after step {node.step}", Step(node.step))
    return Decision("skip", f"unknown {ANN_STEP}={node.step!r}; fix or remove the annotation")


def _guard(node: NodeView) -> dict[str, Any]:
    return {"resourceVersion": node.resource_version}


def cordon_patch(
    node: NodeView,
    *,
    plan_id: str,
    target: str,
    now: str,
    previous: str | None = None,
    was_unschedulable: bool | None = None,
) -> dict[str, Any]:
    """``now``: RFC 3339 time of the cordon (``gpupilot.io/cordoned-at``, the daily budget's source);
    ``previous``/``was_unschedulable``: as recorded before the cordon (None: the node's now)."""
    before = node.unschedulable if was_unschedulable is None else was_unschedulable
    return {
        "metadata": {
            **_guard(node),
            "annotations": {
                ANN_PLAN: plan_id,
                ANN_PREVIOUS: node.config if previous is None else previous,
                ANN_TARGET: target,
                ANN_WAS_UNSCHEDULABLE: str(before).lower(),
                ANN_STEP: str(Step.CORDONED),
                ANN_CORDONED_AT: now,
                ANN_REASON: None,
            },
        },
        "spec": {"unschedulable": True},
    }


def step_patch(node: NodeView, step: Step) -> dict[str, Any]:
    return {"metadata": {**_guard(node), "annotations": {ANN_STEP: str(step)}}}


def relabel_patch(node: NodeView, *, target: str) -> dict[str, Any]:
    """New config label; the old state label goes so a stale ``success`` is never mistaken for the new one."""
    return {
        "metadata": {
            **_guard(node),
            "labels": {CONFIG_LABEL: target, STATE_LABEL: None},
            "annotations": {ANN_STEP: str(Step.RELABELED)},
        }
    }


def settling_patch(node: NodeView) -> dict[str, Any]:
    """The MIG Manager is done: uncordon so the replacements can land, and wait for them (``settling``)."""
    return {
        "metadata": {**_guard(node), "annotations": {ANN_STEP: str(Step.SETTLING)}},
        "spec": {"unschedulable": True if node.was_unschedulable else None},
    }


def finish_patch(node: NodeView) -> dict[str, Any]:
    return {
        "metadata": {**_guard(node), "annotations": {ANN_STEP: str(Step.DONE)}},
        "spec": {"unschedulable": True if node.was_unschedulable else None},
    }


def rollback_patch(node: NodeView, *, reason: str) -> dict[str, Any]:
    """Restore the previous label (when the label is still the one we set) and the node's schedulability."""
    patch: dict[str, Any] = {
        "metadata": {
            **_guard(node),
            "annotations": {ANN_STEP: str(Step.ROLLED_BACK), ANN_REASON: reason[:1000]},
        },
        "spec": {"unschedulable": True if node.was_unschedulable else None},
    }
    ours = node.config == node.annotations.get(ANN_TARGET)
    if node.previous and ours and node.config != node.previous:
        patch["metadata"]["labels"] = {CONFIG_LABEL: node.previous, STATE_LABEL: None}
    return patch


def holds_gpus(pod: Mapping[str, Any]) -> bool:
    """A pod that is not finished and requests whole GPUs or MIG devices."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    for container in (pod.get("spec") or {}).get("containers") or []:
        res = container.get("resources") or {}
        names = set(res.get("limits") or {}) | set(res.get("requests") or {})
        if any(n == GPU_RESOURCE or n.startswith(MIG_RESOURCE_PREFIX) for n in names):
            return True
    return False


def pod_key(pod: Mapping[str, Any]) -> tuple[str, str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", ""))


def node_event(
    node: NodeView, *, reason: str, message: str, warning: bool, namespace: str, now: str
) -> dict[str, Any]:
    """A core/v1 Event about the node, as ``kubectl describe node`` shows it."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node.name}.", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid},
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": "gpupilot-rightsizer"},
        "reportingComponent": "gpupilot-rightsizer",
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
