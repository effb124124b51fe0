"""Settings and errors shared by ``apply``, its config writer and ``--dry-run``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rightsizer.errors import RightsizerError


class ApplyError(RightsizerError, RuntimeError):
    """Apply cannot start (no ClusterPolicy, unreadable ConfigMap, …); one line, nothing was changed on nodes."""


@dataclass(frozen=True)
class ApplySettings:
    namespace: str = "gpu-operator"
    """Namespace of the GPU Operator (where the MIG Manager reads its ConfigMap)."""
    configmap: str | None = None
    """ConfigMap to write; ``None``: the one the ClusterPolicy points at unless that is the operator's
    default (which the operator owns and rewrites), else ``gpupilot-mig-parted-config``."""
    cluster_policy: str | None = None
    """ClusterPolicy name; ``None``: the only one in the cluster."""
    repoint_cluster_policy: bool = False
    """Allow pointing the ClusterPolicy's ``spec.migManager.config.name`` at the ConfigMap apply writes
    when it points elsewhere (a cluster-wide change); without it apply refuses instead."""
    max_parallel: int = 1
    """Nodes reconfigured at the same time (a batch); a failure stops later batches."""
    timeout_s: float = 900.0
    """Per node: how long the MIG Manager may take from relabel to ``success`` (it waits up to 5 min
    for operands to stop, then reconfigures; a reboot takes longer)."""
    eviction_timeout_s: float = 300.0
    """Per node: how long evictions may be refused (429, PodDisruptionBudget) or pods take to go."""
    configmap_sync_s: float = 60.0
    """After changing the ConfigMap, wait this long before relabelling: kubelet propagates ConfigMap
    volume updates to the MIG Manager's pod with a delay (about a minute by default)."""
    retry_interval_s: float = 2.0
    """Pause between eviction retries and between polls after a failed watch."""
    api_retry_s: float = 120.0
    """Per call: how long transient API errors (429, 5xx, dropped connections) are retried, with
    backoff from ``retry_interval_s`` doubling to ``backoff_max_s`` or the server's ``Retry-After``.
    A node's deadline is ``eviction_timeout_s + timeout_s + api_retry_s`` from its start; its rollback
    gets ``api_retry_s`` of its own."""
    backoff_max_s: float = 30.0
    """Longest pause between two retries of a transient error (unless ``Retry-After`` asks more)."""
    conflict_retries: int = 8
    """How often a 409 Conflict is answered by re-reading and re-applying before giving up."""
    lease_duration_s: int = 60
    """The apply Lease (one run at a time, in ``namespace``) expires this long after its holder stopped
    renewing it (a killed run); renewed every third of it. 0: no Lease (tests of a single run only)."""
    event_namespace: str = "default"
    """Namespace of the Events recorded about nodes (``kubectl describe node`` lists them)."""
    workloads: str = "patch"
    """How disrupted workloads get their new GPU request: ``patch`` (apply patches their pod
    templates) or ``gitops`` (apply writes the patches to ``gitops_dir`` and waits for the live
    templates to change, up to ``gitops_timeout_s``)."""
    settle_timeout_s: float = 600.0
    """Per node: after the MIG Manager's success, how long the disrupted workloads may take to have
    their desired replicas Running and Ready with the new request before the node is rolled back."""
    gitops_dir: Path = Path("gpupilot-patches")
    """Where ``--workloads gitops`` writes its patches (a folder per plan id)."""
    gitops_timeout_s: float = 1800.0
    """Per node, ``--workloads gitops``: how long to wait for the live templates to change."""


def seconds_text(seconds: float) -> str:
    """``0.4s``, ``12s``, ``15m``: durations in messages as people read them."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 600 or seconds % 60:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}m"
