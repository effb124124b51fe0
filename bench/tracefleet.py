"""A GPU cluster in the shape of the public GPU-sharing traces, synthesised: the fleet, its tasks over
a day, and the same fleet as an analysis (for the optimiser alone) or as a scenario (for the
simulator, the backfill and ``plan``).

Shape, from what the traces' papers publish about them (no trace data is read or copied): the
Alibaba GPU cluster trace of 2023 (the FGD paper, USENIX ATC '23) holds about 8,000 tasks, 7,064 of
them with a GPU; 3,078 of those share a GPU by a fraction (``gpu_milli`` below 1000), the others
take whole GPUs, nearly all one, a few 2, 4 or 8 on one node; tasks arrive and depart over time.
Here the fractions are drawn from a spread of small shares and halves; each sharing task asks for
the smallest H100 80GB MIG profile covering its share (a fifth of the 1-slice ones also a 20 GB
frame buffer), whole-GPU tasks for GPUs with MIG off. Nodes hold 8 H100 80GB; about a third of the
GPUs carry a MIG layout from the usual configs (all-1g, all-2g, all-3g, 4g+3g, balanced, 1g.20gb×4,
7g), fixed for the day, the rest run MIG off. A scheduler places each arrival on a random node with
a free device of its kind (which spreads tasks, as the default Kubernetes scheduler does) or leaves
it Pending until one frees; departures free devices. Peak use is a fraction of the request drawn
per task (mostly 0.3-0.8, a few close to all of it).

``generate()`` (930 nodes, 7,440 GPUs) gives a little over 7,000 tasks running at the end of the day, the whole trace's size; smaller
fleets scale every count.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpupilot_common.timefmt import format_time
from mig_geometry.catalogue import GpuModel, find_model
from mig_geometry.placement import place
from rightsizer.analysis.history import build_workloads
from rightsizer.analysis.types import (
    Analysis,
    DeviceStats,
    GpuInventory,
    InstanceInfo,
    NodeInventory,
    PendingPod,
    PodKey,
)

MODEL_KEY = "H100 80GB"
GPUS_PER_NODE = 8
HORIZON_S = 86400.0
SHARE_FRACTION = 3078 / 7064
"""Tasks sharing a GPU among the tasks with a GPU (the 2023 trace)."""
WHOLE_GPUS = ((1, 0.93), (2, 0.04), (4, 0.02), (8, 0.01))
"""GPUs per whole-GPU task and their weights."""
SHARES = ((100, 0.22), (200, 0.12), (250, 0.1), (300, 0.08), (400, 0.1), (500, 0.3), (600, 0.05), (800, 0.03))
"""gpu_milli of sharing tasks and their weights: many small shares and halves."""
LAYOUTS = (
    ({"1g.10gb": 7}, 0.12),
    ({"2g.20gb": 3}, 0.1),
    ({"3g.40gb": 2}, 0.1),
    ({"4g.40gb": 1, "3g.40gb": 1}, 0.42),
    ({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, 0.09),
    ({"1g.20gb": 4}, 0.05),
    ({"7g.80gb": 1}, 0.12),
)
"""MIG layouts of the partitioned GPUs (the GPU Operator's usual configs) and their weights."""
MIG_GPU_SHARE = 0.33
"""GPUs carrying a MIG layout."""
LONG_RUNNING = 0.35
"""Tasks running at the start of the day that run all of it (services); every other task lasts a
log-normal time (median 2 h), and as many arrive over the day as leave."""


def _model() -> GpuModel:
    model = find_model(MODEL_KEY)
    assert model is not None
    return model


@dataclass(frozen=True)
class Device:
    """One device a task can hold: a whole GPU (``profile == ""``) or a MIG instance (``slot``-th of
    its profile on the GPU, in placement order)."""

    node: int
    gpu: int
    profile: str = ""
    slot: int = 0


@dataclass
class Task:
    name: str
    namespace: str
    profile: str
    """MIG profile asked for; ``""``: whole GPUs."""
    gpus: int
    milli: int
    arrival: float
    departure: float
    peak: float
    """Peak use as a fraction of the request."""
    start: float | None = None
    """When it was placed (``None``: still Pending)."""
    devices: tuple[Device, ...] = ()


@dataclass
class Fleet:
    nodes: int
    layouts: dict[tuple[int, int], dict[str, int]]
    """(node, GPU) → MIG layout; GPUs absent run MIG off."""
    tasks: list[Task]
    horizon: float = HORIZON_S
    model: GpuModel = field(default_factory=_model)

    def node_name(self, n: int) -> str:
        return f"node-{n:04d}"

    def running(self, t: float) -> list[Task]:
        return [k for k in self.tasks if k.start is not None and k.start <= t < k.departure]

    def pending(self, t: float) -> list[Task]:
        return [k for k in self.tasks if k.arrival <= t < k.departure and (k.start is None or k.start > t)]


def profile_for(model: GpuModel, milli: int, rng: random.Random) -> str:
    """The smallest MIG profile covering a share of ``milli``/1000 of the GPU's compute."""
    slices = max(1, math.ceil(milli / 1000 * model.compute_slices - 1e-9))
    if slices == 1:
        return "1g.20gb" if rng.random() < 0.2 else "1g.10gb"
    for name in ("2g.20gb", "3g.40gb", "4g.40gb"):
        prof = model.profile(name)
        assert prof is not None
        if prof.compute_slices >= slices:
            return name
    return "7g.80gb"


def _pick(rng: random.Random, table: Sequence[tuple[object, float]]) -> object:
    return rng.choices([t for t, _ in table], weights=[w for _, w in table])[0]


class _Ordered:
    """Nodes in the order they last gained a free device (as a dict's keys are), with the ``k``-th
    found in O(log n) (a Fenwick tree over arrival numbers): the scheduler's random choice among
    them stays the same as over a list, without building the list for every task."""

    def __init__(self) -> None:
        self.seq: dict[int, int] = {}
        self.node_at: list[int] = []
        self.tree: list[int] = [0]

    def __len__(self) -> int:
        return len(self.seq)

    def add(self, node: int) -> None:
        if node in self.seq:
            return
        self.node_at.append(node)
        self.tree.append(0)
        i = len(self.node_at)
        # a new last slot: its tree entry holds the sums it covers, then this node
        low = i - (i & -i)
        j = i - 1
        while j > low:
            self.tree[i] += self.tree[j]
            j -= j & -j
        self.seq[node] = i
        self._update(i, 1)

    def remove(self, node: int) -> None:
        self._update(self.seq.pop(node), -1)

    def _update(self, i: int, delta: int) -> None:
        while i < len(self.tree):
            self.tree[i] += delta
            i += i & -i

    def kth(self, k: int) -> int:
        """The ``k``-th node (0-based) in order."""
        pos, rest = 0, k + 1
        step = 1 << (len(self.tree) - 1).bit_length()
        while step:
            nxt = pos + step
            if nxt < len(self.tree) and self.tree[nxt] < rest:
                pos = nxt
                rest -= self.tree[nxt]
            step >>= 1
        return self.node_at[pos]  # position pos + 1, 0-based


class _Cluster:
    """Free devices per kind, by node, as the scheduler sees them."""

    def __init__(self, nodes: int, layouts: dict[tuple[int, int], dict[str, int]], model: GpuModel) -> None:
        self.free: dict[str, dict[int, list[Device]]] = {}
        self.order: dict[str, _Ordered] = {}
        for n in range(nodes):
            for g in range(GPUS_PER_NODE):
                layout = layouts.get((n, g))
                if layout is None:
                    self._add(Device(n, g))
                    continue
                placed = place(model, layout).placed
                assert placed is not None
                seen: dict[str, int] = {}
                for pl in placed:
                    name = pl.profile.name
                    self._add(Device(n, g, name, seen.get(name, 0)))
                    seen[name] = seen.get(name, 0) + 1

    def _add(self, d: Device) -> None:
        self.free.setdefault(d.profile, {}).setdefault(d.node, []).append(d)
        self.order.setdefault(d.profile, _Ordered()).add(d.node)

    def take(self, task: Task, rng: random.Random) -> tuple[Device, ...] | None:
        per_node = self.free.get(task.profile, {})
        if task.gpus == 1:
            order = self.order.get(task.profile)
            if not order:
                return None
            n = order.kth(rng.randrange(len(order)))  # what rng.choice over the nodes draws
        else:
            nodes = [n for n, devs in per_node.items() if len(devs) >= task.gpus]
            if not nodes:
                return None
            n = rng.choice(nodes)
        devs = per_node[n]
        taken = tuple(devs.pop(rng.randrange(len(devs))) for _ in range(task.gpus))
        if not devs:
            del per_node[n]
            self.order[task.profile].remove(n)
        return taken

    def give_back(self, devices: Sequence[Device]) -> None:
        for d in devices:
            self._add(d)


def generate(*, nodes: int = 930, tasks: int = 7500, seed: int = 50, horizon: float = HORIZON_S) -> Fleet:
    """About ``tasks`` tasks running at the end of ``horizon`` on ``nodes`` nodes, with the day's
    arrivals and departures before it."""
    rng = random.Random(seed)
    model = _model()
    layouts: dict[tuple[int, int], dict[str, int]] = {}
    for n in range(nodes):
        for g in range(GPUS_PER_NODE):
            if rng.random() < MIG_GPU_SHARE:
                layout = _pick(rng, LAYOUTS)
                assert isinstance(layout, dict)
                layouts[(n, g)] = dict(layout)
    median = 2 * 3600.0
    # Enough arrivals over the day that about ``tasks`` run at its end: those that started before
    # the day (running from 0) plus the day's, each short one replaced as it ends.
    mean_short = median * math.exp(1.2**2 / 2)
    rate = tasks * (1 - LONG_RUNNING) / mean_short
    arrivals = [0.0] * tasks + sorted(rng.uniform(0, horizon) for _ in range(int(rate * horizon)))
    out: list[Task] = []
    for i, at in enumerate(arrivals):
        share = rng.random() < SHARE_FRACTION
        long_running = i < tasks and rng.random() < LONG_RUNNING
        milli = int(_pick(rng, SHARES)) if share else 1000  # type: ignore[call-overload]
        gpus = 1 if share else int(_pick(rng, WHOLE_GPUS))  # type: ignore[call-overload]
        duration = math.inf if long_running else median * math.exp(rng.gauss(0, 1.2))
        # Before the day, a short task has already run a random part of its time.
        departure = at + (duration * rng.random() if at == 0.0 and not long_running else duration)
        peak = rng.uniform(0.9, 1.0) if rng.random() < 0.05 else rng.uniform(0.3, 0.8)
        out.append(
            Task(
                name=f"task-{i:06d}",
                namespace=f"team-{rng.randrange(24):02d}",
                profile=profile_for(model, milli, rng) if share else "",
                gpus=gpus,
                milli=milli,
                arrival=at,
                departure=min(departure, math.inf),
                peak=peak,
            )
        )
    _schedule(out, _Cluster(nodes, layouts, model), rng)
    return Fleet(nodes, layouts, out, horizon, model)


def _schedule(tasks: list[Task], cluster: _Cluster, rng: random.Random) -> None:
    """Arrivals in order; a task that finds no device waits (FIFO per kind) until one frees."""
    events: list[tuple[float, int, int]] = [(k.arrival, 1, i) for i, k in enumerate(tasks)]
    heapq.heapify(events)
    waiting: dict[tuple[str, int], list[int]] = {}
    while events:
        t, kind, i = heapq.heappop(events)
        task = tasks[i]
        if kind == 0:  # departure
            cluster.give_back(task.devices)
            for want in list(waiting):
                if want[0] != task.profile:
                    continue
                queue = waiting[want]
                while queue:
                    j = queue[0]
                    if tasks[j].departure <= t:  # gave up waiting
                        queue.pop(0)
                        continue
                    got = cluster.take(tasks[j], rng)
                    if got is None:
                        break
                    queue.pop(0)
                    tasks[j].start, tasks[j].devices = t, got
                    if math.isfinite(tasks[j].departure):
                        heapq.heappush(events, (tasks[j].departure, 0, j))
            continue
        got = cluster.take(task, rng)
        if got is None:
            waiting.setdefault((task.profile, task.gpus), []).append(i)
            continue
        task.start, task.devices = t, got
        if math.isfinite(task.departure):
            heapq.heappush(events, (task.departure, 0, i))


# ---------------------------------------------------------------------------------------------- analysis


def analysis_at(fleet: Fleet, t: float, *, window_h: float = 24.0, headroom: float = 0.2) -> Analysis:
    """What ``plan`` would read of the fleet at ``t``: the inventory, one device per MIG instance and
    MIG-off GPU with the peak of the task holding it then, and the Pending tasks."""
    model = fleet.model
    holder: dict[tuple[int, int, str, int], Task] = {}
    for task in fleet.running(t):
        for d in task.devices:
            holder[(d.node, d.gpu, d.profile, d.slot)] = task
    inventory: list[NodeInventory] = []
    devices: list[DeviceStats] = []
    for n in range(fleet.nodes):
        name = fleet.node_name(n)
        gpus = []
        for g in range(GPUS_PER_NODE):
            uuid = f"GPU-{n}-{g}"
            layout = fleet.layouts.get((n, g))
            if layout is None:
                gpus.append(GpuInventory(name, g, uuid, model.key, model.device_id, False, model.memory_mib))
                whole = holder.get((n, g, "", 0))
                devices.append(_device(name, g, uuid, "", "", whole, 1.0, model.memory_mib, window_h))
                continue
            placed = place(model, layout).placed
            assert placed is not None
            instances = []
            seen: dict[str, int] = {}
            for gi, pl in enumerate(placed, 1):
                prof = pl.profile
                slot = seen.get(prof.name, 0)
                seen[prof.name] = slot + 1
                instances.append(InstanceInfo(prof.name, str(gi), pl.start, pl.size, f"MIG-{n}-{g}-{gi}"))
                held = holder.get((n, g, prof.name, slot))
                share = prof.compute_slices / model.compute_slices
                devices.append(
                    _device(name, g, uuid, prof.name, str(gi), held, share, prof.memory_mib, window_h)
                )
            gpus.append(
                GpuInventory(
                    name, g, uuid, model.key, model.device_id, True, model.memory_mib, tuple(instances)
                )
            )
        inventory.append(NodeInventory(name, tuple(gpus), "mixed", "custom"))
    workloads = build_workloads(inventory, devices, {}, headroom=headroom)
    pending = tuple(
        PendingPod(cluster="", namespace=k.namespace, name=k.name, profile=k.profile, count=k.gpus)
        for k in fleet.pending(t)
    )
    return Analysis(
        t - window_h * 3600,
        t,
        "synthetic",
        tuple(inventory),
        tuple(devices),
        tuple(workloads),
        pending=pending,
    )


def _device(
    node: str,
    gpu: int,
    uuid: str,
    profile: str,
    gi: str,
    task: Task | None,
    share: float,
    memory_mib: int,
    window_h: float,
) -> DeviceStats:
    """A device over the window: its task's peak (the share it asked for × its peak fraction, as
    activity of this device) or idle."""
    pods: tuple[PodKey, ...] = ()
    if task is None:
        peak, fb = 0.0, 0.0
    else:
        asked = task.milli / 1000 if task.profile else 1.0
        peak = min(1.0, task.peak * asked / share)
        fb = min(float(memory_mib), task.peak * asked * 81559)
        pods = (PodKey(task.namespace, task.name),)
    return DeviceStats(
        node=node,
        gpu=gpu,
        gpu_uuid=uuid,
        profile=profile,
        gpu_instance_id=gi,
        pods=pods,
        allocated_hours=window_h if pods else 0.0,
        p50=peak * 0.5,
        p95=peak * 0.9,
        max=peak,
        fb_peak_mib=fb,
        idle_hours=window_h if peak < 0.05 else 0.0,
        coverage_hours=window_h,
        window_hours=window_h,
        peak=peak,
        peak_at=0.0,
    )


# ---------------------------------------------------------------------------------------------- scenario


def scenario_yaml(fleet: Fleet, *, epoch: float, at: float | None = None) -> str:
    """The fleet as an ordinary scenario (YAML written out, no alias), its times offsets from
    ``epoch`` (the start of the fleet's day). ``at``: only the tasks running then and the ones
    Pending then, with no lifetimes (a snapshot); ``None``: every task of the day with its
    lifetime (``start``/``end``), Pending from its arrival to its placement."""
    model = fleet.model
    lines = [
        "# A GPU cluster in the shape of the public GPU-sharing traces (bench/tracefleet.py).",
        "seed: 50",
        f"epoch: {format_time(epoch)}",
        "nodes:",
    ]
    for n in range(fleet.nodes):
        gpus = []
        for g in range(GPUS_PER_NODE):
            layout = fleet.layouts.get((n, g))
            mig = (
                ""
                if layout is None
                else ", mig: {" + ", ".join(f'"{q}": {c}' for q, c in sorted(layout.items())) + "}"
            )
            gpus.append(f"{{model: {model.key}{mig}}}")
        lines.append(f"  - name: {fleet.node_name(n)}")
        lines.append(f"    gpus: [{', '.join(gpus)}]")
    lines.append("workloads:")
    pending: list[str] = []
    for task in fleet.tasks:
        if at is not None:
            if task.start is not None and task.start <= at < task.departure:
                lines += _workload_yaml(fleet, task, epoch=epoch, lifetime=False)
            elif task.arrival <= at < task.departure:
                pending.append(_pending_yaml(task, epoch=epoch, lifetime=False))
            continue
        if task.start is not None and task.start < fleet.horizon:
            lines += _workload_yaml(fleet, task, epoch=epoch, lifetime=True)
        end = task.start if task.start is not None else task.departure
        if end > task.arrival and task.arrival < fleet.horizon:
            pending.append(_pending_yaml(task, epoch=epoch, lifetime=True))
    if pending:
        lines.append("pending:")
        lines += pending
    return "\n".join(lines) + "\n"


def _offset(seconds: float) -> str:
    return f"{round(seconds)}s"


def _workload_yaml(fleet: Fleet, task: Task, *, epoch: float, lifetime: bool) -> list[str]:
    model = fleet.model
    devices = ", ".join(
        f"{{node: {fleet.node_name(d.node)}, gpu: {d.gpu}, profile: {d.profile}, slot: {d.slot}}}"
        if d.profile
        else f"{fleet.node_name(d.node)}/{d.gpu}"
        for d in task.devices
    )
    share = 1.0
    memory = model.memory_mib
    if task.profile:
        prof = model.profile(task.profile)
        assert prof is not None
        share, memory = prof.compute_slices / model.compute_slices, prof.memory_mib
    asked = task.milli / 1000 if task.profile else 1.0
    peak = min(100.0, round(100 * task.peak * asked / share, 1))
    fb = min(memory, round(task.peak * asked * 81559))
    out = [
        f"  - namespace: {task.namespace}",
        f"    pod: {task.name}",
        "    container: main",
        f"    labels: {{app: {task.name}, gpu-milli: '{task.milli}'}}",
        f"    devices: [{devices}]",
        f"    utilization: {{pattern: daily, base: {round(peak / 3, 1)}, peak: {peak}, peak_hour: 14}}",
        f"    memory_mib: {fb}",
    ]
    if lifetime:
        if task.start is not None and task.start > 0:
            out.append(f"    start: {_offset(task.start)}")
        if math.isfinite(task.departure) and task.departure < fleet.horizon:
            out.append(f"    end: {_offset(task.departure)}")
    del epoch
    return out


def _pending_yaml(task: Task, *, epoch: float, lifetime: bool) -> str:
    resource = f"nvidia.com/mig-{task.profile}" if task.profile else "nvidia.com/gpu"
    times = ""
    if lifetime:
        end = task.start if task.start is not None else task.departure
        times = f", start: {_offset(task.arrival)}" if task.arrival > 0 else ""
        times += f", end: {_offset(end)}" if math.isfinite(end) else ""
    del epoch
    return f"  - {{namespace: {task.namespace}, pod: {task.name}, resource: {resource}, count: {task.gpus}{times}}}"
