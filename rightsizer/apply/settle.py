"""Post-conditions of a node's change, watched through the API: workloads settled, templates live.

- :func:`wait_settled`: every disrupted workload has its desired replicas Running and Ready, each
  asking for the new request (``--settle-timeout``). Until then a pod that cannot be placed shows the
  scheduler's reason (``PodScheduled=False``, e.g. "0/3 nodes are available: 3 Insufficient
  nvidia.com/mig-1g.10gb."), which becomes the rollback's reason.
- :func:`wait_templates`: with ``--workloads gitops`` someone else (Argo CD, Flux) changes the
  templates; apply waits until the live templates carry the new request before it evicts anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rightsizer.apply.retry import Retrier
from rightsizer.apply.settings import seconds_text
from rightsizer.apply.workloads import (
    Change,
    gpu_requests,
    has_moves_applied,
    label_selector,
    template_of,
)
from rightsizer.clients.kube import Kube
from rightsizer.errors import RightsizerError


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class NotSettled(RightsizerError):
    """The post-condition did not hold in time; the message says which workload and why."""


@dataclass(frozen=True)
class WorkloadState:
    """One row of the apply table: a workload, its request change and its pods now."""

    change: Change
    running: int
    """Pods Running and Ready with the new request (not being deleted)."""
    desired: int
    waiting: tuple[str, ...] = ()
    """``pod: reason`` for pods that are not (yet) counted (Pending with the scheduler's message, …)."""

    @property
    def settled(self) -> bool:
        return self.running >= self.desired


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def _why(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"Pending ({c.get('reason', 'Unschedulable')}: {c.get('message', '')})"
    return str(status.get("phase") or "Pending")


def observe(kube: Kube, change: Change) -> WorkloadState:
    """Count the workload's pods that satisfy the post-condition (read-only)."""
    pods = kube.list_pods(change.namespace, label_selector=label_selector(change.selector))
    running, waiting = 0, []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        asks = gpu_requests(pod.get("spec") or {})
        new_request = all(asks[new] > 0 and asks[old] == 0 for old, new, _ in change.moves)
        if (pod.get("status") or {}).get("phase") == "Running" and _ready(pod) and new_request:
            running += 1
        elif not new_request and (pod.get("status") or {}).get("phase") == "Running":
            waiting.append(f"{meta.get('name')}: still on the old request")
        else:
            waiting.append(f"{meta.get('name')}: {_why(pod)}")
    return WorkloadState(change, running, change.replicas, tuple(waiting))


def wait_settled(
    kube: Kube,
    changes: Sequence[Change],
    *,
    clock: Clock,
    timeout_s: float,
    interval_s: float,
    retrier: Retrier,
    progress: Callable[[str], None],
) -> tuple[WorkloadState, ...]:
    """Poll until every workload is settled; :class:`NotSettled` after ``timeout_s``."""
    deadline = clock.monotonic() + timeout_s
    said: dict[str, tuple[int, int]] = {}
    while True:
        states = tuple(
            retrier.call(f"list pods of {c.ref}", lambda c=c: observe(kube, c))  # type: ignore[misc]
            for c in changes
        )
        for s in states:
            now = (s.running, s.desired)
            if said.get(s.change.ref) != now:
                said[s.change.ref] = now
                progress(f"{s.change.ref}: {s.running}/{s.desired} Running and Ready with the new request")
        if all(s.settled for s in states):
            return states
        if clock.monotonic() >= deadline:
            late = [s for s in states if not s.settled]
            detail = "; ".join(
                f"{s.change.ref} has {s.running}/{s.desired} Running and Ready"
                + (f" ({', '.join(s.waiting[:3])})" if s.waiting else "")
                for s in late
            )
            raise NotSettled(f"workloads not settled after {seconds_text(timeout_s)}: {detail}")
        clock.sleep(interval_s)


def wait_templates(
    kube: Kube,
    changes: Sequence[Change],
    *,
    clock: Clock,
    timeout_s: float,
    interval_s: float,
    retrier: Retrier,
    progress: Callable[[str], None],
) -> None:
    """Poll until every changed workload's live pod template asks for the new request (gitops)."""
    deadline = clock.monotonic() + timeout_s
    waiting = [c for c in changes if c.moves]
    while waiting:
        still = []
        for c in waiting:
            obj = retrier.call(
                f"read {c.ref}",
                lambda c=c: kube.get_workload(c.kind, c.namespace, c.name),  # type: ignore[misc]
            )
            if has_moves_applied(template_of(obj, c.kind), c.moves):
                progress(f"{c.ref}: the live template asks for {c.new_request}")
            else:
                still.append(c)
        waiting = still
        if not waiting:
            return
        if clock.monotonic() >= deadline:
            names = ", ".join(f"{c.ref} (wants {c.new_request})" for c in waiting)
            raise NotSettled(
                f"the live templates did not change within {seconds_text(timeout_s)}: {names}; "
                "merge and sync the written patches, then run apply again"
            )
        clock.sleep(interval_s)
