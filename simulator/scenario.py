"""A fleet scenario: YAML → validated, frozen dataclasses (see README.md, "The fleet simulator").

Every error is one line naming the file, the line, the path inside it and the problem, e.g.
``fleet.yaml:4: nodes[2].gpus[0].mig: 3g.40gb×2 + 1g.10gb×1 has no valid placement on H100 80GB``.
Unknown keys are rejected. Times of faults are offsets from the scenario's ``epoch``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Literal, cast

from exporter.errors import ScenarioError
from gpupilot_common import checked
from gpupilot_common.section import Section
from gpupilot_common.timefmt import format_time
from mig_geometry import catalogue, placement
from mig_geometry.catalogue import GpuModel
from simulator import identity, migconfigs
from simulator.model import (
    DEFAULT_CLAIM_EVERY_S,
    DEFAULT_DRIVER,
    DEFAULT_EPOCH,
    DeviceRef,
    DraMode,
    Gpu,
    Instance,
    Node,
    Pod,
    Scenario,
    Workload,
)
from simulator.patterns import IDLE
from simulator.scenario_parse import (
    MAX_GPUS_PER_ENTRY,
    MAX_REPLICAS,
    overlap,
    parse_faults,
    parse_hpas,
    parse_lifetime,
    parse_pattern,
    parse_pending,
)
from simulator.service_parse import parse_services

MAX_SCENARIO_BYTES = 256 * 2**20
"""Largest scenario read: a fleet written out takes about 300 bytes a pod (100,000 pods: ~30 MB)."""


def load(path: str | Path) -> Scenario:
    """Read and validate a scenario file; :class:`ScenarioError` (one line) on any problem."""
    doc = checked.load_yaml(Path(path), error=ScenarioError, what="scenario", max_bytes=MAX_SCENARIO_BYTES)
    return _build(doc)


def loads(text: str, *, name: str = "<scenario>") -> Scenario:
    doc = checked.parse_yaml(text, source=name, error=ScenarioError)
    return _build(doc)


_TOP = ("seed", "epoch", "nodes", "workloads", "hpas", "faults", "pending", "services", "description")
_NODE = ("name", "labels", "gpus", "driver_version", "dra")
_GPU = ("model", "count", "mig", "driver_version", "time_slicing")
_WORKLOAD = (
    "namespace",
    "pod",
    "deployment",
    "replicas",
    "container",
    "labels",
    "devices",
    "utilization",
    "memory_mib",
    "app_metrics",
    "start",
    "end",
)


def _build(doc: checked.Document) -> Scenario:
    # an empty file is an empty scenario (its first problem: no nodes); numbers are taken as text
    # where text is wanted (driver_version: 535) and digits as numbers (count: "2")
    top = Section(doc, {}, (), coerce=True) if doc.data is None else doc.root("the scenario", coerce=True)
    top.keys(_TOP)
    seed = top.integer("seed", 0, minimum=None)
    epoch = top.time("epoch", DEFAULT_EPOCH, now=0.0)
    nodes: list[Node] = []
    for n in top.sections("nodes", required=True):
        node = _node(n, seed)
        if any(other.name == node.name for other in nodes):
            raise n.fail("name", f"duplicate node name {node.name!r}")
        nodes.append(node)
    by_name = {n.name: n for n in nodes}
    held: dict[str, list[_Holder]] = {}
    workloads = tuple(
        _workload(w, seed=seed, epoch=epoch, nodes=by_name, held=held) for w in top.sections("workloads")
    )
    running: dict[tuple[str, str], tuple[float, float]] = {}
    for w in workloads:
        for p in w.pods:
            if (p.namespace, p.name) in running:
                raise top.fail("workloads", f"pod {p.namespace}/{p.name} is defined twice")
            running[(p.namespace, p.name)] = (p.start, p.end)
    deployments = {(w.namespace, w.name) for w in workloads if w.kind == "Deployment"}
    hpas = parse_hpas(top, deployments=deployments)
    faults = parse_faults(top, nodes=by_name, mig=_mig)
    pending = parse_pending(top, running=running, epoch=epoch)
    services = parse_services(top, taken=deployments)
    return Scenario(doc.source, seed, epoch, tuple(nodes), workloads, hpas, faults, pending, services)


def _node(n: Section, seed: int) -> Node:
    n.keys(_NODE)
    name = n.text("name")
    labels = n.text_map("labels")
    driver = n.text("driver_version", DEFAULT_DRIVER)
    gpus: list[Gpu] = []
    for g in n.sections("gpus", required=True):
        g.keys(_GPU)
        pci_id = g.raw("model")
        if isinstance(pci_id, int) and not isinstance(pci_id, bool):
            model_name = f"0x{pci_id:04x}"
        else:
            model_name = g.text("model")
        model = catalogue.find_model(model_name)
        if model is None:
            known = ", ".join(catalogue.known_model_keys())
            raise g.fail("model", f"unknown GPU model {model_name!r} (known: {known}, or a PCI id)")
        count = g.integer("count", 1, minimum=1, maximum=MAX_GPUS_PER_ENTRY)
        gdriver = g.text("driver_version", driver)
        mig_name, counts = _mig(g, "mig", model)
        sliced = g.integer("time_slicing", 0, minimum=0, maximum=MAX_TIME_SLICES)
        if sliced and counts is not None:
            raise g.fail("time_slicing", "time-slicing shares a whole GPU: remove 'mig' or 'time_slicing'")
        if sliced == 1:
            raise g.fail("time_slicing", "1 replica is no sharing: give 2 or more, or leave it out")
        for _ in range(count):
            index = len(gpus)
            gpu = build_gpu(
                seed, name, index=index, model=model, mig_name=mig_name, counts=counts, driver=gdriver
            )
            gpus.append(replace(gpu, time_slicing=sliced) if sliced else gpu)
    mode, claim_every, names = _dra(n)
    node_labels = MappingProxyType(_node_labels(n, labels, gpus))
    return Node(name, node_labels, tuple(gpus), dra=mode, claim_every=claim_every, dra_names=names)


_DRA = ("mode", "claim_every", "driver")
_DRA_MODES = ("static", "dynamic")
_DRA_NAMES = ("v25.12", "v25.8")
"""DRA driver releases by how they name MIG devices (``driver:``; v25.12 is also v0.4.0's)."""


def _dra(n: Section) -> tuple[DraMode, float, str]:
    """``dra: static``, ``dra: dynamic`` or ``dra: {mode: dynamic, claim_every: 6h, driver: v25.8}``."""
    raw = n.raw("dra")
    if raw is None:
        return "", DEFAULT_CLAIM_EVERY_S, _DRA_NAMES[0]
    if not isinstance(raw, dict):
        if raw not in _DRA_MODES:
            raise n.fail("dra", f"{raw!r} is not one of static, dynamic")
        return cast(DraMode, raw), DEFAULT_CLAIM_EVERY_S, _DRA_NAMES[0]
    d = n.at(raw, "dra")
    d.keys(_DRA)
    names = d.raw("driver") if "driver" in d else _DRA_NAMES[0]
    if names not in _DRA_NAMES:
        raise d.fail(
            "driver", f"{names!r} is not one of {', '.join(_DRA_NAMES)} (how the driver names MIG devices)"
        )
    mode = d.raw("mode")
    if mode not in _DRA_MODES:
        raise d.fail("mode", f"{mode!r} is not one of static, dynamic")
    every = d.duration("claim_every", DEFAULT_CLAIM_EVERY_S, allow_zero=True)
    if every <= 0:
        raise d.fail("claim_every", "must be positive")
    if mode == "static" and "claim_every" in d:
        raise d.fail("claim_every", "only dynamic MIG renews claims")
    return cast(DraMode, mode), every, str(names)


def _mig(sec: Section, key: str, model: GpuModel) -> tuple[str | None, dict[str, int] | None]:
    """``sec``'s field ``key``: a built-in config name, profile counts, or nothing (MIG off)."""
    raw = sec.raw(key)
    if raw is None or raw is False:
        return None, None
    if isinstance(raw, str):
        try:
            return raw, migconfigs.resolve_builtin(model, raw)
        except KeyError as e:
            raise sec.fail(key, str(e.args[0])) from None
    if not isinstance(raw, dict):
        raise sec.fail(
            key, "expected a built-in config name (all-1g.10gb, all-balanced, …) or profile: count"
        )
    counts: dict[str, int] = {}
    for profile, value in raw.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise sec.doc.fail((*sec.path, key, str(profile)), f"count must be an integer, got {value!r}")
        if not 0 <= value <= 7:  # no GPU holds more than 7 MIG instances
            raise sec.doc.fail((*sec.path, key, str(profile)), f"count must be between 0 and 7, got {value}")
        counts[str(profile)] = value
    result = placement.place(model, counts)
    if not result.ok:
        raise sec.fail(key, result.reason)
    return None, counts


def build_gpu(
    seed: int,
    node: str,
    *,
    index: int,
    model: GpuModel,
    mig_name: str | None,
    counts: dict[str, int] | None,
    driver: str,
) -> Gpu:
    instances: list[Instance] = []
    if counts:
        placed = placement.place(model, counts).placed or ()
        for pl in placed:
            gi = identity.gpu_instance_id(pl.profile.compute_slices, pl.profile.memory_slices, pl.start)
            instances.append(Instance(pl.profile, pl.start, gi, identity.mig_uuid(seed, node, index, gi)))
    return Gpu(
        index=index,
        model=model,
        mig_config=mig_name,
        mig_counts=MappingProxyType(dict(counts)) if counts is not None else None,
        instances=tuple(instances),
        uuid=identity.gpu_uuid(seed, node, index),
        pci_bus_id=identity.pci_bus_id(index),
        driver_version=driver,
    )


MAX_TIME_SLICES = 64
"""NVIDIA's device plugin allows more; 64 pods on one GPU is past any sensible share."""


def _node_labels(n: Section, given: dict[str, str], gpus: list[Gpu]) -> dict[str, str]:
    labels = dict(given)
    strategy = labels.setdefault("nvidia.com/mig.strategy", "mixed")
    at_strategy = (*n.path, "labels", "nvidia.com/mig.strategy")
    if strategy not in ("single", "mixed", "none"):
        raise n.doc.fail(at_strategy, f"{strategy!r} is not one of single, mixed, none")
    first = gpus[0]
    product = "NVIDIA-" + first.model.product_name.removeprefix("NVIDIA ").replace(" ", "-")
    if strategy == "single":
        profiles = {name for g in gpus for name, c in (g.mig_counts or {}).items() if c}
        if any(not g.mig_enabled for g in gpus) or len(profiles) != 1:
            raise n.doc.fail(
                at_strategy,
                "single needs every GPU of the node in MIG mode with one and the same profile",
            )
        product += f"-MIG-{profiles.pop()}"
    names = {g.mig_config for g in gpus}
    if not any(g.mig_enabled for g in gpus):
        default_config = "all-disabled"
    elif len(names) == 1 and None not in names:
        default_config = str(first.mig_config)
    else:
        default_config = "custom"
    labels.setdefault("nvidia.com/mig.config", default_config)
    labels.setdefault("nvidia.com/mig.config.state", "success")
    labels.setdefault("nvidia.com/gpu.product", product)
    labels.setdefault("nvidia.com/gpu.count", str(len(gpus)))
    labels.setdefault("nvidia.com/gpu.memory", str(first.model.memory_mib))
    labels.setdefault("nvidia.com/mig.capable", str(first.model.mig_capable).lower())
    return labels


def _workload(
    w: Section, *, seed: int, epoch: float, nodes: Mapping[str, Node], held: dict[str, list[_Holder]]
) -> Workload:
    w.keys(_WORKLOAD)
    namespace = w.text("namespace", "default")
    if ("pod" in w) == ("deployment" in w):
        raise w.fail_here("give exactly one of 'pod' or 'deployment'")
    kind: Literal["Pod", "Deployment"] = "Pod" if "pod" in w else "Deployment"
    name = w.text(kind.lower())
    replicas = w.integer("replicas", 1, minimum=1, maximum=MAX_REPLICAS)
    if kind == "Pod" and "replicas" in w:
        raise w.fail("replicas", "only a deployment has replicas")
    container = w.text("container", name)
    labels = w.text_map("labels")
    util = parse_pattern(w, "utilization", default="idle", maximum=100.0)
    memory = parse_pattern(w, "memory_mib", default=0)
    named = w.named("app_metrics")
    apps = {} if named is None else {k: parse_pattern(named, k, default=None) for k in named.data}
    life = parse_lifetime(w, epoch=epoch)
    refs = [
        _device(w, i, raw, nodes=nodes, held=held, owner=_Holder(f"{namespace}/{name}", life))
        for i, raw in enumerate(w.sequence("devices", required=True))
    ]
    if kind == "Deployment" and len(refs) != replicas:
        raise w.fail("devices", f"{len(refs)} devices for {replicas} replicas: give one device per replica")
    if kind == "Pod":
        if len({r.node for r in refs}) != 1:
            raise w.fail("devices", "a pod's devices must all be on one node")
        groups = [(name, tuple(refs))]
    else:
        groups = [(identity.replica_pod_name(seed, namespace, name, i), (r,)) for i, r in enumerate(refs)]
    rs = identity.replicaset_name(seed, namespace, name) if kind == "Deployment" else ""
    pods = tuple(
        Pod(
            namespace=namespace,
            name=pod_name,
            container=container,
            labels=MappingProxyType(dict(labels)),
            node=devs[0].node,
            devices=devs,
            utilization=util if util is not None else IDLE,
            memory_mib=memory if memory is not None else IDLE,
            app_metrics=MappingProxyType({k: v for k, v in apps.items() if v is not None}),
            owner_kind="ReplicaSet" if rs else "",
            owner_name=rs,
            deployment=name if rs else "",
            start=life[0],
            end=life[1],
        )
        for pod_name, devs in groups
    )
    return Workload(namespace, name, kind, replicas if kind == "Deployment" else 1, pods)


_DEVICE = ("node", "gpu", "profile", "slot")


@dataclass(frozen=True)
class _Holder:
    """A workload holding a device, and when."""

    name: str
    life: tuple[float, float]


def _device(
    w: Section,
    i: int,
    raw: object,
    *,
    nodes: Mapping[str, Node],
    held: dict[str, list[_Holder]],
    owner: _Holder,
) -> DeviceRef:
    """``devices[i]`` of workload ``w``: ``NODE/GPU[/PROFILE[#SLOT]]`` or the same as fields."""
    if isinstance(raw, str):
        parts = raw.split("/")
        if len(parts) not in (2, 3):
            raise w.doc.fail((*w.path, "devices", i), f"{raw!r}: write NODE/GPU or NODE/GPU/PROFILE[#SLOT]")
        spec: dict[str, object] = {"node": parts[0], "gpu": parts[1]}
        if len(parts) == 3:
            prof, _, slot_text = parts[2].partition("#")
            spec["profile"] = prof
            if slot_text:
                spec["slot"] = slot_text
        raw = spec
    d = w.at(raw, "devices", i, what="NODE/GPU[/PROFILE[#SLOT]] or a mapping of node, gpu, profile, slot")
    d.keys(_DEVICE)
    node_name = d.text("node")
    node = nodes.get(node_name)
    if node is None:
        raise d.fail("node", f"no node {node_name!r} in the scenario")
    index = d.integer("gpu", minimum=0)
    if index >= len(node.gpus):
        raise d.fail("gpu", f"{node_name} has {len(node.gpus)} GPUs (0–{len(node.gpus) - 1})")
    gpu = node.gpus[index]
    if d.raw("profile") is None:
        if gpu.mig_enabled:
            raise d.fail_here(
                f"{node_name} GPU {index} is in MIG mode: name a profile (e.g. {node_name}/{index}/1g.10gb)"
            )
        ref = DeviceRef(node_name, index, None, gpu.uuid)
    else:
        pname = d.text("profile")
        candidates = [inst for inst in gpu.instances if inst.profile.name == pname]
        if not candidates:
            have = placement.describe(gpu.mig_counts or {}) if gpu.mig_enabled else "MIG disabled"
            raise d.fail("profile", f"{node_name} GPU {index} has no {pname} instance ({have})")
        if "slot" in d:
            slot = d.integer("slot", minimum=0)
            if slot >= len(candidates):
                raise d.fail("slot", f"{node_name} GPU {index} has {len(candidates)} × {pname}")
            chosen = candidates[slot]
        else:
            free = [
                inst
                for inst in candidates
                if not any(overlap(h.life, owner.life) for h in held.get(inst.uuid, ()))
            ]
            if not free:
                raise d.fail_here(f"every {pname} instance of {node_name} GPU {index} is already held")
            chosen = free[0]
        ref = DeviceRef(node_name, index, chosen.gi_id, chosen.uuid, pname)
    _hold(d, held, ref=ref, gpu=gpu, owner=owner)
    return ref


def _hold(d: Section, held: dict[str, list[_Holder]], *, ref: DeviceRef, gpu: Gpu, owner: _Holder) -> None:
    """Record ``owner`` as a holder of ``ref``: one holder at a time, or up to N on a GPU time-sliced
    N ways; holders whose lifetimes do not overlap take the device in turn."""
    holders = held.setdefault(ref.uuid, [])
    limit = gpu.time_slicing if ref.gi_id is None and gpu.time_slicing else 1
    at_once = [h for h in holders if overlap(h.life, owner.life)]
    if len(at_once) >= limit:
        if limit == 1:
            raise d.fail_here(f"device already held by {at_once[0].name}{_when(at_once[0].life)}")
        raise d.fail_here(
            f"{ref.node} GPU {ref.gpu} is time-sliced {limit} ways, all held ({', '.join(h.name for h in at_once)})"
        )
    holders.append(owner)


def _when(life: tuple[float, float]) -> str:
    """`` (from … to …)`` for a holder with a lifetime, nothing for one there always."""
    if life == (-math.inf, math.inf):
        return ""
    start = format_time(life[0]) if math.isfinite(life[0]) else "the start"
    end = format_time(life[1]) if math.isfinite(life[1]) else "the end"
    return f" from {start} to {end}"
