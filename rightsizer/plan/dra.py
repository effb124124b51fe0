"""DRA nodes: which nodes the rightsizer may relabel, and what it advises for those it must not.

Per node, from the exporter's series over the window:

* ``device-plugin``: no device there came from a ResourceClaim (no ``dra_claim_name``); MIG layouts
  are the MIG Manager's (``nvidia.com/mig.config``), planned as before.
* ``dra-static-mig``: claimed devices, and a stable set of MIG instances (the layout was made ahead
  of time, by an administrator or the MIG Manager); planned as before.
* ``dra-dynamic-mig``: claimed devices, and MIG instances that come and go with the claims (NVIDIA's
  DRA driver with ``DynamicMIG`` creates an instance when a claim is prepared, with a new UUID, and
  destroys it on release): more distinct MIG instances over the window than the node holds now. The
  MIG Manager must not run on such nodes, so they are **never relabelled**: they leave the plan's
  node list, and the plan advises instead which MIG profile each workload's ResourceClaimTemplate
  should request (a CEL device selector), from the workload's own history.

History is keyed by namespace/pod/claim/profile, never by MIG UUID (a new one per claim). A node that
was reconfigured once during the window reads as dynamic: the safe side (it is left alone).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mig_geometry import catalogue
from rightsizer.analysis import history
from rightsizer.analysis.types import Analysis, PodKey
from rightsizer.clients.prometheus import PrometheusClient, Sample
from rightsizer.plan.management import DEVICE_PLUGIN, DRA_DYNAMIC, DRA_STATIC

GPU_CLASS, MIG_CLASS = "gpu.nvidia.com", "mig.nvidia.com"
"""NVIDIA's DeviceClasses: ``gpu.nvidia.com`` selects ``type == 'gpu'`` (whole GPUs), ``mig.nvidia.com``
``type == 'mig'``: a claim moved between them changes its ``deviceClassName``, not only a selector."""
CLAIMED = 'dra_claim_name!=""'


@dataclass(frozen=True)
class NodeMode:
    node: str
    mode: str
    reason: str
    cluster: str = ""


@dataclass(frozen=True)
class ClaimUse:
    """One pod's use of one claimed device profile over the window (``profile`` "" = a whole GPU)."""

    cluster: str
    node: str
    namespace: str
    pod: str
    claim: str
    profile: str
    model: str
    peak_memory_mib: float | None = None
    peak_activity: float | None = None


@dataclass(frozen=True)
class ClaimAdvice:
    """What a workload's ResourceClaimTemplate should request on dynamic-MIG nodes."""

    workload: str
    namespace: str
    model: str
    current_profile: str
    recommended_profile: str
    peak_memory_mib: float | None
    peak_activity: float | None
    claims: tuple[str, ...]
    selector: str
    """CEL device selector for the template's request (``device.attributes[...]``); "" for a whole GPU
    (the ``gpu.nvidia.com`` class selects every whole GPU)."""
    reason: str
    cluster: str = ""
    device_class: str = MIG_CLASS
    """The request's ``deviceClassName``: ``mig.nvidia.com`` for a profile, ``gpu.nvidia.com`` for a whole GPU."""

    @property
    def changes(self) -> bool:
        return self.recommended_profile != self.current_profile


@dataclass(frozen=True)
class DraAdvice:
    nodes: tuple[NodeMode, ...] = ()
    claims: tuple[ClaimAdvice, ...] = ()

    @property
    def dynamic_nodes(self) -> frozenset[tuple[str, str]]:
        return frozenset((n.cluster, n.node) for n in self.nodes if n.mode == DRA_DYNAMIC)


# ---------------------------------------------------------------------------------------------- pure


def node_modes(
    nodes: Iterable[tuple[str, str]],
    *,
    claimed: Iterable[tuple[str, str]],
    instances_seen: Mapping[tuple[str, str], float],
    instances_now: Mapping[tuple[str, str], float],
) -> tuple[NodeMode, ...]:
    """Each (cluster, node) → its mode, from which nodes had claimed devices and how many distinct
    MIG instances they showed over the window against now."""
    claimed_set = set(claimed)
    out = []
    for cluster, node in sorted(set(nodes)):
        key = (cluster, node)
        seen, now = instances_seen.get(key, 0.0), instances_now.get(key, 0.0)
        if key not in claimed_set:
            out.append(NodeMode(node, DEVICE_PLUGIN, "no device came from a ResourceClaim", cluster))
        elif seen > now:
            out.append(
                NodeMode(
                    node,
                    DRA_DYNAMIC,
                    f"{seen:.0f} MIG instances over the window, {now:.0f} now: created per claim",
                    cluster,
                )
            )
        else:
            out.append(
                NodeMode(
                    node, DRA_STATIC, f"claimed devices on a stable set of {now:.0f} MIG instance(s)", cluster
                )
            )
    return tuple(out)


