"""Build :class:`rightsizer.analysis.types.Analysis` objects by hand for optimiser tests and the benchmark."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mig_geometry.catalogue import find_model
from mig_geometry.placement import place
from rightsizer.analysis.history import build_workloads
from rightsizer.analysis.types import Analysis, DeviceStats, GpuInventory, InstanceInfo, NodeInventory, PodKey

WINDOW_H = 168.0


@dataclass(frozen=True)
class Dev:
    """A MIG instance (``profile``) or, with ``profile=""``, a whole GPU; held by ``pod`` if set."""

    profile: str
    pod: str = ""
    p95: float | None = 0.0
    fb_mib: float = 0.0
    owner: str = ""


@dataclass(frozen=True)
class Node:
    name: str
    model: str
    gpus: Sequence[Sequence[Dev]]
    strategy: str = "mixed"
    labels: dict[str, str] = field(default_factory=dict)


def build(nodes: Sequence[Node], *, headroom: float = 0.2) -> Analysis:
    inv, devices, owners = [], [], {}
    for node in nodes:
        model = find_model(node.model)
        assert model is not None, node.model
        gpus = []
        for idx, devs in enumerate(node.gpus):
            whole = len(devs) == 1 and devs[0].profile == ""
            instances = []
            if not whole:
                counts: dict[str, int] = {}
                for d in devs:
                    counts[d.profile] = counts.get(d.profile, 0) + 1
                placed = place(model, counts)
                assert placed.placed is not None, placed.reason
                starts: dict[str, list[int]] = {}
                for pl in placed.placed:
                    starts.setdefault(pl.profile.name, []).append(pl.start)
                for gi, d in enumerate(devs, 1):
                    start = starts[d.profile].pop(0)
                    instances.append(
                        InstanceInfo(
                            d.profile,
                            str(gi),
                            start,
                            model.profile(d.profile).memory_slices,
                            f"MIG-{node.name}-{idx}-{gi}",
                        )
                    )  # type: ignore[union-attr]
            gpus.append(
                GpuInventory(
                    node.name,
                    idx,
                    f"GPU-{node.name}-{idx}",
                    model.key,
                    model.device_id,
                    not whole,
                    model.memory_mib,
                    tuple(instances),
                )
            )
            for gi, d in enumerate(devs, 1):
                pods = (PodKey("ns", d.pod),) if d.pod else ()
                if d.pod and d.owner:
                    owners[PodKey("ns", d.pod)] = f"ns/Deployment/{d.owner}"
                cover = 0.0 if d.p95 is None else WINDOW_H
                devices.append(
                    DeviceStats(
                        node=node.name,
                        gpu=idx,
                        gpu_uuid=f"GPU-{node.name}-{idx}",
                        profile="" if whole else d.profile,
                        gpu_instance_id="" if whole else str(gi),
                        pods=pods,
                        allocated_hours=WINDOW_H if pods else 0.0,
                        p50=d.p95,
                        p95=d.p95,
                        max=d.p95,
                        fb_peak_mib=d.fb_mib if d.p95 is not None else None,
                        idle_hours=WINDOW_H if (d.p95 or 0) < 0.05 and d.p95 is not None else 0.0,
                        coverage_hours=cover,
                        window_hours=WINDOW_H,
                        peak=d.p95,
                        peak_at=0.0 if d.p95 is not None else None,
                    )
                )
        inv.append(NodeInventory(node.name, tuple(gpus), node.strategy, node.labels.get("config", "")))
    workloads = build_workloads(inv, devices, owners, headroom=headroom)
    return Analysis(
        0.0, WINDOW_H * 3600, "http://prometheus.test", tuple(inv), tuple(devices), tuple(workloads)
    )
