"""A fleet scenario: YAML → validated, frozen dataclasses (see README.md, "The fleet simulator").

Every error is one line naming the file, the line, the path inside it and the problem, e.g.
``fleet.yaml:4: nodes[2].gpus[0].mig: 3g.40gb×2 + 1g.10gb×1 has no valid placement on H100 80GB``.
Unknown keys are rejected. Times of faults are offsets from the scenario's ``epoch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from exporter.errors import ScenarioError
from gpupilot_common import checked
from mig_geometry import catalogue, placement
from mig_geometry.catalogue import GpuModel
from simulator import identity, migconfigs
from simulator.model import (
    DEFAULT_DRIVER,
    DEFAULT_EPOCH,
    DeviceRef,
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
    Ctx,
    parse_faults,
    parse_hpas,
    parse_pattern,
    parse_pending,
)


def load(path: str | Path) -> Scenario:
    """Read and validate a scenario file; :class:`ScenarioError` (one line) on any problem."""
    doc = checked.load_yaml(Path(path), error=ScenarioError, what="scenario")
    return _build(Ctx(doc), doc.data)


def loads(text: str, *, name: str = "<scenario>") -> Scenario:
    doc = checked.parse_yaml(text, source=name, error=ScenarioError)
    return _build(Ctx(doc), doc.data)


_TOP = {"seed", "epoch", "nodes", "workloads", "hpas", "faults", "pending", "description"}
_NODE = {"name", "labels", "gpus", "driver_version"}
_GPU = {"model", "count", "mig", "driver_version"}
_WORKLOAD = {
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
}


def _build(ctx: Ctx, doc: object) -> Scenario:
    top = ctx.mapping(doc, "", _TOP)
    seed = ctx.integer(top.get("seed", 0), "seed")
    epoch = ctx.time(top["epoch"], "epoch") if "epoch" in top else DEFAULT_EPOCH
    nodes_raw = ctx.sequence(top.get("nodes"), "nodes", required=True)
    nodes: list[Node] = []
    for i, raw in enumerate(nodes_raw):
        node = _node(ctx, raw, f"nodes[{i}]", seed)
        if any(n.name == node.name for n in nodes):
            ctx.fail(f"nodes[{i}].name", f"duplicate node name {node.name!r}")
        nodes.append(node)
    by_name = {n.name: n for n in nodes}
    held: dict[str, str] = {}
    workloads = tuple(
        _workload(ctx, raw, f"workloads[{i}]", seed=seed, nodes=by_name, held=held)
        for i, raw in enumerate(ctx.sequence(top.get("workloads"), "workloads"))
    )
    pod_keys = [(p.namespace, p.name) for w in workloads for p in w.pods]
    if len(set(pod_keys)) != len(pod_keys):
        dup = next(k for k in pod_keys if pod_keys.count(k) > 1)
        ctx.fail("workloads", f"pod {dup[0]}/{dup[1]} is defined twice")
    deployments = {(w.namespace, w.name) for w in workloads if w.kind == "Deployment"}
    hpas = parse_hpas(ctx, top.get("hpas"), deployments=deployments)
    faults = parse_faults(ctx, top.get("faults"), nodes=by_name)
    pending = parse_pending(ctx, top.get("pending"), running=set(pod_keys))
    return Scenario(ctx.file, seed, epoch, tuple(nodes), workloads, hpas, faults, pending)


def _node(ctx: Ctx, raw: object, path: str, seed: int) -> Node:
    m = ctx.mapping(raw, path, _NODE)
    name = ctx.string(m.get("name"), f"{path}.name", required=True)
    labels = ctx.string_map(m.get("labels"), f"{path}.labels")
    driver = ctx.string(m.get("driver_version", DEFAULT_DRIVER), f"{path}.driver_version")
    gpus: list[Gpu] = []
    for j, graw in enumerate(ctx.sequence(m.get("gpus"), f"{path}.gpus", required=True)):
        gpath = f"{path}.gpus[{j}]"
        g = ctx.mapping(graw, gpath, _GPU)
        model_text = g.get("model")
        if isinstance(model_text, int) and not isinstance(model_text, bool):
            model_text = f"0x{model_text:04x}"
        model_name = ctx.string(model_text, f"{gpath}.model", required=True)
        model = catalogue.find_model(model_name)
        if model is None:
            known = ", ".join(catalogue.known_model_keys())
            ctx.fail(f"{gpath}.model", f"unknown GPU model {model_name!r} (known: {known}, or a PCI id)")
        count = ctx.integer(g.get("count", 1), f"{gpath}.count", minimum=1, maximum=MAX_GPUS_PER_ENTRY)
        gdriver = ctx.string(g.get("driver_version", driver), f"{gpath}.driver_version")
        mig_name, counts = _mig(ctx, g.get("mig"), f"{gpath}.mig", model)
        for _ in range(count):
            index = len(gpus)
            gpus.append(
                _gpu(seed, name, index=index, model=model, mig_name=mig_name, counts=counts, driver=gdriver)
            )
    return Node(name, MappingProxyType(_node_labels(ctx, path, labels, gpus)), tuple(gpus))


def _mig(ctx: Ctx, raw: object, path: str, model: GpuModel) -> tuple[str | None, dict[str, int] | None]:
    if raw is None or raw is False:
        return None, None
    if isinstance(raw, str):
        try:
            counts = migconfigs.resolve_builtin(model, raw)
        except KeyError as e:
            ctx.fail(path, str(e.args[0]))
        return raw, counts
    if not isinstance(raw, dict):
        ctx.fail(path, "expected a built-in config name (all-1g.10gb, all-balanced, …) or profile: count")
    counts = {}
    for key, value in raw.items():
        if not isinstance(value, int) or isinstance(value, bool):
            ctx.fail(f"{path}.{key}", f"count must be an integer, got {value!r}")
        if not 0 <= value <= 7:  # no GPU holds more than 7 MIG instances
            ctx.fail(f"{path}.{key}", f"count must be between 0 and 7, got {value}")
        counts[str(key)] = value
    result = placement.place(model, counts)
    if not result.ok:
        ctx.fail(path, result.reason)
    return None, counts


def _gpu(
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


def _node_labels(ctx: Ctx, path: str, given: dict[str, str], gpus: list[Gpu]) -> dict[str, str]:
    labels = dict(given)
    strategy = labels.setdefault("nvidia.com/mig.strategy", "mixed")
    if strategy not in ("single", "mixed", "none"):
        ctx.fail(f"{path}.labels.nvidia.com/mig.strategy", f"{strategy!r} is not one of single, mixed, none")
    first = gpus[0]
    product = "NVIDIA-" + first.model.product_name.removeprefix("NVIDIA ").replace(" ", "-")
    if strategy == "single":
        profiles = {name for g in gpus for name, c in (g.mig_counts or {}).items() if c}
        if any(not g.mig_enabled for g in gpus) or len(profiles) != 1:
            ctx.fail(
                f"{path}.labels.nvidia.com/mig.strategy",
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
    ctx: Ctx, raw: object, path: str, *, seed: int, nodes: Mapping[str, Node], held: dict[str, str]
) -> Workload:
    m = ctx.mapping(raw, path, _WORKLOAD)
    namespace = ctx.string(m.get("namespace", "default"), f"{path}.namespace")
    if ("pod" in m) == ("deployment" in m):
        ctx.fail(path, "give exactly one of 'pod' or 'deployment'")
    kind: Literal["Pod", "Deployment"] = "Pod" if "pod" in m else "Deployment"
    name = ctx.string(m.get("pod") or m.get("deployment"), f"{path}.{kind.lower()}", required=True)
    replicas = ctx.integer(m.get("replicas", 1), f"{path}.replicas", minimum=1, maximum=MAX_REPLICAS)
    if kind == "Pod" and "replicas" in m:
        ctx.fail(f"{path}.replicas", "only a deployment has replicas")
    container = ctx.string(m.get("container", name), f"{path}.container")
    labels = ctx.string_map(m.get("labels"), f"{path}.labels")
    util = parse_pattern(ctx, m.get("utilization", "idle"), f"{path}.utilization", maximum=100.0)
    memory = parse_pattern(ctx, m.get("memory_mib", 0), f"{path}.memory_mib")
    apps_raw = ctx.mapping(m.get("app_metrics") or {}, f"{path}.app_metrics", None)
    apps = {str(k): parse_pattern(ctx, v, f"{path}.app_metrics.{k}") for k, v in apps_raw.items()}
    refs = [
        _device(ctx, r, f"{path}.devices[{i}]", nodes=nodes, held=held, owner=f"{namespace}/{name}")
        for i, r in enumerate(ctx.sequence(m.get("devices"), f"{path}.devices", required=True))
    ]
    if kind == "Deployment" and len(refs) != replicas:
        ctx.fail(
            f"{path}.devices", f"{len(refs)} devices for {replicas} replicas: give one device per replica"
        )
    if kind == "Pod":
        if len({r.node for r in refs}) != 1:
            ctx.fail(f"{path}.devices", "a pod's devices must all be on one node")
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
        )
        for pod_name, devs in groups
    )
    return Workload(namespace, name, kind, replicas if kind == "Deployment" else 1, pods)


_DEVICE = {"node", "gpu", "profile", "slot"}


def _device(
    ctx: Ctx, raw: object, path: str, *, nodes: Mapping[str, Node], held: dict[str, str], owner: str
) -> DeviceRef:
    if isinstance(raw, str):
        parts = raw.split("/")
        if len(parts) not in (2, 3):
            ctx.fail(path, f"{raw!r}: write NODE/GPU or NODE/GPU/PROFILE[#SLOT]")
        spec: dict[str, object] = {"node": parts[0], "gpu": parts[1]}
        if len(parts) == 3:
            prof, _, slot_text = parts[2].partition("#")
            spec["profile"] = prof
            if slot_text:
                spec["slot"] = slot_text
        raw = spec
    m = ctx.mapping(raw, path, _DEVICE)
    node_name = ctx.string(m.get("node"), f"{path}.node", required=True)
    node = nodes.get(node_name)
    if node is None:
        ctx.fail(f"{path}.node", f"no node {node_name!r} in the scenario")
    index = ctx.integer(m.get("gpu"), f"{path}.gpu", minimum=0)
    if index >= len(node.gpus):
        ctx.fail(f"{path}.gpu", f"{node_name} has {len(node.gpus)} GPUs (0–{len(node.gpus) - 1})")
    gpu = node.gpus[index]
    profile = m.get("profile")
    if profile is None:
        if gpu.mig_enabled:
            ctx.fail(
                path,
                f"{node_name} GPU {index} is in MIG mode: name a profile (e.g. {node_name}/{index}/1g.10gb)",
            )
        ref = DeviceRef(node_name, index, None, gpu.uuid)
    else:
        pname = ctx.string(profile, f"{path}.profile")
        candidates = [inst for inst in gpu.instances if inst.profile.name == pname]
        if not candidates:
            have = placement.describe(gpu.mig_counts or {}) if gpu.mig_enabled else "MIG disabled"
            ctx.fail(f"{path}.profile", f"{node_name} GPU {index} has no {pname} instance ({have})")
        if "slot" in m:
            slot = ctx.integer(m["slot"], f"{path}.slot", minimum=0)
            if slot >= len(candidates):
                ctx.fail(f"{path}.slot", f"{node_name} GPU {index} has {len(candidates)} × {pname}")
            chosen = candidates[slot]
        else:
            free = [inst for inst in candidates if inst.uuid not in held]
            if not free:
                ctx.fail(path, f"every {pname} instance of {node_name} GPU {index} is already held")
            chosen = free[0]
        ref = DeviceRef(node_name, index, chosen.gi_id, chosen.uuid, pname)
    if ref.uuid in held:
        ctx.fail(path, f"device already held by {held[ref.uuid]}")
    held[ref.uuid] = owner
    return ref