def with_cluster_modes(
    modes: Sequence[NodeMode], cluster: Mapping[tuple[str, str], tuple[str, str]]
) -> tuple[NodeMode, ...]:
    """The series' modes joined with what the cluster says ((cluster, node) → (mode, reason), from
    :func:`rightsizer.plan.management.mode`): dynamic when either says so, then static, the safe side."""
    rank = {DEVICE_PLUGIN: 0, DRA_STATIC: 1, DRA_DYNAMIC: 2}
    out = []
    for m in modes:
        said = cluster.get((m.cluster, m.node))
        stronger = said is not None and rank.get(said[0], 0) > rank.get(m.mode, 0)
        out.append(NodeMode(m.node, said[0], said[1], m.cluster) if said and stronger else m)
    return tuple(out)


def selector_for(profile: str) -> str:
    """The CEL expression a ResourceClaimTemplate request of class ``mig.nvidia.com`` uses to ask NVIDIA's
    driver for ``profile`` ("" for a whole GPU: no selector, the ``gpu.nvidia.com`` class is enough)."""
    return f'device.attributes["gpu.nvidia.com"].profile == "{profile}"' if profile else ""


def recommend_profile(
    model_name: str,
    *,
    current: str,
    peak_memory_mib: float | None,
    peak_activity: float | None,
    headroom: float,
) -> tuple[str, str]:
    """(profile, reason): the smallest profile of the model that holds the peak memory and the peak
    activity (scaled to compute slices) with ``headroom``; the current one when history is missing.
    A whole-GPU claim (``current`` "") that needs every compute slice stays a whole GPU (""): the
    full-size MIG profile gives it nothing and costs the MIG mode."""
    model = catalogue.find_model(model_name)
    if model is None or not model.profiles:
        return current, f"model {model_name!r} has no MIG profiles in the catalogue"
    if peak_memory_mib is None or peak_activity is None:
        return current, "no memory or activity history for this claim"
    full = max(p.compute_slices for p in model.profiles)
    cur = model.profile(current) if current else None
    current_compute = cur.compute_slices if cur is not None else full
    need_compute = peak_activity * current_compute * (1 + headroom)
    need_mib = peak_memory_mib * (1 + headroom)
    fits = [
        p
        for p in model.profiles
        if not p.media_extensions and p.memory_mib >= need_mib and p.compute_slices >= need_compute
    ]
    if not fits:
        if not current:
            return "", "needs a whole GPU: keep the gpu.nvidia.com claim"
        best = max(model.profiles, key=lambda p: (p.compute_slices, p.memory_mib))
        return best.name, "needs the largest profile"
    best = min(fits, key=lambda p: (p.memory_slices, p.compute_slices, p.memory_mib))
    if not current and best.compute_slices >= full:
        return "", "needs a whole GPU's compute: keep the gpu.nvidia.com claim"
    return best.name, (
        f"peak {peak_memory_mib:.0f} MiB and {peak_activity:.0%} of {current or 'a whole GPU'} "
        f"(+{headroom:.0%} headroom) fit {best.name}"
    )


def _workload_of(pod: str) -> str:
    """``infer-7d9f8b6c5-x2x9q`` → ``infer``; a StatefulSet's ``db-0`` → ``db``: the template's owner."""
    base = re.sub(r"-[a-z0-9]{5}$", "", pod)
    base = re.sub(r"-[a-f0-9]{8,10}$", "", base)
    return re.sub(r"-\d+$", "", base)


