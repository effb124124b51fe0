"""A small hand-built GPU history (OpenMetrics) whose right answers are known, for analysis/plan tests.

node-a  H100 80GB, mixed, GPU0 all-balanced: 3g (infer-a, ~8 % busy), 2g (train, ~85 %), 1g free,
        1g (infer-a, ~3 %, with a 12 h gap); GPU1 was 7g.80gb (busy) for the first day, then
        7×1g.10gb with one allocated to batch-1 that has no activity data (unknown).
node-b  H100 80GB, strategy single, 2 GPUs of 7×1g.10gb; svc-b's 3 pods use 1g at ~10 %.
node-c  L4 (no MIG), one whole GPU held by web/l4-svc at ~10 % utilisation.
node-d  A100 40GB (no GPM: no profiling metrics), 7×1g.5gb; ml/amp-0 runs a compute process from
        06:00 to 18:00 UTC only, the other instances none.
node-e  the same A100, but its exporter cannot see other containers' processes (no hostPID):
        gpupilot_exporter_process_visibility is 0 and (an old exporter) publishes 0 processes for
        ml/amp-blind: its idleness is unknown, never idle.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

STEP = 900.0
DAYS = 3
GAP_HOURS = 12

Labels = tuple[tuple[str, str], ...]


def _base(node: str, gpu: int, model: str) -> dict[str, str]:
    return {
        "gpu": str(gpu),
        "UUID": f"GPU-{node}-{gpu}",
        "pci_bus_id": f"00000000:{gpu + 10:02X}:00.0",
        "device": f"nvidia{gpu}",
        "modelName": model,
        "Hostname": node,
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }


def _fmt(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def write_history(path: Path, *, end: float) -> float:
    """Write the OpenMetrics file; returns the start (end - DAYS days)."""
    start = end - DAYS * 86400
    series: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    types = {
        "gpupilot_gpu_info": "gauge",
        "gpupilot_mig_instance_info": "gauge",
        "gpupilot_device_pod_info": "gauge",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge",
        "DCGM_FI_DEV_FB_USED": "gauge",
        "DCGM_FI_DEV_GPU_UTIL": "gauge",
        "kube_node_labels": "gauge",
        "kube_pod_owner": "gauge",
        "gpupilot_device_compute_processes": "gauge",
        "gpupilot_exporter_process_visibility": "gauge",
    }

    def add(name: str, labels: dict[str, str], t: float, v: float) -> None:
        series[name][_fmt(labels)].append((t, v))

    h100 = "NVIDIA H100 80GB HBM3"
    reconfig = start + 86400
    n = int((end - start) / STEP)
    for i in range(n + 1):
        t = start + i * STEP
        hour = (t % 86400) / 3600
        wave = math.sin(2 * math.pi * hour / 24)
        # node-a GPU0: all-balanced
        b0 = _base("node-a", 0, h100)
        add(
            "gpupilot_gpu_info",
            {
                **b0,
                "pci_device_id": "0x2330",
                "mig_mode": "enabled",
                "gpm": "supported",
                "memory_total_mib": "81559",
            },
            t,
            1,
        )
        insts = [
            ("3g.40gb", "1", 4, 4, ("ml", "infer-a-5d8f7c9b6-abcde"), 0.06 + 0.04 * wave, 6000),
            ("2g.20gb", "5", 2, 2, ("ml", "train-0"), 0.82 + 0.06 * wave, 17000),
            ("1g.10gb", "13", 0, 1, None, 0.0, 0),
            ("1g.10gb", "14", 1, 1, ("ml", "infer-a-5d8f7c9b6-fghij"), 0.03 + 0.01 * wave, 4000),
        ]
        for prof, gi, st, size, pod, act, fb in insts:
            il = {**b0, "GPU_I_PROFILE": prof, "GPU_I_ID": gi}
            add(
                "gpupilot_mig_instance_info",
                {
                    **il,
                    "compute_instance_id": "0",
                    "placement_start": str(st),
                    "placement_size": str(size),
                    "mig_uuid": f"MIG-a0-{gi}",
                },
                t,
                1,
            )
            if gi == "14" and end - 2 * 86400 <= t < end - 2 * 86400 + GAP_HOURS * 3600:
                continue  # a 12-hour gap in this device's series (exporter down)
            dl = dict(il)
            if pod:
                dl |= {"pod": pod[1], "namespace": pod[0], "container": "main"}
                add("gpupilot_device_pod_info", dl, t, 1)
            add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dl, t, max(0.0, act))
            add("DCGM_FI_DEV_FB_USED", dl, t, fb)
        # node-a GPU1: 7g for a day, then 7×1g.10gb
        b1 = _base("node-a", 1, h100)
        add(
            "gpupilot_gpu_info",
            {
                **b1,
                "pci_device_id": "0x2330",
                "mig_mode": "enabled",
                "gpm": "supported",
                "memory_total_mib": "81559",
            },
            t,
            1,
        )
        if t < reconfig:
            il = {**b1, "GPU_I_PROFILE": "7g.80gb", "GPU_I_ID": "0"}
            add(
                "gpupilot_mig_instance_info",
                {
                    **il,
                    "compute_instance_id": "0",
                    "placement_start": "0",
                    "placement_size": "8",
                    "mig_uuid": "MIG-a1-0",
                },
                t,
                1,
            )
            dl = il | {"pod": "old-job", "namespace": "ml", "container": "main"}
            add("gpupilot_device_pod_info", dl, t, 1)
            add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dl, t, 0.95)
        else:
            for k in range(7):
                gi = str(7 + k)
                il = {**b1, "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": gi}
                add(
                    "gpupilot_mig_instance_info",
                    {
                        **il,
                        "compute_instance_id": "0",
                        "placement_start": str(k),
                        "placement_size": "1",
                        "mig_uuid": f"MIG-a1-{gi}",
                    },
                    t,
                    1,
                )
                if k == 0:
                    # Allocated, but its activity never reached Prometheus: unknown, not idle.
                    add(
                        "gpupilot_device_pod_info",
                        il | {"pod": "batch-1", "namespace": "ml", "container": "main"},
                        t,
                        1,
                    )
                else:
                    add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", il, t, 0.0)
        # node-b: single strategy, 2 × 7×1g.10gb, svc-b's three pods
        for g in range(2):
            bb = _base("node-b", g, h100)
            add(
                "gpupilot_gpu_info",
                {
                    **bb,
                    "pci_device_id": "0x2330",
                    "mig_mode": "enabled",
                    "gpm": "supported",
                    "memory_total_mib": "81559",
                },
                t,
                1,
            )
            for k in range(7):
                gi = str(7 + k)
                il = {**bb, "GPU_I_PROFILE": "1g.10gb", "GPU_I_ID": gi}
                add(
                    "gpupilot_mig_instance_info",
                    {
                        **il,
                        "compute_instance_id": "0",
                        "placement_start": str(k),
                        "placement_size": "1",
                        "mig_uuid": f"MIG-b{g}-{gi}",
                    },
                    t,
                    1,
                )
                held = (g == 0 and k < 2) or (g == 1 and k == 0)
                dl = dict(il)
                if held:
                    dl |= {"pod": f"svc-b-6c9d8-{g}{k}", "namespace": "ml", "container": "main"}
                    add("gpupilot_device_pod_info", dl, t, 1)
                add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dl, t, 0.1 if held else 0.0)
                add("DCGM_FI_DEV_FB_USED", dl, t, 3000 if held else 0)
        # node-c: L4, whole GPU
        bc = _base("node-c", 0, "NVIDIA L4")
        add(
            "gpupilot_gpu_info",
            {
                **bc,
                "pci_device_id": "0x27b8",
                "mig_mode": "disabled",
                "gpm": "unsupported",
                "memory_total_mib": "23034",
            },
            t,
            1,
        )
        dl = bc | {"pod": "l4-svc-0", "namespace": "web", "container": "main"}
        add("gpupilot_device_pod_info", dl, t, 1)
        add("DCGM_FI_DEV_GPU_UTIL", dl, t, 10 + 3 * wave)
        add("DCGM_FI_DEV_FB_USED", dl, t, 5000)
        # node-d: A100 40GB without GPM — only compute processes tell busy from idle
        bd = _base("node-d", 0, "NVIDIA A100-SXM4-40GB")
        add(
            "gpupilot_gpu_info",
            {
                **bd,
                "pci_device_id": "0x20b0",
                "mig_mode": "enabled",
                "gpm": "unsupported",
                "memory_total_mib": "40960",
            },
            t,
            1,
        )
        for k in range(7):
            gi = str(7 + k)
            il = {**bd, "GPU_I_PROFILE": "1g.5gb", "GPU_I_ID": gi}
            add(
                "gpupilot_mig_instance_info",
                {
                    **il,
                    "compute_instance_id": "0",
                    "placement_start": str(k),
                    "placement_size": "1",
                    "mig_uuid": f"MIG-d0-{gi}",
                },
                t,
                1,
            )
            dl = dict(il)
            busy = 0
            if k == 0:
                dl |= {"pod": "amp-0", "namespace": "ml", "container": "main"}
                add("gpupilot_device_pod_info", dl, t, 1)
                busy = 1 if 6 <= hour < 18 else 0
            add("gpupilot_device_compute_processes", dl, t, busy)
        add(
            "gpupilot_exporter_process_visibility",
            {"Hostname": "node-d", "reason": "host PID namespace"},
            t,
            1,
        )
        # node-e: blind to processes
        be = _base("node-e", 0, "NVIDIA A100-SXM4-40GB")
        add(
            "gpupilot_gpu_info",
            {
                **be,
                "pci_device_id": "0x20b0",
                "mig_mode": "enabled",
                "gpm": "unsupported",
                "memory_total_mib": "40960",
            },
            t,
            1,
        )
        for k in range(7):
            gi = str(7 + k)
            il = {**be, "GPU_I_PROFILE": "1g.5gb", "GPU_I_ID": gi}
            add(
                "gpupilot_mig_instance_info",
                {
                    **il,
                    "compute_instance_id": "0",
                    "placement_start": str(k),
                    "placement_size": "1",
                    "mig_uuid": f"MIG-e0-{gi}",
                },
                t,
                1,
            )
            dl = dict(il)
            if k == 0:
                dl |= {"pod": "amp-blind", "namespace": "ml", "container": "main"}
                add("gpupilot_device_pod_info", dl, t, 1)
            add("gpupilot_device_compute_processes", dl, t, 0)
        add(
            "gpupilot_exporter_process_visibility",
            {"Hostname": "node-e", "reason": "own PID namespace"},
            t,
            0,
        )
        # kube-state-metrics
        add("kube_node_labels", {"node": "node-a", "label_nvidia_com_mig_config": "all-balanced"}, t, 1)
        add(
            "kube_node_labels",
            {
                "node": "node-b",
                "label_nvidia_com_mig_strategy": "single",
                "label_nvidia_com_mig_config": "all-1g.10gb",
            },
            t,
            1,
        )
        for pod in ("infer-a-5d8f7c9b6-abcde", "infer-a-5d8f7c9b6-fghij"):
            add(
                "kube_pod_owner",
                {
                    "namespace": "ml",
                    "pod": pod,
                    "owner_kind": "ReplicaSet",
                    "owner_name": "infer-a-5d8f7c9b6",
                },
                t,
                1,
            )
        add(
            "kube_pod_owner",
            {"namespace": "ml", "pod": "train-0", "owner_kind": "StatefulSet", "owner_name": "train"},
            t,
            1,
        )
        for pod in ("svc-b-6c9d8-00", "svc-b-6c9d8-01", "svc-b-6c9d8-10"):
            add(
                "kube_pod_owner",
                {"namespace": "ml", "pod": pod, "owner_kind": "ReplicaSet", "owner_name": "svc-b-6c9d8"},
                t,
                1,
            )
    with path.open("w") as f:
        for name, by_labels in series.items():
            f.write(f"# TYPE {name} {types[name]}\n")
            for labels, points in by_labels.items():
                for t, v in points:
                    f.write(f"{name}{labels} {v:g} {t:.0f}\n")
        f.write("# EOF\n")
    return start


def shared_blocks(tmp_path_factory: Any, target: Path) -> tuple[float, float]:
    """This history as Prometheus blocks in ``target`` (a private hard-linked copy of blocks built
    once per test run); returns (start, end). ``end`` is the last whole hour but one of the build."""
    import time  # noqa: PLC0415

    from devkit.prometheus import backfill_openmetrics  # noqa: PLC0415
    from tests.support.shared import built_once, linked_copy  # noqa: PLC0415

    def build(where: Path) -> dict[str, Any]:
        now = time.time()
        end = now - now % 3600 - 3600
        start = write_history(where / "history.om", end=end)
        backfill_openmetrics(where / "history.om", where / "data", block_duration="96h")
        return {"start": start, "end": end}

    where, facts = built_once(tmp_path_factory, "small-history", build)
    linked_copy(where / "data", target)
    return float(facts["start"]), float(facts["end"])
