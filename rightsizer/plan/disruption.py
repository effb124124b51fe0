"""What a node change disrupts: the one rule ``plan``, its notes, ``report``, ``apply --dry-run`` and
``apply`` all use.

What the MIG Manager does to a node's GPUs (NVIDIA mig-parted, which the MIG Manager runs as
``nvidia-mig-parted apply`` for the node's selected config; ``cmd/nvidia-mig-manager/reconfigure_mig.go``):

* ``cmd/nvidia-mig-parted/apply/apply.go``: the MIG *mode* step runs only when ``assert --mode-only``
  fails, i.e. when some GPU's MIG mode differs from the config; then the *config* step.
* ``apply/config.go`` (``ApplyMigConfig``), per GPU: ``if current.Equals(mc.MigDevices)`` it logs
  "Skipping -- already set to desired value"; otherwise ``SetMigConfig`` destroys that GPU's
  instances and creates the new ones (refused with "In use by another client" while a pod holds one).
* ``apply/mode.go`` (``ApplyMigMode``): clears the MIG config of every selected GPU whose mode is not
  disabled, sets the modes and, when a mode change is pending, resets all GPUs of the node
  (``util.ResetAllGPUs``); with ``WITH_REBOOT`` the node may reboot instead.

So without a MIG mode change only the GPUs whose ``mig-devices`` change lose their instances and the
pods on the other GPUs keep running; when any GPU of the node switches MIG on or off, every GPU of
the node is cleared or reset and every GPU pod of the node must go. On top of that a pod the plan
gives another device (another GPU, profile or node) has to be evicted to move, even if its GPU keeps
its layout. The MIG Manager evicts nothing itself (it fails while devices are in use), so ``apply``
evicts exactly these pods, plus GPU pods the plan did not see (started after it: their GPU is not
known, so they cannot be assumed safe).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rightsizer.plan.model import DisruptedPod, GpuLayout, HeldDevice, NodePlan


def _signature(g: GpuLayout) -> tuple[bool, tuple[tuple[str, int], ...]]:
    return (
        g.mig_enabled,
        tuple(sorted((k, v) for k, v in g.mig_devices.items() if v)) if g.mig_enabled else (),
    )


def mode_changes(current: Sequence[GpuLayout], proposed: Sequence[GpuLayout]) -> bool:
    """True when some GPU switches MIG on or off: mig-parted then clears or resets every GPU."""
    now = {g.index: g.mig_enabled for g in current}
    return any(now.get(g.index, g.mig_enabled) != g.mig_enabled for g in proposed)


def reconfigured_gpus(current: Sequence[GpuLayout], proposed: Sequence[GpuLayout]) -> frozenset[int]:
    """Indices of the GPUs whose instances the MIG Manager destroys when the node moves to ``proposed``."""
    now = {g.index: g for g in current}
    changed = frozenset(
        g.index for g in proposed if g.index not in now or _signature(now[g.index]) != _signature(g)
    )
    if not changed:
        return frozenset()
    if mode_changes(current, proposed):
        return frozenset(g.index for g in current) | frozenset(g.index for g in proposed)
    return changed


@dataclass(frozen=True)
class Target:
    """The device the plan gives one of a pod's current devices."""

    held: HeldDevice
    node: str
    gpu: int
    profile: str

    @property
    def moves(self) -> bool:
        return (self.gpu, self.profile) != (self.held.gpu, self.held.profile)


@dataclass(frozen=True)
class PodPlacement:
    """A pod on the node, the devices it holds now, and where the plan puts those it re-places."""

    pod: DisruptedPod
    targets: tuple[Target, ...] = ()
    """One per MIG device the plan places; devices without one (whole GPUs) stay as they are."""

    def moves(self, node: str) -> bool:
        return any(t.node != node or t.moves for t in self.targets)


