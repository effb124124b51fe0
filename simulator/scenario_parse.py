"""Checked reading of scenario values: patterns, HPAs, faults and pending pods.

Each reader takes the :class:`gpupilot_common.section.Section` that holds its field and raises
:class:`ScenarioError` on the first problem, in the project's one shape:
``<file>:<line>: <path>: <problem>``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import cast, get_args

from exporter.contract import fields
from gpupilot_common.section import Section
from mig_geometry.catalogue import GpuModel
from simulator.model import Fault, FaultKind, Gpu, Hpa, HpaMetric, Node, PendingPod
from simulator.patterns import IDLE, Pattern, PatternKind

MAX_GPUS_PER_ENTRY = 64
"""A node entry's ``count``: the largest GPU servers hold 16; more is a typo."""
MAX_REPLICAS = 10_000
"""A workload's ``replicas``: each is a simulated pod with its own series."""


_PATTERN_KEYS = ("pattern", "value", "base", "peak", "peak_hour", "noise", "every", "duration")
_PATTERN = "a number, idle, or a mapping with pattern: constant, daily or bursty"


def parse_pattern(sec: Section, key: str, *, default: object, maximum: float = math.inf) -> Pattern:
    """``40`` (constant), ``idle``, or ``{pattern: daily, base, peak, peak_hour, noise}`` etc."""
    raw = sec.raw(key)
    raw = default if raw is None else raw
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        value = sec.number(key, raw, minimum=None)
        _check_range(sec, key, value, maximum)
        return Pattern("constant", base=value, maximum=maximum)
    if raw == "idle":
        return IDLE
    p = sec.at(raw, key, what=_PATTERN)
    p.keys(_PATTERN_KEYS)
    kind = p.raw("pattern")
    if kind not in get_args(PatternKind):
        raise p.fail("pattern", f"{kind!r} is not one of constant, daily, bursty, idle")
    kind = cast(PatternKind, kind)
    needed = {"constant": ("value",), "daily": ("base", "peak"), "bursty": ("base", "peak"), "idle": ()}
    for name in needed[kind]:
        if name not in p:
            raise p.fail_here(f"a {kind} pattern needs '{name}'")
    nums = {k: p.number(k, minimum=None) for k in ("value", "base", "peak", "peak_hour", "noise") if k in p}
    for name in ("value", "base", "peak"):
        if name in nums:
            _check_range(p, name, nums[name], maximum)
    if not 0 <= nums.get("peak_hour", 0) < 24:
        raise p.fail("peak_hour", "must be in [0, 24)")
    every = p.duration("every", 3600.0, allow_zero=True)
    duration = p.duration("duration", 300.0, allow_zero=True)
    if kind == "bursty" and not 0 < duration <= every:
        raise p.fail("duration", f"must be > 0 and at most every ({every:g}s)")
    return Pattern(
        kind,
        base=nums.get("value", nums.get("base", 0.0)),
        peak=nums.get("peak", 0.0),
        peak_hour=nums.get("peak_hour", 14.0),
        noise=abs(nums.get("noise", 0.0)),
        every=every,
        duration=duration,
        maximum=maximum,
    )


def _check_range(sec: Section, key: str, value: float, maximum: float) -> None:
    if value < 0 or value > maximum:
        raise sec.fail(key, f"{value:g} is outside [0, {maximum:g}]")


_HPA = ("namespace", "name", "target", "min_replicas", "max_replicas", "metrics")
_HPA_METRIC = ("name", "type", "value")
_TARGET_TYPES = ("AverageValue", "Value", "Utilization")


def parse_hpas(top: Section, *, deployments: set[tuple[str, str]]) -> tuple[Hpa, ...]:
    out: list[Hpa] = []
    for h in top.sections("hpas"):
        h.keys(_HPA)
        ns = h.text("namespace", "default")
        name = h.text("name")
        target = h.text("target")
        if (ns, target) not in deployments:
            raise h.fail("target", f"no deployment {ns}/{target} among the workloads")
        lo = h.integer("min_replicas", 1, minimum=1)
        hi = h.integer("max_replicas", minimum=1)
        if hi < lo:
            raise h.fail("max_replicas", f"{hi} is below min_replicas {lo}")
        metrics: list[HpaMetric] = []
        for m in h.sections("metrics", required=True):
            m.keys(_HPA_METRIC)
            ttype = m.text("type", "AverageValue")
            if ttype not in _TARGET_TYPES:
                raise m.fail("type", f"{ttype!r} is not one of {', '.join(_TARGET_TYPES)}")
            metrics.append(HpaMetric(m.text("name"), ttype, m.number("value", minimum=None)))
        out.append(Hpa(ns, name, "Deployment", target, lo, hi, tuple(metrics)))
    return tuple(out)


_FAULT = ("kind", "node", "gpu", "at", "every", "duration", "code", "field", "block", "mig")
_DEFAULT_DURATION = {
    "gpu_lost": 600.0,
    "xid": 0.0,
    "nvml_error": 600.0,
    "hung": 120.0,
    "init_error": 300.0,
    "mig_reconfigure": 0.0,
}
MigResolver = Callable[[Section, str, GpuModel], tuple[str | None, dict[str, int] | None]]
"""(the section holding a ``mig`` field, its key, the GPU model) → (built-in config name, profile
counts)."""


