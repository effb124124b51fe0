"""A simulated kubelet plugin of NVIDIA's DRA driver (``gpu.nvidia.com``) with static MIG.

The driver enumerates a node's devices once, when its kubelet-plugin pod starts (label
``nvidia-dra-driver-gpu-component=kubelet-plugin``), and publishes them as the node's ResourceSlice
(names of driver v25.12+, :mod:`tests.support.dra_slices`); a later MIG layout change leaves the
slice as it was until that pod is replaced (reference: dra-keda.md). Tests run the pod with a
DaemonSet (:mod:`.daemonsets`) whose controller re-creates it after ``apply`` deletes it.
"""

from __future__ import annotations

import zlib
from typing import Any

from devkit.cluster import deviceplugin
from devkit.cluster.draslices import MigDevice, resource_slice
from devkit.cluster.migconfig import gpu_model_of
from mig_geometry.placement import place
from tests.support.kubedouble.migmanager import MigManager
from tests.support.kubedouble.store import Store

SLICES = "resource.k8s.io/resourceslices"
PLUGIN_LABEL = ("nvidia-dra-driver-gpu-component", "kubelet-plugin")


class DraDriver:
    def __init__(self, store: Store, mig_manager: MigManager) -> None:
        self.store, self.mig_manager = store, mig_manager
        self.started: dict[str, str] = {}
        """node → uid of the plugin pod whose enumeration the node's slice shows."""

    def hook(self, skey: str) -> None:
        if skey != "/pods":
            return
        for pod in self.store.view("/pods"):
            meta = pod["metadata"]
            node = (pod.get("spec") or {}).get("nodeName")
            if (meta.get("labels") or {}).get(PLUGIN_LABEL[0]) != PLUGIN_LABEL[1] or not node:
                continue
            if meta.get("deletionTimestamp") or self.started.get(node) == meta.get("uid"):
                continue
            self.started[node] = str(meta.get("uid"))
            self.publish(node)
            self.store.record("dra-driver", "resourceslices", "", node, plugin=meta["name"])

    def publish(self, node: str) -> None:
        """The node's slice from the MIG layout applied now (MIG UUIDs made up per instance)."""
        obj = self.store.get("/nodes", "", node)
        labels: dict[str, str] = ((obj or {}).get("metadata") or {}).get("labels") or {}
        count = int(labels.get("nvidia.com/gpu.count", "1") or 1)
        model = gpu_model_of(labels)
        _, configs, _ = self.mig_manager._configs()
        entries = (configs or {}).get(self.mig_manager.applied.get(node, ""), [])
        layout = deviceplugin.per_gpu(entries, model=model, count=count)
        gpus = {
            i: f"GPU-{zlib.crc32(f'{node}/{i}'.encode()):08x}-0000-4000-8000-000000000000"
            for i in range(count)
        }
        migs = []
        for i, devices in sorted(layout.items()):
            if not devices or model is None:
                continue
            placed = place(model, devices).placed or ()
            for k, p in enumerate(placed):
                migs.append(
                    MigDevice(
                        i,
                        p.profile.name,
                        p.profile.gi_profile_id,
                        p.start,
                        p.size,
                        uuid=f"MIG-{node}-{i}-{k}",
                    )
                )
        rslice: dict[str, Any] = resource_slice(node, gpus=gpus, migs=migs)
        self.store.put(
            SLICES,
            rslice,
            event="MODIFIED" if self.store.get(SLICES, "", rslice["metadata"]["name"]) else "ADDED",
        )