def split_pods(
    placements: Iterable[PodPlacement],
    *,
    node: str,
    current: Sequence[GpuLayout],
    proposed: Sequence[GpuLayout],
) -> tuple[tuple[DisruptedPod, ...], tuple[DisruptedPod, ...]]:
    """``(disrupted, kept)``: pods on GPUs the MIG Manager re-creates or given another device, and the rest."""
    gone = reconfigured_gpus(current, proposed)
    disrupted, kept = [], []
    for p in placements:
        if p.moves(node) or any(d.gpu in gone for d in p.pod.devices):
            disrupted.append(p.pod)
        else:
            kept.append(p.pod)
    return tuple(sorted(disrupted, key=_key)), tuple(sorted(kept, key=_key))


def _key(p: DisruptedPod) -> tuple[str, str]:
    return (p.namespace, p.name)


class LayoutMismatchError(ValueError):
    """Pods would request more devices of a profile than a GPU's proposed layout has."""


def check_requests_fit(
    node: str,
    proposed: Sequence[GpuLayout],
    *,
    staying: Iterable[DisruptedPod],
    arriving: Iterable[Target],
) -> None:
    """After the plan every pod's request is a slot of the proposed layout: pods that stay keep their
    devices, pods that move take the slots the plan names; no GPU gets more of a profile than it has.

    Raises :class:`LayoutMismatchError` naming the node, GPU and profile otherwise."""
    # Devices, not pods: pods sharing one known device (time-sliced, or one leaving as the next
    # arrives within the history's last samples) use its slot once.
    kept: dict[object, tuple[int, str]] = {}
    for n, pod in enumerate(staying):
        for i, d in enumerate(pod.devices):
            if d.profile:
                known = d.gpu_instance_id or d.uuid
                kept[(d.gpu, d.profile, d.gpu_instance_id, d.uuid) if known else (n, i)] = (d.gpu, d.profile)
    landing: dict[object, tuple[int, str]] = {}
    for n, t in enumerate(arriving):
        if t.node == node:
            known = t.held.gpu_instance_id or t.held.uuid
            key = (t.held.gpu, t.held.gpu_instance_id, t.held.uuid, t.gpu, t.profile) if known else n
            landing[key] = (t.gpu, t.profile)
    use: Counter[tuple[int, str]] = Counter([*kept.values(), *landing.values()])
    have = {(g.index, name): n for g in proposed if g.mig_enabled for name, n in g.mig_devices.items()}
    for (gpu, profile), n in sorted(use.items()):
        if n > have.get((gpu, profile), 0):
            raise LayoutMismatchError(
                f"{node} GPU {gpu}: {n} pod device(s) would use nvidia.com/mig-{profile} but the proposed "
                f"layout has {have.get((gpu, profile), 0)}"
            )


@dataclass(frozen=True)
class Eviction:
    namespace: str
    name: str
    reason: str


def evictions(node: NodePlan, holders: Iterable[tuple[str, str]]) -> tuple[Eviction, ...]:
    """The pods ``apply`` evicts before relabelling ``node``, from the GPU pods on it now.

    ``holders`` are ``(namespace, name)`` of the running pods that request GPUs or MIG devices. A pod
    the plan lists as disrupted goes; one it saw on a GPU that keeps its layout stays; one it did not
    see goes too (it started after the plan; its GPU is unknown)."""
    disrupted = {(p.namespace, p.name) for p in node.pods_disrupted}
    kept = {(p.namespace, p.name) for p in node.pods_kept}
    out = []
    for ns, name in sorted(set(holders)):
        if (ns, name) in disrupted:
            out.append(Eviction(ns, name, "listed in the plan"))
        elif (ns, name) not in kept:
            out.append(Eviction(ns, name, "not in the plan (started since): its GPU is unknown"))
    return tuple(out)


def disruption_summary(node: NodePlan) -> str:
    """One line for the plan's notes and the report: what the change re-creates and who must go."""
    gone = reconfigured_gpus(node.current, node.proposed)
    if not gone:
        return ""
    gpus = ", ".join(str(i) for i in sorted(gone))
    why = (
        "a GPU switches MIG mode, so mig-parted clears or resets every GPU of the node"
        if mode_changes(node.current, node.proposed)
        else "only GPUs whose layout changes are re-created"
    )
    return (
        f"{node.name}: GPU(s) {gpus} re-created ({why}); {len(node.pods_disrupted)} pod(s) evicted, "
        f"{len(node.pods_kept)} keep running"
    )
