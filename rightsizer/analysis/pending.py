"""Pending GPU demand: pods the scheduler cannot place that request ``nvidia.com/gpu`` or
``nvidia.com/mig-<profile>``, from kube-state-metrics at the end of the window.

One instant query joins ``kube_pod_container_resource_requests`` (summed over a pod's containers)
with ``kube_pod_status_phase{phase="Pending"} == 1``. kube-state-metrics writes the resource name
with ``.``, ``/`` and ``-`` turned into ``_`` (``nvidia_com_mig_1g_10gb``); the original spelling is
accepted too.
"""

from __future__ import annotations

import math
import re

from rightsizer.analysis.types import PendingPod
from rightsizer.clients.prometheus import PrometheusClient

_SANITISED = re.compile(r"nvidia_com_mig_([0-9]+)g_([0-9]+)gb(_me)?")
_PLAIN = re.compile(r"nvidia\.com/mig-([0-9]+g\.[0-9]+gb(\+me)?)")
MAX_COUNT = 64
"""A pod requesting more devices than a node holds is not one the rightsizer can serve."""


def pending_query(*, cluster_label: str) -> str:
    by = f"{cluster_label}, namespace, pod"
    return (
        f"sum by ({by}, resource) (kube_pod_container_resource_requests"
        '{resource=~"nvidia_com_gpu|nvidia_com_mig_.+|nvidia.com/gpu|nvidia.com/mig-.+"})'
        f' * on ({by}) group_left () (max by ({by}) (kube_pod_status_phase{{phase="Pending"}}) == 1)'
    )


def profile_of(resource: str) -> str | None:
    """``""`` for a whole GPU, the MIG profile name for a MIG device, ``None`` for anything else."""
    if resource in ("nvidia_com_gpu", "nvidia.com/gpu"):
        return ""
    if m := _SANITISED.fullmatch(resource):
        return f"{m.group(1)}g.{m.group(2)}gb" + ("+me" if m.group(3) else "")
    if m := _PLAIN.fullmatch(resource):
        return m.group(1)
    return None


def read_pending(client: PrometheusClient, *, at: float, cluster_label: str) -> tuple[PendingPod, ...]:
    """Every Pending pod's GPU request at ``at`` (pods requesting several kinds count once per kind)."""
    out = []
    for s in client.instant(pending_query(cluster_label=cluster_label), at=at):
        profile = profile_of(s.labels.get("resource", ""))
        if profile is None or not math.isfinite(s.value) or not 1 <= s.value <= MAX_COUNT:
            continue
        out.append(
            PendingPod(
                cluster=s.labels.get(cluster_label, ""),
                namespace=s.labels.get("namespace", ""),
                name=s.labels.get("pod", ""),
                profile=profile,
                count=round(s.value),
            )
        )
    return tuple(sorted(out, key=lambda p: (p.cluster, p.namespace, p.name, p.profile)))
