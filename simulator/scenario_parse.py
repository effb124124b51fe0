"""Checked reading of scenario values: types, unknown keys, patterns, HPAs and faults.

:class:`Ctx` reads a :class:`gpupilot_common.checked.Document` and raises :class:`ScenarioError` on
the first problem, in the project's one shape: ``<file>:<line>: <path>: <problem>``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from typing import NoReturn, cast, get_args

from exporter import fields
from gpupilot_common import checked
from gpupilot_common import timefmt as timespec
from simulator.model import Fault, FaultKind, Hpa, HpaMetric, Node, PendingPod
from simulator.patterns import IDLE, Pattern, PatternKind

_MAX_PROBLEM = 200
MAX_GPUS_PER_ENTRY = 64
"""A node entry's ``count``: the largest GPU servers hold 16; more is a typo."""
MAX_REPLICAS = 10_000
"""A workload's ``replicas``: each is a simulated pod with its own series."""


class Ctx:
    """Typed getters over a scenario document; paths are written ``nodes[2].gpus[0].mig``."""

    def __init__(self, doc: checked.Document) -> None:
        self.doc = doc
        self.file = doc.source

    def fail(self, path: str, problem: str) -> NoReturn:
        if len(problem) > _MAX_PROBLEM:  # a value quoted in it can be anything the file holds
            problem = problem[:_MAX_PROBLEM] + "…"
        raise self.doc.fail_dotted(path, problem)

    def mapping(self, raw: object, path: str, allowed: Collection[str] | None) -> dict[str, object]:
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            self.fail(path, f"expected a mapping, got {type(raw).__name__}")
        if allowed is not None:
            for key in raw:
                if key not in allowed:
                    known = ", ".join(sorted(allowed))
                    self.fail(_join(path, str(key)), f"unknown key (known: {known})")
        return {str(k): v for k, v in raw.items()}

    def sequence(self, raw: object, path: str, *, required: bool = False) -> list[object]:
        if raw is None:
            if required:
                self.fail(path, "required, give a list")
            return []
        if not isinstance(raw, list):
            self.fail(path, f"expected a list, got {type(raw).__name__}")
        if required and not raw:
            self.fail(path, "must not be empty")
        return raw

    def string(self, raw: object, path: str, *, required: bool = False) -> str:
        if raw is None and required:
            self.fail(path, "required")
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            self.fail(path, f"expected a string, got {raw!r}")
        text = str(raw)
        if not text:
            self.fail(path, "must not be empty")
        return text

    def integer(
        self, raw: object, path: str, *, minimum: int | None = None, maximum: int | None = None
    ) -> int:
        if isinstance(raw, str) and raw.strip().isdigit() and len(raw.strip()) <= 18:
            raw = int(raw)
        if isinstance(raw, bool) or not isinstance(raw, int):
            self.fail(path, f"expected an integer, got {raw!r}")
        if minimum is not None and raw < minimum:
            self.fail(path, f"must be at least {minimum}, got {raw}")
        if maximum is not None and raw > maximum:
            self.fail(path, f"must be at most {maximum}, got {raw}")
        return raw

    def number(self, raw: object, path: str) -> float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            self.fail(path, f"expected a number, got {raw!r}")
        if not math.isfinite(raw):
            self.fail(path, "must be finite")
        return float(raw)

    def duration(self, raw: object, path: str) -> float:
        try:
            value = timespec.parse_duration(raw, allow_zero=True)
        except ValueError as e:
            self.fail(path, str(e))
        if value < 0:
            self.fail(path, "must not be negative")
        return value

    def time(self, raw: object, path: str) -> float:
        try:
            return timespec.parse_time(raw, now=0.0)
        except ValueError as e:
            self.fail(path, str(e))

    def string_map(self, raw: object, path: str) -> dict[str, str]:
        m = self.mapping(raw, path, None)
        return {k: self.string(v, _join(path, k)) for k, v in m.items()}


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


_PATTERN_KEYS = {"pattern", "value", "base", "peak", "peak_hour", "noise", "every", "duration"}


