"""PID → container, from the host's own files: ``/proc/<pid>/cgroup`` and ``/var/log/containers``.

A GPU process's cgroup path names its container: the runtime's container ID is the last path
element (``cri-containerd-<id>.scope``, ``crio-<id>.scope``, ``docker-<id>.scope`` under systemd,
or the bare ``<id>`` under cgroupfs), inside the pod's ``kubepods…pod<uid>`` slice. The kubelet
links every container's log as ``/var/log/containers/<pod>_<namespace>_<container>-<id>.log``
(the names log shippers read), so one directory listing maps container IDs to pods without the
Kubernetes API. Both roots are injectable, so tests use a fake tree of files.

Needs the host PID namespace (``hostPID: true``) and ``/var/log/containers`` mounted read-only;
a PID whose cgroup names no Kubernetes container (a host process, the MPS control daemon) has no
owner. Each collection reads one small file per GPU process and lists one directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from exporter.snapshot import PodRef

DEFAULT_PROC_ROOT = Path("/proc")
DEFAULT_CONTAINER_LOGS = Path("/var/log/containers")
MAX_CGROUP_BYTES = 16 * 1024
"""A process's cgroup file is one line per hierarchy (v1: ~13, v2: 1); more is not a cgroup file."""

_CONTAINER_ID = re.compile(r"(?:cri-containerd-|crio-|docker-|containerd-)?([0-9a-f]{64})(?:\.scope)?")
_LOG_NAME = re.compile(r"(?P<pod>[^_]+)_(?P<ns>[^_]+)_(?P<container>.+)-(?P<id>[0-9a-f]{64})\.log")


_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def pod_uid_from_cgroup(text: str) -> str:
    """The pod UID in a ``/proc/<pid>/cgroup`` path (``kubepods-burstable-pod<uid with _>.slice`` under
    systemd, ``/kubepods/burstable/pod<uid>/`` under cgroupfs), "" when there is none."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" in path and (m := _POD_UID.search(path)):
            return m.group(1).replace("_", "-")
    return ""


def container_id_from_cgroup(text: str) -> str | None:
    """The container ID in a ``/proc/<pid>/cgroup`` file (v1 or v2), if the process is in a pod."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        if "kubepods" not in path:
            continue
        last = path.rstrip("/").rsplit("/", 1)[-1]
        m = _CONTAINER_ID.fullmatch(last)
        if m is not None:
            return m.group(1)
    return None


def containers_from_log_names(names: Iterable[str]) -> dict[str, PodRef]:
    """``<pod>_<namespace>_<container>-<id>.log`` names → container ID → the container."""
    out: dict[str, PodRef] = {}
    for name in names:
        m = _LOG_NAME.fullmatch(name)
        if m is not None:
            out[m.group("id")] = PodRef(m.group("ns"), m.group("pod"), m.group("container"), resource="")
    return out


class ContainerIndex:
    """Finds the container of host PIDs; :meth:`owners` is called once per collection."""

    def __init__(
        self, *, proc_root: Path = DEFAULT_PROC_ROOT, container_logs: Path = DEFAULT_CONTAINER_LOGS
    ) -> None:
        self.proc_root = proc_root
        self.container_logs = container_logs

    def _cgroup(self, pid: int) -> str:
        try:
            with open(self.proc_root / str(pid) / "cgroup", "rb") as f:
                return f.read(MAX_CGROUP_BYTES).decode(errors="replace")
        except OSError:  # the process ended between NVML's list and now
            return ""

    def owners(self, pids: Iterable[int]) -> dict[int, PodRef]:
        """PID → container for the PIDs that run in a Kubernetes container; others are left out."""
        cgroups = {pid: self._cgroup(pid) for pid in set(pids)}
        ids = {pid: container_id_from_cgroup(text) for pid, text in cgroups.items()}
        if not any(ids.values()):
            return {}
        try:
            containers = containers_from_log_names(os.listdir(self.container_logs))
        except OSError:
            return {}
        return {
            pid: replace(containers[cid], pod_uid=pod_uid_from_cgroup(cgroups[pid]))
            for pid, cid in ids.items()
            if cid is not None and cid in containers
        }
