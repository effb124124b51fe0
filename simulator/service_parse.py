"""Checked reading of a scenario's ``services:`` (autoscaled inference services, :mod:`simulator.service`).

The HPA's ``behavior`` is read as Kubernetes spells it (``scaleUp.stabilizationWindowSeconds``,
``policies[].periodSeconds``, …), so the block ``gpupilot-adapter recommend-hpa`` prints can be pasted
in to re-simulate a week under it. Problems are one line, ``<file>:<line>: <path>: <problem>``.
"""

from __future__ import annotations

from collections.abc import Callable

from gpupilot_common.section import Section
from hpa_controller import decide as hpa
from simulator.model import Load, Service
from simulator.service import METRICS

MAX_SERVICE_REPLICAS = 256
"""A service's ``maxReplicas``: each replica is a pod with its own series and noise."""

_SERVICE = ("namespace", "deployment", "container", "labels", "node", "startup", "load", "capacity", "hpa")
_LOAD = ("base", "peak", "peak_hour", "weekend", "bursts", "noise")
_BURSTS = ("per_day", "duration", "height")
_CAPACITY = ("requests_per_second", "max_queue", "slots")
_HPA = ("name", "min_replicas", "max_replicas", "tolerance", "metrics", "behavior")
_METRIC = ("name", "averageValue")
_BEHAVIOR = ("scaleUp", "scaleDown")
_RULES = ("stabilizationWindowSeconds", "selectPolicy", "policies", "tolerance")
_POLICY = ("type", "value", "periodSeconds")


def parse_services(top: Section, *, taken: set[tuple[str, str]]) -> tuple[Service, ...]:
    """``services:``; ``taken`` holds the workloads' (namespace, deployment) pairs."""
    out: list[Service] = []
    seen = set(taken)
    for s in top.sections("services"):
        s.keys(_SERVICE)
        namespace = s.text("namespace", "default")
        name = s.text("deployment")
        if (namespace, name) in seen:
            raise s.fail("deployment", f"{namespace}/{name} is already a deployment of the scenario")
        seen.add((namespace, name))
        load = _load(s)
        cap = s.section("capacity")
        if cap is None:
            raise s.fail("capacity", "required: requests_per_second (per ready replica) and max_queue")
        cap.keys(_CAPACITY)
        mu = cap.number("requests_per_second", minimum=1e-6, maximum=1e6)
        max_queue = cap.number("max_queue", 100.0, minimum=1.0, maximum=1e9)
        slots = cap.integer("slots", 16, minimum=1, maximum=1024)
        h = s.section("hpa")
        if h is None:
            raise s.fail(
                "hpa", "required: the HPA that scales the service (min_replicas, max_replicas, metrics)"
            )
        hpa_name, model = _hpa(h, METRICS)
        out.append(
            Service(
                namespace=namespace,
                deployment=name,
                container=s.text("container", name),
                labels=tuple(sorted((s.text_map("labels") or {"app": name}).items())),
                node=s.text("node", "gpu-pool"),
                startup=s.duration("startup", 120.0, allow_zero=True),
                load=load,
                capacity=mu,
                max_queue=max_queue,
                slots=slots,
                hpa_name=hpa_name,
                hpa=model,
            )
        )
    return tuple(out)


def _load(s: Section) -> Load:
    sec = s.section("load")
    if sec is None:
        raise s.fail("load", "required: base and peak requests per second (weekday trough and peak)")
    sec.keys(_LOAD)
    base = sec.number("base", maximum=1e9)
    peak = sec.number("peak", maximum=1e9)
    if peak < base:
        raise sec.fail("peak", f"{peak:g} is below base {base:g}")
    hour = sec.number("peak_hour", 15.0)
    if not hour < 24:
        raise sec.fail("peak_hour", "must be in [0, 24)")
    b = sec.section("bursts")
    per_day, duration, height = 0, 900.0, 0.0
    if b is not None:
        b.keys(_BURSTS)
        per_day = b.integer("per_day", 1, minimum=0, maximum=24)
        duration = b.duration("duration", 900.0)
        if duration > 6 * 3600:
            raise b.fail("duration", "at most 6h")
        height = b.number("height", maximum=100.0)
    return Load(
        base=base,
        peak=peak,
        peak_hour=hour,
        weekend=sec.number("weekend", 0.6, maximum=10.0),
        bursts_per_day=per_day,
        burst_duration=duration,
        burst_height=height,
        noise=sec.number("noise", 0.0, maximum=0.9),
    )


def _hpa(h: Section, metrics: tuple[str, ...]) -> tuple[str, hpa.HpaModel]:
    h.keys(_HPA)
    name = h.text("name")
    lo = h.integer("min_replicas", 1, minimum=1, maximum=MAX_SERVICE_REPLICAS)
    hi = h.integer("max_replicas", minimum=1, maximum=MAX_SERVICE_REPLICAS)
    if hi < lo:
        raise h.fail("max_replicas", f"{hi} is below min_replicas {lo}")
    specs: list[hpa.MetricSpec] = []
    for m in h.sections("metrics", required=True):
        m.keys(_METRIC)
        metric = m.text("name")
        if metric not in metrics:
            raise m.fail(
                "name", f"{metric!r} is not one of the service's per-pod metrics ({', '.join(metrics)})"
            )
        target = m.number("averageValue", minimum=1e-3, maximum=1e9)
        specs.append(hpa.MetricSpec("Pods", metric, "AverageValue", target))
    tolerance = h.number("tolerance", hpa.DEFAULT_TOLERANCE, maximum=1.0)
    behavior = _behavior(h.section("behavior"))
    return name, hpa.HpaModel(lo, hi, tuple(specs), behavior, tolerance=tolerance)


def _behavior(b: Section | None) -> hpa.Behavior | None:
    if b is None:
        return None
    b.keys(_BEHAVIOR)
    return hpa.Behavior(
        _rules(b.section("scaleUp"), hpa.scale_up_rules), _rules(b.section("scaleDown"), hpa.scale_down_rules)
    )


def _rules(r: Section | None, make: Callable[..., hpa.Rules]) -> hpa.Rules:
    if r is None:
        return make()
    r.keys(_RULES)
    select = r.optional_text("selectPolicy")
    if select is not None and select not in ("Max", "Min", "Disabled"):
        raise r.fail("selectPolicy", f"{select!r} is not Max, Min or Disabled")
    policies = []
    for p in r.sections("policies"):
        p.keys(_POLICY)
        kind = p.text("type")
        if kind not in ("Pods", "Percent"):
            raise p.fail("type", f"{kind!r} is not Pods or Percent")
        policies.append(
            hpa.Policy(
                kind, p.integer("value", minimum=1), p.integer("periodSeconds", minimum=1, maximum=1800)
            )
        )
    return make(
        stabilization_seconds=r.integer("stabilizationWindowSeconds", None, minimum=0, maximum=3600),
        select_policy=select,
        policies=tuple(policies) or None,
        tolerance=r.number("tolerance", None, maximum=1.0),
    )