def parse_pattern(ctx: Ctx, raw: object, path: str, *, maximum: float = math.inf) -> Pattern:
    """``40`` (constant), ``idle``, or ``{pattern: daily, base, peak, peak_hour, noise}`` etc."""
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        value = ctx.number(raw, path)
        _check_range(ctx, path, value, maximum)
        return Pattern("constant", base=value, maximum=maximum)
    if raw == "idle":
        return IDLE
    m = ctx.mapping(raw, path, _PATTERN_KEYS)
    kind = m.get("pattern")
    if kind not in get_args(PatternKind):
        ctx.fail(f"{path}.pattern", f"{kind!r} is not one of constant, daily, bursty, idle")
    kind = cast(PatternKind, kind)
    needed = {"constant": ("value",), "daily": ("base", "peak"), "bursty": ("base", "peak"), "idle": ()}
    for key in needed[kind]:
        if key not in m:
            ctx.fail(path, f"a {kind} pattern needs '{key}'")
    nums = {
        k: ctx.number(m[k], f"{path}.{k}") for k in ("value", "base", "peak", "peak_hour", "noise") if k in m
    }
    for key in ("value", "base", "peak"):
        if key in nums:
            _check_range(ctx, f"{path}.{key}", nums[key], maximum)
    if not 0 <= nums.get("peak_hour", 0) < 24:
        ctx.fail(f"{path}.peak_hour", "must be in [0, 24)")
    every = ctx.duration(m.get("every", 3600), f"{path}.every")
    duration = ctx.duration(m.get("duration", 300), f"{path}.duration")
    if kind == "bursty" and not 0 < duration <= every:
        ctx.fail(f"{path}.duration", f"must be > 0 and at most every ({every:g}s)")
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


def _check_range(ctx: Ctx, path: str, value: float, maximum: float) -> None:
    if value < 0 or value > maximum:
        ctx.fail(path, f"{value:g} is outside [0, {maximum:g}]")


_HPA = {"namespace", "name", "target", "min_replicas", "max_replicas", "metrics"}
_HPA_METRIC = {"name", "type", "value"}
_TARGET_TYPES = ("AverageValue", "Value", "Utilization")


def parse_hpas(ctx: Ctx, raw: object, *, deployments: set[tuple[str, str]]) -> tuple[Hpa, ...]:
    out: list[Hpa] = []
    for i, item in enumerate(ctx.sequence(raw, "hpas")):
        path = f"hpas[{i}]"
        m = ctx.mapping(item, path, _HPA)
        ns = ctx.string(m.get("namespace", "default"), f"{path}.namespace")
        name = ctx.string(m.get("name"), f"{path}.name", required=True)
        target = ctx.string(m.get("target"), f"{path}.target", required=True)
        if (ns, target) not in deployments:
            ctx.fail(f"{path}.target", f"no deployment {ns}/{target} among the workloads")
        lo = ctx.integer(m.get("min_replicas", 1), f"{path}.min_replicas", minimum=1)
        hi = ctx.integer(m.get("max_replicas"), f"{path}.max_replicas", minimum=1)
        if hi < lo:
            ctx.fail(f"{path}.max_replicas", f"{hi} is below min_replicas {lo}")
        metrics: list[HpaMetric] = []
        for j, mraw in enumerate(ctx.sequence(m.get("metrics"), f"{path}.metrics", required=True)):
            mp = f"{path}.metrics[{j}]"
            mm = ctx.mapping(mraw, mp, _HPA_METRIC)
            ttype = ctx.string(mm.get("type", "AverageValue"), f"{mp}.type")
            if ttype not in _TARGET_TYPES:
                ctx.fail(f"{mp}.type", f"{ttype!r} is not one of {', '.join(_TARGET_TYPES)}")
            metrics.append(
                HpaMetric(
                    ctx.string(mm.get("name"), f"{mp}.name", required=True),
                    ttype,
                    ctx.number(mm.get("value"), f"{mp}.value"),
                )
            )
        out.append(Hpa(ns, name, "Deployment", target, lo, hi, tuple(metrics)))
    return tuple(out)


_FAULT = {"kind", "node", "gpu", "at", "every", "duration", "code", "field", "block"}
_DEFAULT_DURATION = {"gpu_lost": 600.0, "xid": 0.0, "nvml_error": 600.0, "hung": 120.0, "init_error": 300.0}


