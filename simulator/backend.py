"""``SimBackend``: one node of a scenario behind the exporter's :class:`~exporter.backend.Backend` protocol.

``snapshot_at(t)`` is pure (same ``t``, same snapshot, in any process); ``read()`` is
``snapshot_at(clock())`` plus the scheduled faults that concern the call itself: an ``init_error``
makes ``open()`` fail, a ``hung`` fault makes ``read()`` block, as NVML does when a driver call hangs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType

import numpy as np

from exporter.errors import BackendError, BackendUnavailable
from exporter.snapshot import Allocations, NodeSnapshot, PodRef
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
        values = self.model.continuous(np.array([float(t)]))
        state = self.model.state(t)
        return self.model.build(float(t), state, lambda key: float(values[key][0]), values.keys())

    def allocations(self, t: float | None = None) -> Allocations:
        """Device UUID (GPU or MIG) → containers holding it, like kubelet's pod-resources ``List``."""
        del t  # pods do not move in a scenario; the parameter keeps the door open for schedules
        out: dict[str, tuple[PodRef, ...]] = {}
        for pod in self.scenario.pods_on(self.node.name):
            for dev in pod.devices:
                resource = f"nvidia.com/mig-{dev.profile}" if dev.profile else "nvidia.com/gpu"
                if dev.profile and self.node.mig_strategy == "single":
                    resource = "nvidia.com/gpu"
                ref = PodRef(pod.namespace, pod.name, pod.container, resource)
                out[dev.uuid] = (*out.get(dev.uuid, ()), ref)
        return MappingProxyType(out)