def advise(
    uses: Sequence[ClaimUse], *, owners: Mapping[tuple[str, PodKey], str], headroom: float
) -> tuple[ClaimAdvice, ...]:
    """Group uses by workload and current profile; advise each group from its peak."""
    groups: dict[tuple[str, str, str, str], list[ClaimUse]] = {}
    for u in uses:
        workload = (
            owners.get((u.cluster, PodKey(u.namespace, u.pod))) or f"{u.namespace}/{_workload_of(u.pod)}"
        )
        groups.setdefault((u.cluster, workload, u.profile, u.model), []).append(u)
    out = []
    for (cluster, workload, profile, model), group in sorted(groups.items()):
        mems = [u.peak_memory_mib for u in group if u.peak_memory_mib is not None]
        acts = [u.peak_activity for u in group if u.peak_activity is not None]
        mem, act = (max(mems) if mems else None), (max(acts) if acts else None)
        rec, reason = recommend_profile(
            model, current=profile, peak_memory_mib=mem, peak_activity=act, headroom=headroom
        )
        if rec and not profile:
            reason += f"; move the request's deviceClassName from {GPU_CLASS} to {MIG_CLASS}"
        out.append(
            ClaimAdvice(
                workload=workload,
                namespace=group[0].namespace,
                model=model,
                current_profile=profile,
                recommended_profile=rec,
                peak_memory_mib=mem,
                peak_activity=act,
                claims=tuple(sorted({u.claim for u in group})),
                selector=selector_for(rec),
                reason=reason,
                cluster=cluster,
                device_class=MIG_CLASS if rec else GPU_CLASS,
            )
        )
    return tuple(out)


def without_nodes(result: Analysis, nodes: frozenset[tuple[str, str]]) -> Analysis:
    """The analysis without ``nodes`` (cluster, name): what the MIG planner may touch."""
    if not nodes:
        return result
    return replace(
        result,
        nodes=tuple(n for n in result.nodes if (n.cluster, n.name) not in nodes),
        devices=tuple(d for d in result.devices if (d.cluster, d.node) not in nodes),
        workloads=tuple(w for w in result.workloads if not _on(w.pods, result, nodes)),
    )


def _on(pods: Iterable[PodKey], result: Analysis, nodes: frozenset[tuple[str, str]]) -> bool:
    wanted = set(pods)
    return any((d.cluster, d.node) in nodes and wanted & set(d.pods) for d in result.devices)


# ---------------------------------------------------------------------------------------------- queries


def _key(s: Sample, cluster_label: str) -> tuple[str, str]:
    return s.labels.get(cluster_label, ""), s.labels.get("Hostname", "")


def exporter_modes(
    client: PrometheusClient, *, end: float, window: str, cluster_label: str
) -> dict[tuple[str, str], tuple[str, str]]:
    """(cluster, node) → (mode, reason) from the exporter's ``gpupilot_dra_node_info`` (it reads its
    node's ResourceSlices): DynamicMIG at any time in the window wins."""
    c = cluster_label
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for s in client.instant(
        f"max by ({c}, Hostname, mig_mode) (last_over_time(gpupilot_dra_node_info[{window}]))", end
    ):
        key = _key(s, c)
        if s.labels.get("mig_mode") == "dynamic":
            out[key] = (
                DRA_DYNAMIC,
                "the exporter saw DynamicMIG ResourceSlices (MIG devices without uuid) on the node",
            )
        elif key not in out:
            out[key] = (DRA_STATIC, "the exporter saw NVIDIA's DRA driver's ResourceSlices on the node")
    return out


