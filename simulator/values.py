"""One node's numbers: vectorised device values, fault state and the snapshot built from both.

``NodeModel.continuous(ts)`` evaluates every field of every device over an array of times;
``NodeModel.state(t)`` says which faults show at ``t``; ``NodeModel.build(t, state, value_of)``
assembles a :class:`NodeSnapshot`. The live backend passes a one-element array; the backfill passes
a whole chunk and the same arithmetic runs, so both publish identical floats.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from types import MappingProxyType

import numpy as np

from exporter.snapshot import GpuInfo, GpuSnapshot, LostGpu, MigInstance, NodeSnapshot, ProcessUsage, XidEvent
from simulator import faults as faultlib
from simulator import identity, patterns
from simulator import scenario as scenario_mod
from simulator.model import Fault, Gpu, Node, Pod, Scenario
from simulator.patterns import Array, rounded

Key = tuple[int, int, str]
"""(GPU index, GPU-instance id or -1 for the GPU itself, DCGM field name)."""

GPM_MODELS = frozenset({"H100 80GB", "H100 NVL", "H100 96GB", "H200", "GH200 144GB", "B200"})
"""Hopper and newer: GPM gives per-instance activity. Ampere/Ada get processes + memory only."""

_POWER_W = {"A100 40GB": (55.0, 400.0), "A100 80GB": (60.0, 400.0), "A30": (30.0, 165.0)}
_HOPPER_POWER_W = (70.0, 700.0)
_CLOCKS_MHZ = {"A100 40GB": (210, 1410, 1215), "A100 80GB": (210, 1410, 1593), "H200": (345, 1980, 3201)}
_HOPPER_CLOCKS = (345, 1980, 2619)
_PROF_RATIOS = {
    "DCGM_FI_PROF_SM_ACTIVE": 0.92,
    "DCGM_FI_PROF_SM_OCCUPANCY": 0.45,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.55,
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.04,
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.3,
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.18,
}
_NVLINK_LINKS = {"A100 40GB": 12, "A100 80GB": 12, "A30": 4}
"""NVLink links per GPU (18 on Hopper SXM); the L0 counter is one link's share of the total."""
_CLOCK_IDLE, _CLOCK_POWER_CAP, _CLOCK_SW_THERMAL = 0x1, 0x4, 0x20
_VIOLATION_CAUSES = ("THERMAL", "SYNC_BOOST", "BOARD_LIMIT", "RELIABILITY")


@dataclass(frozen=True)
class _Device:
    gpu: Gpu
    gi_id: int
    """-1 for a whole GPU."""
    memory_mib: int
    reserved_mib: int
    compute_share: float
    """Fraction of the GPU's compute slices (1.0 for a whole GPU)."""
    pods: tuple[Pod, ...]
    """The pods holding it: one, several on a time-sliced GPU, or several in turn (pod lifetimes)."""
    entity: str
    uuid: str = ""
    start: int = 0
    profile_name: str = ""
    gi_profile_id: int = -1
    memory_slices: int = 0

    @cached_property
    def shared(self) -> bool:
        """Several pods at once (a time-sliced GPU): each runs its own process with its own share.
        Pods that hold the device in turn share nothing."""
        if self.gi_id < 0 and self.gpu.time_slicing > 0:
            return True
        return any(
            a.start < b.end and b.start < a.end for i, a in enumerate(self.pods) for b in self.pods[i + 1 :]
        )

    def holders(self, t: float) -> tuple[Pod, ...]:
        """The pods holding it at ``t``."""
        return tuple(p for p in self.pods if p.alive(t))


@dataclass(frozen=True)
class FaultState:
    lost: frozenset[int]
    errored: frozenset[tuple[int, str]]
    xid_counts: Mapping[int, Mapping[int, int]]
    last_xid: Mapping[int, XidEvent]
    hung_for: float
    init_failing: bool


def _tdp(gpu: Gpu) -> tuple[float, float]:
    return _POWER_W.get(gpu.model.key, _HOPPER_POWER_W)


PROC_PREFIX = "proc:"
"""Keys of one pod's share of a time-sliced GPU (``proc:<k>:util``/``mem``): not device fields."""


