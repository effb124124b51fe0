"""After a MIG change on a static-MIG DRA node: restart NVIDIA's DRA kubelet plugin, wait for its slices.

NVIDIA's DRA driver (``gpu.nvidia.com``) enumerates a node's devices once, when its kubelet-plugin pod
starts; after the MIG Manager changes the layout, the node's ResourceSlices keep advertising the old
instances until that pod is replaced. So on a node the driver serves (its ResourceSlices exist, or the
GPU Operator labels it ``nvidia.com/gpu.deploy.dra-driver=true``), once the MIG Manager reports
success and before the node is uncordoned, ``apply`` evicts the plugin pod on the node (label
``nvidia-dra-driver-gpu-component=kubelet-plugin``) through the Eviction API, as it evicts GPU pods
(its DaemonSet makes a new one) and waits until the
node's slices show the new layout's MIG instances, profile by profile.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rightsizer.apply.retry import Clock, Retrier
from rightsizer.apply.settings import seconds_text
from rightsizer.clients.kube import Kube, PermanentKubeError
from rightsizer.plan.management import DRA_LABEL, DRIVER, device_attribute, slice_devices
from rightsizer.plan.model import GpuLayout

PLUGIN_LABEL = ("nvidia-dra-driver-gpu-component", "kubelet-plugin")


class PluginNotReady(Exception):
    """The node's slices did not show the new layout in time (the caller rolls back)."""


def expected_profiles(layout: Sequence[GpuLayout]) -> Counter[str]:
    """MIG profile → instances the proposed layout makes."""
    out: Counter[str] = Counter()
    for gpu in layout:
        if gpu.mig_enabled:
            out.update({p: n for p, n in gpu.mig_devices.items() if n})
    return out


def published_profiles(slices: Iterable[Mapping[str, Any]]) -> Counter[str]:
    """MIG profile → instances the slices advertise (static MIG: the devices with a ``uuid``)."""
    out: Counter[str] = Counter()
    for rslice in slices:
        for fields in slice_devices(rslice):
            if device_attribute(fields, "type") == "mig" and device_attribute(fields, "uuid") is not None:
                out[device_attribute(fields, "profile") or "?"] += 1
    return out


def plugin_pods(pods: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(namespace, name) of the DRA kubelet-plugin pods among ``pods`` that are not already going."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (meta.get("labels") or {}).get(PLUGIN_LABEL[0]) == PLUGIN_LABEL[1] and not meta.get(
            "deletionTimestamp"
        ):
            out.append((str(meta.get("namespace", "")), str(meta.get("name", ""))))
    return out


def restart(
    kube: Kube,
    *,
    node: str,
    labels: Mapping[str, str],
    proposed: Sequence[GpuLayout],
    retrier: Retrier,
    clock: Clock,
    timeout_s: float,
    poll_s: float,
    progress: Callable[[str], None],
) -> None:
    """Restart the plugin on a DRA node and wait for its slices; nothing on a node the driver does not
    serve. :class:`PluginNotReady` when the slices still show another layout after ``timeout_s``."""

    def read() -> list[dict[str, Any]] | None:
        try:
            return retrier.call(
                f"list {DRIVER} ResourceSlices of {node}",
                lambda: kube.list_resource_slices(driver=DRIVER, node=node),
            )
        except PermanentKubeError as exc:
            if exc.status not in (403, 404):
                raise
            return None

    slices = read()
    if not slices and labels.get(DRA_LABEL) != "true":
        return
    pods = plugin_pods(retrier.call(f"list pods on {node}", lambda: kube.pods_on_node(node)))
    if not pods:
        progress(
            f"no DRA kubelet-plugin pod ({PLUGIN_LABEL[0]}={PLUGIN_LABEL[1]}) on the node: its "
            f"{DRIVER} ResourceSlices may still show the old MIG instances until the plugin restarts"
        )
        return
    for ns, name in pods:
        retrier.call(f"evict {ns}/{name}", functools.partial(kube.evict_pod, ns, name))
        progress(
            f"evicted the DRA kubelet-plugin pod {ns}/{name} (its DaemonSet starts a new one) so the "
            "driver enumerates the new MIG instances"
        )
    if slices is None:
        progress(f"not allowed to read {DRIVER} ResourceSlices: not waiting for the new ones")
        return
    want = expected_profiles(proposed)
    deadline = clock.monotonic() + timeout_s
    while True:
        seen = published_profiles(read() or [])
        if seen == want:
            progress(f"{DRIVER} ResourceSlices show the new MIG instances ({_text(seen)})")
            return
        if clock.monotonic() >= deadline:
            raise PluginNotReady(
                f"the DRA driver's ResourceSlices on {node} still show {_text(seen)} after "
                f"{seconds_text(timeout_s)}, not the new layout's {_text(want)} (is its kubelet-plugin pod running?)"
            )
        clock.sleep(poll_s)


def _text(profiles: Counter[str]) -> str:
    return " + ".join(f"{p}×{n}" for p, n in sorted(profiles.items())) or "no MIG instance"