def detect(
    client: PrometheusClient,
    result: Analysis,
    *,
    end: float,
    window_s: float,
    headroom: float,
    cluster_label: str = history.CLUSTER,
    cluster_modes: Mapping[tuple[str, str], tuple[str, str]] | None = None,
) -> DraAdvice:
    """Modes of the analysed nodes and, for dynamic-MIG nodes, advice per workload (six queries).
    ``cluster_modes``: what the Kubernetes API says of the nodes (ResourceSlices, the operator's
    label); it and the exporter's ``gpupilot_dra_node_info`` can only make a node more DRA than its
    claims' series do."""
    w = f"{max(1, round(window_s))}s"
    c = cluster_label
    by = f"{c}, Hostname, namespace, pod, dra_claim_name, dra_mig_profile, modelName"
    said = dict(cluster_modes or {})
    for key, mode in exporter_modes(client, end=end, window=w, cluster_label=c).items():
        if key not in said or (mode[0] == DRA_DYNAMIC and said[key][0] != DRA_DYNAMIC):
            said[key] = mode
    claimed = {
        _key(s, c)
        for s in client.instant(
            f"count by ({c}, Hostname) (last_over_time(gpupilot_device_pod_info{{{CLAIMED}}}[{w}]))", end
        )
    }
    if not claimed and not said:
        return DraAdvice()
    seen = {
        _key(s, c): s.value
        for s in client.instant(
            f"count by ({c}, Hostname) (count_over_time(gpupilot_mig_instance_info[{w}]))", end
        )
    }
    now = {
        _key(s, c): s.value
        for s in client.instant(
            f"count by ({c}, Hostname) (last_over_time(gpupilot_mig_instance_info[15m]))", end
        )
    }
    modes = node_modes(
        ((n.cluster, n.name) for n in result.nodes), claimed=claimed, instances_seen=seen, instances_now=now
    )
    modes = with_cluster_modes(modes, said)
    dynamic = frozenset((m.cluster, m.node) for m in modes if m.mode == DRA_DYNAMIC)
    if not dynamic:
        return DraAdvice(nodes=modes)
    mem = client.instant(f"max by ({by}) (max_over_time(DCGM_FI_DEV_FB_USED{{{CLAIMED}}}[{w}]))", end)
    act = client.instant(
        f"max by ({by}) (max_over_time(avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{CLAIMED}}}[15m])[{w}:5m]))",
        end,
    )

    def ident(s: Sample) -> tuple[str, str, str, str, str, str, str]:
        lab = s.labels
        return (
            lab.get(c, ""),
            lab.get("Hostname", ""),
            lab.get("namespace", ""),
            lab.get("pod", ""),
            lab.get("dra_claim_name", ""),
            lab.get("dra_mig_profile", ""),
            lab.get("modelName", ""),
        )

    peaks: dict[tuple[str, str, str, str, str, str, str], list[float | None]] = {}
    for s in mem:
        peaks.setdefault(ident(s), [None, None])[0] = s.value
    for s in act:
        peaks.setdefault(ident(s), [None, None])[1] = s.value
    uses = [
        ClaimUse(k[0], k[1], k[2], k[3], k[4], k[5], k[6], v[0], v[1])
        for k, v in sorted(peaks.items())
        if (k[0], k[1]) in dynamic
    ]
    owners = history.owners(client, start=end - window_s, end=end, cluster_label=c)
    return DraAdvice(nodes=modes, claims=advise(uses, owners=owners, headroom=headroom))


# ---------------------------------------------------------------------------------------------- plan.json


def to_dict(advice: DraAdvice) -> dict[str, Any]:
    return {
        "nodes": [
            {
                **({"cluster": n.cluster} if n.cluster else {}),
                "node": n.node,
                "mode": n.mode,
                "reason": n.reason,
            }
            for n in advice.nodes
        ],
        "claim_templates": [
            {
                **({"cluster": a.cluster} if a.cluster else {}),
                "workload": a.workload,
                "namespace": a.namespace,
                "model": a.model,
                "current_profile": a.current_profile,
                "recommended_profile": a.recommended_profile,
                "peak_memory_mib": None if a.peak_memory_mib is None else round(a.peak_memory_mib, 1),
                "peak_activity": None if a.peak_activity is None else round(a.peak_activity, 4),
                "claims": list(a.claims),
                "device_class": a.device_class,
                "selector": a.selector,
                "reason": a.reason,
            }
            for a in advice.claims
        ],
    }


def table_lines(doc: Mapping[str, Any]) -> list[str]:
    """Lines for the plan table from plan.json's ``dra`` section: dynamic-MIG nodes left alone, and
    each workload's advice."""
    lines = []
    for n in doc.get("nodes", ()):
        if not isinstance(n, Mapping):
            continue
        if n.get("mode") == DRA_DYNAMIC:
            lines.append(
                f"dra: {n.get('node')} is {n.get('mode')} ({n.get('reason')}): not relabelled; its claims are advised below"
            )
        elif n.get("mode") == DRA_STATIC:
            lines.append(
                f"dra: {n.get('node')} is {n.get('mode')}: its pods get devices through ResourceClaims, so where a "
                "note says to update a workload's resource request, change its claim template's selector "
                'to the new profile (device.attributes["gpu.nvidia.com"].profile == "<profile>")'
            )
    for a in doc.get("claim_templates", ()):
        if not isinstance(a, Mapping):
            continue
        current, rec = a.get("current_profile") or "whole GPU", a.get("recommended_profile") or "whole GPU"
        verb = f"request {rec}" if a.get("recommended_profile") != a.get("current_profile") else f"keep {rec}"
        where = f"deviceClassName: {a.get('device_class') or MIG_CLASS}"
        selector = f"; selector: {a['selector']}" if a.get("selector") else ""
        lines.append(
            f"dra: {a.get('workload')} ({a.get('model')}) on {current}: {verb} — {a.get('reason')}; "
            f"{where}{selector}"
        )
    return lines
