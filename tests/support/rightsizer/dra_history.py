"""A small history with the three kinds of GPU node, for the rightsizer's DRA handling (OpenMetrics).

node-dp   H100, device plugin + MIG Manager (all-1g.10gb): svc/web-0 on one 1g.10gb, the rest idle.
node-sta  H100, DRA with static MIG: the same seven 1g.10gb instances all along; ml/batch-0 claims one.
node-dyn  H100, DRA with DynamicMIG: every 6 h a new claim of ml/infer's pod gets a 3g.40gb instance
          with a new MIG UUID (peak 7000 MiB, ~10 % busy: a 1g.10gb would do), and ml/train-0 keeps a
          7g.80gb claim at ~90 % with 60 GB (it needs the whole GPU).
node-dm   H100, DRA with DynamicMIG whose claims the exporter could not attribute (no dra_* series):
          seven idle-looking 1g.10gb instances, and the exporter's gpupilot_dra_node_info says
          mig_mode="dynamic" (it read the node's ResourceSlices): never to be relabelled.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

STEP = 900.0
DAYS = 2
H100 = "NVIDIA H100 80GB HBM3"


def _fmt(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def write_history(path: Path, *, end: float) -> float:
    start = end - DAYS * 86400
    series: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))

    def add(name: str, labels: dict[str, str], t: float, v: float) -> None:
        series[name][_fmt(labels)].append((t, v))

    def base(node: str, gpu: int) -> dict[str, str]:
        return {
            "gpu": str(gpu),
            "UUID": f"GPU-{node}-{gpu}",
            "pci_bus_id": f"00000000:{gpu + 10:02X}:00.0",
            "device": f"nvidia{gpu}",
            "modelName": H100,
            "Hostname": node,
        }

    def gpu_info(b: dict[str, str], t: float) -> None:
        info = {**b, "pci_device_id": "0x2330", "mig_mode": "enabled", "gpm": "supported"}
        add("gpupilot_gpu_info", info | {"memory_total_mib": "81559"}, t, 1)

    def instance(
        b: dict[str, str], t: float, prof: str, gi: int, start_: int, size: int, uuid: str
    ) -> dict[str, str]:
        il = {**b, "GPU_I_PROFILE": prof, "GPU_I_ID": str(gi)}
        meta = {"compute_instance_id": "0", "placement_start": str(start_), "placement_size": str(size)}
        add("gpupilot_mig_instance_info", il | meta | {"mig_uuid": uuid}, t, 1)
        return il

    def used(
        il: dict[str, str],
        t: float,
        pod: tuple[str, str] | None,
        act: float,
        fb: float,
        dra: dict[str, str] | None = None,
    ) -> None:
        dl = dict(il)
        if pod is not None:
            dl |= {"pod": pod[1], "namespace": pod[0], "container": "main", **(dra or {})}
            add("gpupilot_device_pod_info", dl, t, 1)
        add("DCGM_FI_PROF_GR_ENGINE_ACTIVE", dl, t, act)
        add("DCGM_FI_DEV_FB_USED", dl, t, fb)

    n = int((end - start) / STEP)
    for i in range(n + 1):
        t = start + i * STEP
        wave = math.sin(2 * math.pi * ((t % 86400) / 3600) / 24)
        for node in ("node-dp", "node-sta"):
            b = base(node, 0)
            gpu_info(b, t)
            for k in range(7):
                il = instance(b, t, "1g.10gb", 7 + k, k, 1, f"MIG-{node}-{k}")
                if k == 0 and node == "node-dp":
                    used(il, t, ("svc", "web-0"), 0.5 + 0.1 * wave, 6000)
                elif k == 0:
                    claim = {
                        "dra_claim_name": "batch-0-gpu",
                        "dra_claim_namespace": "ml",
                        "dra_pool_name": node,
                        "dra_device_name": "gpu-0-mig-19-0-1",
                        "dra_mig_profile": "1g.10gb",
                        "dra_mig_device_uuid": f"MIG-{node}-{k}",
                    }
                    used(il, t, ("ml", "batch-0"), 0.4 + 0.1 * wave, 5000, claim)
                else:
                    used(il, t, None, 0.0, 0)
        bdm = base("node-dm", 0)
        gpu_info(bdm, t)
        for k in range(7):
            used(instance(bdm, t, "1g.10gb", 7 + k, k, 1, f"MIG-node-dm-{k}"), t, None, 0.0, 0)
        add(
            "gpupilot_dra_node_info",
            {"Hostname": "node-dm", "dra_driver_name": "gpu.nvidia.com", "mig_mode": "dynamic"},
            t,
            1,
        )
        add(
            "gpupilot_dra_node_info",
            {"Hostname": "node-sta", "dra_driver_name": "gpu.nvidia.com", "mig_mode": "static"},
            t,
            1,
        )
        # node-dyn GPU0: a 3g.40gb created per claim, a new UUID every 6 h; GPU1: train-0's 7g
        b0, b1 = base("node-dyn", 0), base("node-dyn", 1)
        gpu_info(b0, t)
        gpu_info(b1, t)
        epoch = int((t - start) // (6 * 3600))
        pod = f"infer-5d8f7c9b6-{epoch:05d}"
        uuid = f"MIG-dyn-{epoch}"
        il = instance(b0, t, "3g.40gb", 2, 0, 4, uuid)
        claim = {
            "dra_claim_name": f"{pod}-gpu-x7k2p",
            "dra_claim_namespace": "ml",
            "dra_pool_name": "node-dyn",
            "dra_device_name": "gpu-0-mig-3g40gb-9-0",
            "dra_mig_profile": "3g.40gb",
            "dra_mig_device_uuid": uuid,
        }
        used(il, t, ("ml", pod), 0.08 + 0.02 * wave, 6000 + 1000 * max(0.0, wave), claim)
        il = instance(b1, t, "7g.80gb", 0, 0, 8, "MIG-dyn-train")
        claim = {
            "dra_claim_name": "train-0-gpu",
            "dra_claim_namespace": "ml",
            "dra_pool_name": "node-dyn",
            "dra_device_name": "gpu-1-mig-7g80gb-0-0",
            "dra_mig_profile": "7g.80gb",
            "dra_mig_device_uuid": "MIG-dyn-train",
        }
        used(il, t, ("ml", "train-0"), 0.9, 60000, claim)
        add("kube_node_labels", {"node": "node-dp", "label_nvidia_com_mig_config": "all-1g.10gb"}, t, 1)
    with path.open("w") as f:
        for name, by_labels in series.items():
            f.write(f"# TYPE {name} gauge\n")
            for labels, points in by_labels.items():
                for t, v in points:
                    f.write(f"{name}{labels} {v:g} {t:.0f}\n")
        f.write("# EOF\n")
    return start
