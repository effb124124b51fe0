"""Will the replacements fit? The check ``apply`` makes before it evicts anything from a node.

After the relabel the node advertises what the device plugin makes of the proposed layout
(``nvidia.com/mig-<profile>`` per instance under the mixed strategy, ``nvidia.com/gpu`` per instance
under single and per MIG-off GPU, each times the replicas GPU Feature Discovery labels for that
resource, ``<resource>.replicas``: ``nvidia.com/gpu.replicas`` multiplies ``nvidia.com/gpu`` only, as a
time-slicing config replicates only the resources it names). The demand is
every replica of each workload whose template changes (all of them are re-created with the new
request, wherever they run) plus the replacement of each evicted pod whose request stays (pods
without a controller are not re-created and ask for nothing). The supply is the node's new
layout less the pods that stay on it, plus what other schedulable nodes have free now (allocatable
less the requests of the pods bound there, not counting the pods that are about to be replaced).
Node selectors and affinities are not looked at: the check is necessary, not sufficient, and the
post-condition (:mod:`rightsizer.apply.settle`) catches the rest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from rightsizer.apply.protocol import GPU_RESOURCE, MIG_RESOURCE_PREFIX
from rightsizer.apply.workloads import Change, gpu_requests, moved_requests
from rightsizer.plan.model import GpuLayout

REPLICAS_SUFFIX = ".replicas"
"""GFD's per-resource label ``<resource>.replicas`` (``nvidia.com/gpu.replicas``, ``nvidia.com/mig-1g.10gb.replicas``)."""


def replicas_of(labels: Mapping[str, str]) -> dict[str, int]:
    """Resource → the replicas GFD labels the node with (only the resources a sharing config replicates)."""
    out = {}
    for key, value in labels.items():
        if key.startswith("nvidia.com/") and key.endswith(REPLICAS_SUFFIX):
            n = _quantity(value)
            if n > 1:
                out[key[: -len(REPLICAS_SUFFIX)]] = n
    return out


def advertised(layout: Sequence[GpuLayout], *, strategy: str, replicas: Mapping[str, int]) -> Counter[str]:
    """What the device plugin advertises for ``layout`` (k8s-device-plugin's MIG strategies), each
    resource times its own ``replicas`` (1 when the sharing config does not replicate it)."""
    out: Counter[str] = Counter()
    for gpu in layout:
        if not gpu.mig_enabled or strategy == "none":
            out[GPU_RESOURCE] += 1
        elif strategy == "single":
            out[GPU_RESOURCE] += sum(gpu.mig_devices.values())
        else:
            for profile, n in gpu.mig_devices.items():
                out[MIG_RESOURCE_PREFIX + profile] += n
    return Counter({k: v * max(1, replicas.get(k, 1)) for k, v in out.items() if v})


def _quantity(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _schedulable(node: Mapping[str, Any]) -> bool:
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _active(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _split(ref: str) -> tuple[str, str]:
    ns, _, name = ref.partition("/")
    return ns, name


def _belongs(pod: Mapping[str, Any], change: Change) -> bool:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    return (
        meta.get("namespace") == change.namespace
        and bool(change.selector)
        and all(labels.get(k) == v for k, v in change.selector.items())
    )


def shortfall(
    *,
    node: str,
    proposed: Sequence[GpuLayout],
    strategy: str,
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    evicted: set[tuple[str, str]],
    changes: Sequence[Change],
) -> str:
    """ "" when every replacement has a device to go to, else one line naming what is short."""
    this = next((n for n in nodes if (n.get("metadata") or {}).get("name") == node), {})
    labels = (this.get("metadata") or {}).get("labels") or {}
    replicas = replicas_of(labels)
    moving = [c for c in changes if c.moves]
    replaced = {_key(p) for p in pods if any(_belongs(p, c) for c in moving)} | evicted

    supply: Counter[str] = advertised(proposed, strategy=strategy, replicas=replicas)
    elsewhere: Counter[str] = Counter()
    used: dict[str, Counter[str]] = {}
    for p in pods:
        bound = (p.get("spec") or {}).get("nodeName")
        if bound and _active(p) and _key(p) not in replaced:
            used.setdefault(str(bound), Counter()).update(gpu_requests(p.get("spec") or {}))
    for n in nodes:
        name = str((n.get("metadata") or {}).get("name", ""))
        if name == node:
            continue
        if not _schedulable(n):
            continue
        alloc = (n.get("status") or {}).get("allocatable") or {}
        for res, q in alloc.items():
            if res == GPU_RESOURCE or res.startswith(MIG_RESOURCE_PREFIX):
                elsewhere[res] += max(0, _quantity(q) - used.get(name, Counter())[res])
    here = supply - used.get(node, Counter())

    demand: Counter[str] = Counter()
    who: dict[str, list[str]] = {}
    by_key = {_key(p): p for p in pods}
    for c in changes:
        if c.moves:
            sample = next((by_key[_split(k)] for k in c.pods if _split(k) in by_key), None)
            per_pod = moved_requests(gpu_requests((sample or {}).get("spec") or {}), c.moves)
            for res, q in per_pod.items():
                demand[res] += q * c.replicas
                who.setdefault(res, []).append(f"{c.ref} ×{c.replicas}")
            continue
        for ref in c.pods:  # replacements of the evicted pods, asking what they asked
            pod = by_key.get(_split(ref))
            for res, q in gpu_requests((pod or {}).get("spec") or {}).items():
                demand[res] += q
                who.setdefault(res, []).append(f"pod {ref} ({c.ref})")
    problems = []
    for res, need in sorted(demand.items()):
        have = here[res] + elsewhere[res]
        if need > have:
            problems.append(
                f"{res}: {need} needed ({', '.join(who[res])}) but {have} free after the change "
                f"({node}: {here[res]}, other nodes: {elsewhere[res]})"
            )
    return "; ".join(problems)