class NodeModel:
    """One node's devices over time. ``at(t)`` is the model of the layout in force at ``t``: a
    ``mig_reconfigure`` fault gives its GPU new MIG instances (new UUIDs) from then on."""

    def __init__(self, scenario: Scenario, node: Node, *, layout_changes: int = 0) -> None:
        self.scenario = scenario
        self.node = node
        self.seed = scenario.seed
        self.faults = scenario.faults_on(node.name)
        self.reconfigs = sorted(
            (scenario.epoch + f.at, i, f) for i, f in enumerate(self.faults) if f.kind == "mig_reconfigure"
        )
        self._variants: dict[int, NodeModel] = {layout_changes: self}
        holders: dict[str, list[Pod]] = {}
        for p in scenario.pods_on(node.name):
            for d in p.devices:
                holders.setdefault(d.uuid, []).append(p)
        self.devices: list[_Device] = []
        for gpu in node.gpus:
            if not gpu.mig_enabled:
                reserved = round(gpu.model.memory_mib * 0.0065)
                self.devices.append(
                    _Device(
                        gpu,
                        -1,
                        gpu.model.memory_mib,
                        reserved,
                        1.0,
                        tuple(holders.get(gpu.uuid, ())),
                        f"{node.name}/{gpu.index}",
                        uuid=gpu.uuid,
                    )
                )
            for inst in gpu.instances:
                share = inst.profile.compute_slices / gpu.model.compute_slices
                entity = f"{node.name}/{gpu.index}/{inst.gi_id}"
                self.devices.append(
                    _Device(
                        gpu,
                        inst.gi_id,
                        inst.profile.memory_mib,
                        0,
                        share,
                        tuple(holders.get(inst.uuid, ())),
                        entity,
                        uuid=inst.uuid,
                        start=inst.start,
                        profile_name=inst.profile.name,
                        gi_profile_id=inst.profile.gi_profile_id,
                        memory_slices=inst.profile.memory_slices,
                    )
                )

    # -- layouts over time ---------------------------------------------------------------------
    def at(self, t: float) -> NodeModel:
        """The model of the layout in force at ``t`` (after every ``mig_reconfigure`` up to ``t``)."""
        done = sum(1 for start, _, _ in self.reconfigs if start <= t)
        found = self._variants.get(done)
        if found is None:
            node = self.node
            for k, (_, _, fault) in enumerate(self.reconfigs[:done], start=1):
                node = reconfigured(self.scenario, node, fault, k)
            found = NodeModel(self.scenario, node, layout_changes=done)
            found._variants = self._variants
            self._variants[done] = found
        return found

    def layout_edges(self, t0: float, t1: float) -> list[float]:
        """Times in ``(t0, t1]`` where a GPU's MIG layout changes."""
        return [start for start, _, _ in self.reconfigs if t0 < start <= t1]

    # -- continuous values ---------------------------------------------------------------------
    def continuous(self, ts: Array) -> dict[Key, Array]:
        out: dict[Key, Array] = {}
        seed, epoch = self.seed, self.scenario.epoch
        activity: dict[int, Array] = {g.index: np.zeros_like(ts) for g in self.node.gpus}
        active_integral: dict[int, Array] = {g.index: np.zeros_like(ts) for g in self.node.gpus}
        for d in self.devices:
            idx, gi = d.gpu.index, d.gi_id
            util = np.zeros_like(ts)
            mem = np.zeros_like(ts)
            shared = d.shared
            for k, pod in enumerate(d.pods):
                # One pod (or pods in turn): the entity names of the device (stable values); several
                # at once: one per pod.
                ent = f"{d.entity}:{pod.namespace}/{pod.name}" if shared else d.entity
                p_util = patterns.evaluate(pod.utilization, seed=seed, entity=f"{ent}:util", t=ts, decimals=2)
                p_mem = patterns.evaluate(pod.memory_mib, seed=seed, entity=f"{ent}:mem", t=ts, decimals=0)
                integ = patterns.integral(
                    pod.utilization, seed=seed, entity=f"{ent}:util", t0=epoch, t=np.maximum(ts, epoch)
                )
                if pod.lives:
                    # Only while it holds the device: nothing before its start, its work kept after.
                    alive = pod.alive_mask(ts)
                    p_util, p_mem = p_util * alive, p_mem * alive
                    integ = _integral_over_life(pod, seed=seed, entity=f"{ent}:util", epoch=epoch, ts=ts)
                active_integral[idx] = active_integral[idx] + d.compute_share * integ / 100.0
                util = util + p_util
                mem = mem + p_mem
                if shared:
                    # Each pod's own process: its share of the SMs (the device's total is capped
                    # at 100 %, so are the shares, proportionally) and its memory.
                    out[(idx, gi, f"{PROC_PREFIX}{k}:util")] = p_util
                    out[(idx, gi, f"{PROC_PREFIX}{k}:mem")] = p_mem
            if shared:
                over = np.maximum(util / 100.0, 1.0)
                for k in range(len(d.pods)):
                    out[(idx, gi, f"{PROC_PREFIX}{k}:util")] = rounded(
                        out[(idx, gi, f"{PROC_PREFIX}{k}:util")] / over, 2
                    )
                util = np.minimum(util, 100.0)
            act = util / 100.0
            activity[idx] = activity[idx] + d.compute_share * act
            used = np.minimum(mem, d.memory_mib - d.reserved_mib)
            out[(idx, gi, "DCGM_FI_DEV_FB_USED")] = used
            out[(idx, gi, "DCGM_FI_DEV_FB_FREE")] = d.memory_mib - d.reserved_mib - used
            out[(idx, gi, "DCGM_FI_DEV_FB_RESERVED")] = np.full_like(ts, float(d.reserved_mib))
            dram = rounded(np.minimum(1.0, act * 0.6 + 0.1 * used / d.memory_mib), 4)
            if d.gpu.model.key in GPM_MODELS:
                out[(idx, gi, "DCGM_FI_PROF_GR_ENGINE_ACTIVE")] = rounded(act, 4)
                for name, ratio in _PROF_RATIOS.items():
                    out[(idx, gi, name)] = rounded(act * ratio, 4)
                out[(idx, gi, "DCGM_FI_PROF_DRAM_ACTIVE")] = dram
            if gi < 0:
                out[(idx, gi, "DCGM_FI_DEV_GPU_UTIL")] = rounded(util)
                out[(idx, gi, "DCGM_FI_DEV_MEM_COPY_UTIL")] = rounded(dram * 100.0)
                out[(idx, gi, "DCGM_FI_DEV_ENC_UTIL")] = np.zeros_like(ts)
                out[(idx, gi, "DCGM_FI_DEV_DEC_UTIL")] = np.zeros_like(ts)
        for gpu in self.node.gpus:
            self._gpu_level(out, gpu, ts, activity[gpu.index], active_integral[gpu.index])
        return out

    def _gpu_level(self, out: dict[Key, Array], gpu: Gpu, ts: Array, act: Array, act_integral: Array) -> None:
        seed, epoch, idx = self.seed, self.scenario.epoch, gpu.index
        ent = f"{self.node.name}/{gpu.index}"
        idle_w, tdp = _tdp(gpu)
        since = np.maximum(ts - epoch, 0.0)
        power = idle_w + (tdp - idle_w) * act + 0.015 * tdp * patterns.noise(seed, f"{ent}:power", ts)
        out[(idx, -1, "DCGM_FI_DEV_POWER_USAGE")] = rounded(np.maximum(power, idle_w * 0.8), 3)
        energy_j = idle_w * since + (tdp - idle_w) * act_integral
        out[(idx, -1, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")] = rounded(energy_j * 1000.0)
        temp = rounded(31.0 + 42.0 * act + 1.5 * patterns.noise(seed, f"{ent}:temp", ts))
        out[(idx, -1, "DCGM_FI_DEV_GPU_TEMP")] = temp
        out[(idx, -1, "DCGM_FI_DEV_MEMORY_TEMP")] = temp + 4.0
        low, boost, mem_clock = _CLOCKS_MHZ.get(gpu.model.key, _HOPPER_CLOCKS)
        out[(idx, -1, "DCGM_FI_DEV_SM_CLOCK")] = rounded(low + (boost - low) * np.minimum(1.0, act * 3.0))
        out[(idx, -1, "DCGM_FI_DEV_MEM_CLOCK")] = np.full_like(ts, float(mem_clock))
        pcie = 2.0e8 * act + 1.0e6 * (1.5 + patterns.noise(seed, f"{ent}:pcie", ts))
        out[(idx, -1, "DCGM_FI_PROF_PCIE_TX_BYTES")] = rounded(pcie)
        out[(idx, -1, "DCGM_FI_PROF_PCIE_RX_BYTES")] = rounded(pcie * 1.7)
        # DCGM publishes NVLink bandwidth as a rate (KiB/s ÷ 1000), not as NVML's cumulative KiB
        nvlink_total = rounded(1.0e5 * act + 50.0 * (1.0 + patterns.noise(seed, f"{ent}:nvlink", ts)))
        out[(idx, -1, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")] = nvlink_total
        out[(idx, -1, "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0")] = np.floor(
            nvlink_total / _NVLINK_LINKS.get(gpu.model.key, 18)
        )
        u = patterns.uniform(seed, f"{ent}:rates", np.arange(6, dtype=np.int64))
        out[(idx, -1, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER")] = np.floor(since / (3600.0 * (24 + 48 * u[0])))
        out[(idx, -1, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")] = np.floor(since / (86400.0 * (2 + 3 * u[1])))
        out[(idx, -1, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")] = np.zeros_like(ts)
        out[(idx, -1, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS")] = np.full_like(ts, math.floor(3 * u[2]))
        out[(idx, -1, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")] = np.zeros_like(ts)
        out[(idx, -1, "DCGM_FI_DEV_ROW_REMAP_FAILURE")] = np.zeros_like(ts)
        self._opt_in(out, gpu, ts, since=since, act_integral=act_integral, u=u)

    def _opt_in(
        self, out: dict[Key, Array], gpu: Gpu, ts: Array, *, since: Array, act_integral: Array, u: Array
    ) -> None:
        """dcgm-exporter's opt-in fields: violations (us), ECC/retired-page totals, NVLink errors,
        clock event reasons. No vGPU in the simulator, so no DCGM_FI_DEV_VGPU_LICENSE_STATUS."""
        idx = gpu.index
        idle_w, tdp = _tdp(gpu)
        power = out[(idx, -1, "DCGM_FI_DEV_POWER_USAGE")]
        temp = out[(idx, -1, "DCGM_FI_DEV_GPU_TEMP")]
        # 4 % of busy time capped by power, idle time counted as low-utilisation throttling.
        out[(idx, -1, "DCGM_FI_DEV_POWER_VIOLATION")] = np.floor(0.04 * act_integral * 1e6)
        out[(idx, -1, "DCGM_FI_DEV_LOW_UTIL_VIOLATION")] = np.floor(
            np.maximum(since - act_integral, 0.0) * 0.8 * 1e6
        )
        for cause in _VIOLATION_CAUSES:
            out[(idx, -1, f"DCGM_FI_DEV_{cause}_VIOLATION")] = np.zeros_like(ts)
        sbe_vol = out[(idx, -1, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")]
        out[(idx, -1, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL")] = sbe_vol + math.floor(40 * u[3])
        out[(idx, -1, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL")] = np.zeros_like(ts)
        out[(idx, -1, "DCGM_FI_DEV_RETIRED_SBE")] = np.full_like(ts, math.floor(3 * u[4]))
        out[(idx, -1, "DCGM_FI_DEV_RETIRED_DBE")] = np.zeros_like(ts)
        out[(idx, -1, "DCGM_FI_DEV_RETIRED_PENDING")] = np.zeros_like(ts)
        out[(idx, -1, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL")] = np.floor(
            since / (86400.0 * (5 + 10 * u[5]))
        )
        out[(idx, -1, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL")] = np.zeros_like(ts)
        out[(idx, -1, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL")] = np.floor(
            since / (86400.0 * (2 + 4 * u[5]))
        )
        out[(idx, -1, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL")] = np.zeros_like(ts)
        busy = power - idle_w
        reasons = (
            np.where(busy < 0.02 * (tdp - idle_w), _CLOCK_IDLE, 0)
            | np.where(power >= 0.97 * tdp, _CLOCK_POWER_CAP, 0)
            | np.where(temp >= 83.0, _CLOCK_SW_THERMAL, 0)
        )
        out[(idx, -1, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")] = reasons.astype(np.float64)

    # -- faults --------------------------------------------------------------------------------
    def state(self, t: float) -> FaultState:
        epoch = self.scenario.epoch
        lost: set[int] = set()
        errored: set[tuple[int, str]] = set()
        counts: dict[int, dict[int, int]] = {}
        last: dict[int, XidEvent] = {}
        hung_for = 0.0
        init_failing = False
        for f in self.faults:
            if f.kind == "xid" and f.gpu is not None:
                n = faultlib.count_until(f, epoch, t)
                if n:
                    per_gpu = counts.setdefault(f.gpu, {})
                    per_gpu[f.code] = per_gpu.get(f.code, 0) + n
                    start = faultlib.last_start(f, epoch, t)
                    if start is not None and (f.gpu not in last or last[f.gpu].timestamp <= start):
                        last[f.gpu] = XidEvent(f.code, start)
            elif not faultlib.active(f, epoch, t):
                continue
            elif f.kind == "gpu_lost" and f.gpu is not None:
                lost.add(f.gpu)
            elif f.kind == "nvml_error" and f.gpu is not None:
                errored.add((f.gpu, f.field))
            elif f.kind == "hung":
                left = faultlib.remaining(f, epoch, t)
                hung_for = max(hung_for, min(f.block, left) if f.block else left)
            elif f.kind == "init_error":
                init_failing = True
        frozen_counts = {g: MappingProxyType(dict(c)) for g, c in counts.items()}
        return FaultState(frozenset(lost), frozenset(errored), frozen_counts, last, hung_for, init_failing)

    def edges(self, t0: float, t1: float) -> list[float]:
        """Times in ``(t0, t1]`` where the fault state or the pods holding devices (and so the set of
        series) may change."""
        out: set[float] = set()
        for f in self.faults:
            out.update(faultlib.edges(f, self.scenario.epoch, t0, t1))
        for pod in self.scenario.pods_on(self.node.name):
            out.update(t for t in (pod.start, pod.end) if t0 < t <= t1)
        return sorted(out)

    # -- snapshot ------------------------------------------------------------------------------
    def build(
        self, t: float, state: FaultState, value_of: Callable[[Key], float], keys: Iterable[Key]
    ) -> NodeSnapshot:
        """The snapshot at ``t``; ``keys`` are the keys :meth:`continuous` produced."""
        errors: dict[str, int] = {}
        gpus: list[GpuSnapshot] = []
        lost: list[LostGpu] = []
        by_gpu: dict[int, list[_Device]] = {}
        for d in self.devices:
            by_gpu.setdefault(d.gpu.index, []).append(d)
        index: dict[tuple[int, int], list[Key]] = {}
        for k in sorted(keys):
            index.setdefault((k[0], k[1]), []).append(k)
        for gpu in self.node.gpus:
            if gpu.index in state.lost:
                lost.append(LostGpu(gpu.index, gpu.uuid, gpu.pci_bus_id, "GPU is lost (fell off the bus)"))
                continue
            bad = {name for g, name in state.errored if g == gpu.index}
            for name in bad:
                errors[f"field:{name}"] = errors.get(f"field:{name}", 0) + 1

            def values(gi: int, bad: set[str] = bad, idx: int = gpu.index) -> Mapping[str, float]:
                return MappingProxyType(
                    {
                        k[2]: value_of(k)
                        for k in index.get((idx, gi), ())
                        if k[2] not in bad and not k[2].startswith(PROC_PREFIX)
                    }
                )

            gpu_values = dict(values(-1))
            instances = []
            whole_processes: int | None = None
            per_process: tuple[ProcessUsage, ...] | None = None
            for d in by_gpu.get(gpu.index, []):
                holders = d.holders(t)
                processes = sum(_processes(p) for p in holders)
                if d.gi_id < 0:
                    whole_processes = processes
                    if d.shared:
                        per_process = self._per_process(d, value_of, t)
                    continue
                if self.node.dra == "dynamic" and not holders:
                    continue  # DynamicMIG: no claim, no instance
                inst = next(i for i in gpu.instances if i.gi_id == d.gi_id)
                instances.append(
                    MigInstance(
                        gpu_instance_id=inst.gi_id,
                        compute_instance_id=0,
                        profile=inst.profile.name,
                        placement_start=inst.start,
                        placement_size=inst.profile.memory_slices,
                        uuid=self.instance_uuid(gpu.index, inst.gi_id, inst.uuid, t),
                        values=values(inst.gi_id),
                        compute_processes=processes,
                    )
                )
            gpus.append(
                GpuSnapshot(
                    info=_info(gpu),
                    values=MappingProxyType(gpu_values),
                    instances=tuple(instances),
                    xid_counts=state.xid_counts.get(gpu.index, MappingProxyType({})),
                    last_xid=state.last_xid.get(gpu.index),
                    compute_processes=whole_processes,
                    processes=per_process,
                )
            )
        driver = self.node.gpus[0].driver_version if self.node.gpus else ""
        return NodeSnapshot(t, tuple(gpus), tuple(lost), MappingProxyType(errors), driver)

    def claim_sequence(self, t: float) -> int:
        """Which claim holds the devices of a dynamic-MIG node at ``t`` (one every ``claim_every``)."""
        return max(0, math.floor((t - self.scenario.epoch) / self.node.claim_every))

    def instance_uuid(self, gpu: int, gi: int, static_uuid: str, t: float) -> str:
        """The MIG UUID at ``t``: fixed, except on DynamicMIG where each claim creates a new instance."""
        if self.node.dra != "dynamic":
            return static_uuid
        return identity.mig_uuid(self.seed, f"{self.node.name}#claim{self.claim_sequence(t)}", gpu, gi)

    def _per_process(
        self, d: _Device, value_of: Callable[[Key], float], t: float
    ) -> tuple[ProcessUsage, ...]:
        """One process per busy pod holding a time-sliced GPU at ``t``, with its own share."""
        idx, gi = d.gpu.index, d.gi_id
        return tuple(
            ProcessUsage(
                pid=identity.process_id(self.seed, pod.namespace, pod.name),
                memory_bytes=value_of((idx, gi, f"{PROC_PREFIX}{k}:mem")) * 1048576.0,
                sm_util=value_of((idx, gi, f"{PROC_PREFIX}{k}:util")),
            )
            for k, pod in enumerate(d.pods)
            if pod.alive(t) and _processes(pod)
        )


def reconfigured(scenario: Scenario, node: Node, fault: Fault, k: int) -> Node:
    """``node`` after the ``k``-th MIG reconfiguration: the fault's GPU gets new instances with new
    UUIDs (the pods that held the old ones hold nothing); everything else stays."""
    assert fault.gpu is not None
    old = node.gpus[fault.gpu]
    counts = dict(fault.mig or {})
    new = scenario_mod.build_gpu(
        scenario.seed,
        f"{node.name}#reconfigured{k}",
        index=old.index,
        model=old.model,
        mig_name=fault.mig_name,
        counts=counts or None,
        driver=old.driver_version,
    )
    new = replace(new, uuid=old.uuid, pci_bus_id=old.pci_bus_id)
    gpus = tuple(new if g.index == old.index else g for g in node.gpus)
    return replace(node, gpus=gpus)


def _integral_over_life(pod: Pod, *, seed: int, entity: str, epoch: float, ts: Array) -> Array:
    """The pod's utilisation integrated from the epoch over the part of its lifetime before each
    time (percent-seconds): flat before it starts and after it ends."""
    start = max(pod.start, epoch)
    t = np.clip(ts, start, max(start, pod.end))
    at = patterns.integral(pod.utilization, seed=seed, entity=entity, t0=epoch, t=t)
    before = patterns.integral(pod.utilization, seed=seed, entity=entity, t0=epoch, t=np.array([start]))
    return np.asarray(at - before[0], dtype=np.float64)


def _processes(pod: Pod | None) -> int:
    """1 while a pod holds the device and runs anything (busy or holding memory), else 0."""
    if pod is None:
        return 0
    mem = pod.memory_mib
    busy = pod.utilization.kind != "idle" or (mem.kind != "idle" and max(mem.base, mem.peak) > 0)
    return 1 if busy else 0


def _info(gpu: Gpu) -> GpuInfo:
    return GpuInfo(
        index=gpu.index,
        uuid=gpu.uuid,
        pci_bus_id=gpu.pci_bus_id,
        minor_number=gpu.index,
        model_name=gpu.model.product_name,
        pci_device_id=gpu.model.device_id,
        driver_version=gpu.driver_version,
        mig_enabled=gpu.mig_enabled,
        gpm_supported=gpu.model.key in GPM_MODELS,
        memory_total_mib=gpu.model.memory_mib,
    )