def parse_faults(ctx: Ctx, raw: object, *, nodes: Mapping[str, Node]) -> tuple[Fault, ...]:
    out: list[Fault] = []
    for i, item in enumerate(ctx.sequence(raw, "faults")):
        path = f"faults[{i}]"
        m = ctx.mapping(item, path, _FAULT)
        kind = m.get("kind")
        if kind not in get_args(FaultKind):
            ctx.fail(f"{path}.kind", f"{kind!r} is not one of {', '.join(get_args(FaultKind))}")
        kind = cast(FaultKind, kind)
        node_name = ctx.string(m.get("node"), f"{path}.node", required=True)
        node = nodes.get(node_name)
        if node is None:
            ctx.fail(f"{path}.node", f"no node {node_name!r} in the scenario")
        gpu: int | None = None
        if kind == "init_error":
            if "gpu" in m:
                ctx.fail(f"{path}.gpu", "init_error concerns the whole node: remove 'gpu'")
        else:
            gpu = ctx.integer(m.get("gpu"), f"{path}.gpu", minimum=0)
            if gpu >= len(node.gpus):
                ctx.fail(f"{path}.gpu", f"{node_name} has {len(node.gpus)} GPUs (0–{len(node.gpus) - 1})")
        at = ctx.duration(m.get("at", 0), f"{path}.at")
        every = ctx.duration(m["every"], f"{path}.every") if "every" in m else None
        duration = ctx.duration(m.get("duration", _DEFAULT_DURATION[kind]), f"{path}.duration")
        if every is not None and not duration < every:
            ctx.fail(f"{path}.every", f"must be longer than duration ({duration:g}s)")
        if kind != "xid" and duration <= 0:
            ctx.fail(f"{path}.duration", "must be positive")
        code = 0
        if kind == "xid":
            code = ctx.integer(m.get("code"), f"{path}.code", minimum=1)
        elif "code" in m:
            ctx.fail(f"{path}.code", "only an xid fault has a code")
        field_name = ""
        if kind == "nvml_error":
            field_name = ctx.string(m.get("field"), f"{path}.field", required=True)
            if field_name not in fields.BY_NAME:
                ctx.fail(f"{path}.field", f"{field_name!r} is not a field of exporter/fields.py")
        elif "field" in m:
            ctx.fail(f"{path}.field", "only an nvml_error fault names a field")
        block = ctx.duration(m.get("block", 0), f"{path}.block")
        out.append(Fault(kind, node_name, gpu, at, every, duration, code, field_name, block))
    return tuple(out)


_PENDING = {"namespace", "pod", "resource", "count"}
_GPU_RESOURCE = re.compile(r"nvidia\.com/(gpu|mig-[0-9]+g\.[0-9]+gb(\+me)?)")


def parse_pending(ctx: Ctx, raw: object, *, running: set[tuple[str, str]]) -> tuple[PendingPod, ...]:
    """``pending:``: pods requesting GPUs or MIG devices that no node offers (phase Pending)."""
    out: list[PendingPod] = []
    for i, item in enumerate(ctx.sequence(raw, "pending")):
        path = f"pending[{i}]"
        m = ctx.mapping(item, path, _PENDING)
        ns = ctx.string(m.get("namespace", "default"), f"{path}.namespace")
        name = ctx.string(m.get("pod"), f"{path}.pod", required=True)
        if (ns, name) in running or any((p.namespace, p.name) == (ns, name) for p in out):
            ctx.fail(f"{path}.pod", f"pod {ns}/{name} is defined twice")
        resource = ctx.string(m.get("resource"), f"{path}.resource", required=True)
        if not _GPU_RESOURCE.fullmatch(resource):
            ctx.fail(
                f"{path}.resource",
                f"{resource!r} is not nvidia.com/gpu or nvidia.com/mig-<profile> (e.g. nvidia.com/mig-1g.10gb)",
            )
        count = ctx.integer(m.get("count", 1), f"{path}.count", minimum=1, maximum=MAX_GPUS_PER_ENTRY)
        out.append(PendingPod(ns, name, resource, count))
    return tuple(out)