def _new_layout(
    f: Section, *, kind: str, gpu: Gpu | None, mig: MigResolver | None
) -> tuple[str | None, dict[str, int] | None]:
    """A ``mig_reconfigure`` fault's layout (``{}``: MIG off); no other fault may give one."""
    if kind != "mig_reconfigure":
        if "mig" in f:
            raise f.fail("mig", "only a mig_reconfigure fault has a layout")
        return None, None
    if "mig" not in f:
        raise f.fail_here("a mig_reconfigure fault needs 'mig': a built-in config or profile counts")
    assert gpu is not None and mig is not None
    name, counts = mig(f, "mig", gpu.model)
    return name, counts or {}


def parse_faults(
    top: Section, *, nodes: Mapping[str, Node], mig: MigResolver | None = None
) -> tuple[Fault, ...]:
    out: list[Fault] = []
    for f in top.sections("faults"):
        f.keys(_FAULT)
        kind = f.raw("kind")
        if kind not in get_args(FaultKind):
            raise f.fail("kind", f"{kind!r} is not one of {', '.join(get_args(FaultKind))}")
        kind = cast(FaultKind, kind)
        node_name = f.text("node")
        node = nodes.get(node_name)
        if node is None:
            raise f.fail("node", f"no node {node_name!r} in the scenario")
        gpu: int | None = None
        if kind == "init_error":
            if "gpu" in f:
                raise f.fail("gpu", "init_error concerns the whole node: remove 'gpu'")
        else:
            gpu = f.integer("gpu", minimum=0)
            if gpu >= len(node.gpus):
                raise f.fail("gpu", f"{node_name} has {len(node.gpus)} GPUs (0–{len(node.gpus) - 1})")
        at = f.duration("at", 0.0, allow_zero=True)
        every = f.duration("every", 0.0, allow_zero=True) if f.raw("every") is not None else None
        duration = f.duration("duration", _DEFAULT_DURATION[kind], allow_zero=True)
        if every is not None and not duration < every:
            raise f.fail("every", f"must be longer than duration ({duration:g}s)")
        if kind == "mig_reconfigure" and ("every" in f or "duration" in f):
            raise f.fail_here("a mig_reconfigure fault happens once and stays: remove every/duration")
        if kind not in ("xid", "mig_reconfigure") and duration <= 0:
            raise f.fail("duration", "must be positive")
        code = 0
        if kind == "xid":
            code = f.integer("code", minimum=1)
        elif "code" in f:
            raise f.fail("code", "only an xid fault has a code")
        field_name = ""
        if kind == "nvml_error":
            field_name = f.text("field")
            if field_name not in fields.BY_NAME:
                raise f.fail("field", f"{field_name!r} is not a field of exporter/contract/fields.py")
        elif "field" in f:
            raise f.fail("field", "only an nvml_error fault names a field")
        block = f.duration("block", 0.0, allow_zero=True)
        mig_name, counts = _new_layout(f, kind=kind, gpu=node.gpus[gpu] if gpu is not None else None, mig=mig)
        out.append(
            Fault(
                kind,
                node_name,
                gpu,
                at,
                every,
                duration,
                code,
                field_name,
                block,
                mig=MappingProxyType(counts) if counts is not None else None,
                mig_name=mig_name,
            )
        )
    return tuple(out)


def parse_lifetime(sec: Section, *, epoch: float) -> tuple[float, float]:
    """``start`` and ``end`` (offsets from the epoch, like a fault's ``at``) as Unix seconds; an
    absent one is ``-inf`` / ``inf`` (always there, never gone)."""
    start = epoch + sec.duration("start", 0.0, allow_zero=True) if "start" in sec else -math.inf
    end = epoch + sec.duration("end", 0.0, allow_zero=True) if "end" in sec else math.inf
    if end <= start:
        raise sec.fail("end", f"must be after start ({sec.raw('start')}), got {sec.raw('end')}")
    return start, end


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


_PENDING = ("namespace", "pod", "resource", "count", "start", "end")
_GPU_RESOURCE = re.compile(r"nvidia\.com/(gpu|mig-[0-9]+g\.[0-9]+gb(\+me)?)")


def parse_pending(
    top: Section, *, running: Mapping[tuple[str, str], tuple[float, float]], epoch: float
) -> tuple[PendingPod, ...]:
    """``pending:``: pods requesting GPUs or MIG devices that no node offers (phase Pending), from
    ``start`` (their arrival) to ``end``. A pending pod may share a running pod's name when their
    times do not overlap: Pending until it is placed, running after."""
    out: list[PendingPod] = []
    seen: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for p in top.sections("pending"):
        p.keys(_PENDING)
        ns = p.text("namespace", "default")
        name = p.text("pod")
        life = parse_lifetime(p, epoch=epoch)
        others = seen.setdefault((ns, name), [])
        if (ns, name) in running:
            others = [*others, running[(ns, name)]]
        if any(overlap(life, o) for o in others):
            raise p.fail("pod", f"pod {ns}/{name} is defined twice (at overlapping times)")
        seen[(ns, name)].append(life)
        resource = p.text("resource")
        if not _GPU_RESOURCE.fullmatch(resource):
            raise p.fail(
                "resource",
                f"{resource!r} is not nvidia.com/gpu or nvidia.com/mig-<profile> (e.g. nvidia.com/mig-1g.10gb)",
            )
        count = p.integer("count", 1, minimum=1, maximum=MAX_GPUS_PER_ENTRY)
        out.append(PendingPod(ns, name, resource, count, start=life[0], end=life[1]))
    return tuple(out)
