"""``SimBackend``: one node of a scenario behind the exporter's :class:`~exporter.collect.backend.Backend` protocol.

``snapshot_at(t)`` is pure (same ``t``, same snapshot, in any process); ``read()`` is
``snapshot_at(clock())`` plus the scheduled faults that concern the call itself: an ``init_error``
makes ``open()`` fail, a ``hung`` fault makes ``read()`` block, as NVML does when a driver call hangs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import MappingProxyType

import numpy as np

from exporter.attribute.podresources import dra
from exporter.errors import BackendError, BackendUnavailable
from exporter.snapshot import Allocations, NodeSnapshot, PodRef
from simulator import identity
from simulator import scenario as scenario_mod
from simulator.model import Scenario
from simulator.values import NodeModel


class SimBackend:
    name = "sim"

    def __init__(
        self,
        scenario: Scenario,
        *,
        node: str,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.scenario = scenario
        self.node = scenario.node(node)
        self.model = NodeModel(scenario, self.node)
        self._clock = clock
        self._sleep = sleep
        self._open = False

    @classmethod
    def from_file(cls, path: str | Path, *, node: str, clock: Callable[[], float] = time.time) -> SimBackend:
        """Load a scenario file; :class:`~exporter.errors.ScenarioError` (one line) when it is bad."""
        return cls(scenario_mod.load(path), node=node, clock=clock)

    @property
    def hostname(self) -> str:
        return self.node.name

    def open(self) -> None:
        state = self.model.state(self._clock())
        if state.init_failing:
            raise BackendUnavailable(
                f"sim: NVML initialisation fails on {self.node.name} (scheduled init_error)"
            )
        self._open = True

    def read(self) -> NodeSnapshot:
        if not self._open:
            raise BackendError("sim: read() before open()")
        t = self._clock()
        state = self.model.state(t)
        if state.hung_for > 0:
            self._sleep(state.hung_for)
            t = self._clock()
        return self.snapshot_at(t)

    def close(self) -> None:
        self._open = False

    def snapshot_at(self, t: float) -> NodeSnapshot:
        """What the node's GPUs show at Unix time ``t``; pure and never blocking."""
        model = self.model.at(t)
        values = model.continuous(np.array([float(t)]))
        state = model.state(t)
        return model.build(float(t), state, lambda key: float(values[key][0]), values.keys())

    def allocations(self, t: float | None = None) -> Allocations | dra.Attribution:
        """What kubelet's pod-resources ``List`` would say at ``t`` (default: now): device UUID (GPU
        or MIG) → containers holding it on a device-plugin node; on a DRA node the claims, by the
        device names of the node's driver release (resolved against the snapshot, as the exporter does)."""
        t = self._clock() if t is None else t
        model = self.model.at(t)
        if self.node.dra:
            return dra.Attribution(MappingProxyType({}), self._claims(model, t))
        out: dict[str, tuple[PodRef, ...]] = {}
        for d in model.devices:
            shared = d.gi_id < 0 and d.gpu.time_slicing > 1
            for replica, pod in enumerate(d.holders(t)):
                resource = f"nvidia.com/mig-{d.profile_name}" if d.gi_id >= 0 else "nvidia.com/gpu"
                if d.gi_id >= 0 and self.node.mig_strategy == "single":
                    resource = "nvidia.com/gpu"
                # a time-sliced GPU's replicas, as the kubelet reports them (GPU-…::N)
                ref = PodRef(
                    pod.namespace, pod.name, pod.container, resource, replica=str(replica) if shared else ""
                )
                if ref not in out.get(d.uuid, ()):
                    out[d.uuid] = (*out.get(d.uuid, ()), ref)
        return MappingProxyType(out)

    def _claims(self, model: NodeModel, t: float) -> tuple[dra.ClaimDevice, ...]:
        seq = model.claim_sequence(t) if self.node.dra == "dynamic" else 0
        out = []
        for d in model.devices:
            if d.gi_id < 0:
                device = f"gpu-{d.gpu.index}"
            elif self.node.dra_names == "v25.8":
                device = f"gpu-{d.gpu.index}-mig-{d.gi_profile_id}-{d.start}-{d.memory_slices}"
            else:
                device = (
                    f"gpu-{d.gpu.index}-mig-{dra.profile_token(d.profile_name)}-{d.gi_profile_id}-{d.start}"
                )
            for pod in d.holders(t):
                suffix = identity.claim_suffix(self.scenario.seed, pod.namespace, pod.name, seq)
                out.append(
                    dra.ClaimDevice(
                        namespace=pod.namespace,
                        pod=pod.name,
                        container=pod.container,
                        claim_name=f"{pod.name}-gpu-{suffix}",
                        claim_namespace=pod.namespace,
                        driver=dra.NVIDIA_DRIVER,
                        pool=self.node.name,
                        device=device,
                    )
                )
        return tuple(out)

    def process_owners(self, pids: Iterable[int]) -> dict[int, PodRef]:
        """PID → container for the scenario's GPU processes (what /proc tells on a real node)."""
        wanted = set(pids)
        out = {}
        for pod in self.scenario.pods_on(self.node.name):
            pid = identity.process_id(self.scenario.seed, pod.namespace, pod.name)
            if pid in wanted:
                out[pid] = PodRef(
                    pod.namespace,
                    pod.name,
                    pod.container,
                    resource="",
                    pod_uid=identity.pod_uid(self.scenario.seed, pod.namespace, pod.name),
                )
        return out
