"""Prometheus history → per-device and per-workload usage.

Every number is aggregated on the server (``quantile_over_time``, ``max_over_time``,
``count_over_time`` and hourly subqueries), one instant query per statistic, so what is pulled
grows with the number of devices, never with the number of samples or hours. The whole window is
asked at once (a VictoriaMetrics or Prometheus block holds days of samples: asking day by day reads
each block once per day); a large fleet's queries are cut into node groups under the engine's limits
(:mod:`rightsizer.clients.chunks`), and every answer is folded at once into one summary per device
(memory grows with the devices, not with the groups, hours or samples):

* max and peak framebuffer: max (exact);
* idle hours, hours with data, allocated hours: counts of hourly subquery points (hours are aligned
  to the hour, as Prometheus aligns subquery steps);
* p50/p95: the window's quantiles (shown for information; sizing does not use them);
* **the sizing statistic**: the peak over the whole window of the ``min_busy`` (default 15-minute)
  rolling mean activity, and the hour it happened. The rolling mean is evaluated every
  :func:`subquery_step` seconds (60 s, or the samples' interval when they are sparser: a mean's
  window then changes only when a sample enters or leaves it, so every distinct window is still
  seen); an hour's peak ``H`` is the highest of the means in it (``max_over_time(F[1h:step])``),
  the window's peak the highest ``H``, found by the server along with its first hour (one
  ``max_over_time`` of ``H`` encoded with its hour, :func:`peak_hour_query`), so it does not depend on
  where the window is cut: a job busy for ``min_busy`` minutes once in the window is sized for that
  burst whether the window ends just after it or days later. An hour counts as idle only when its
  ``H`` is under the idle threshold, so a burst hour is never idle.

The recording rule ``gpupilot:slice_activity:avg5m`` is used (5-minute means) from the first day
whose first hour it covers — a rule deployed mid-window serves only the days it covers; before it,
the raw series the rule is built from: ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` for MIG instances and
``DCGM_FI_DEV_GPU_UTIL / 100`` for whole GPUs. Series are identified by Hostname + gpu + UUID +
GPU_I_ID + GPU_I_PROFILE, so exporter restarts and gaps join up, and an instance id reused by another
profile after a layout change stays apart. An hour without samples is *unknown*, never idle.

Several clusters in one store (a Thanos or VictoriaMetrics global view, each cluster's series with an
external ``cluster`` label): every grouping keeps the cluster label too (``settings.cluster_label``),
so the same node name in two clusters never merges; series without it form one unnamed cluster ``""``,
and the queries are then exactly the single-cluster ones (grouping by an absent label is a no-op).
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from gpupilot_common.timefmt import format_time
from mig_geometry.catalogue import GpuModel, by_device_id
from mig_geometry.names import canonical_profile
from rightsizer.analysis import labels as labels_mod
from rightsizer.analysis.types import (
    Analysis,
    DeviceStats,
    GpuInventory,
    InstanceInfo,
    NodeInventory,
    PodKey,
    Workload,
)
from rightsizer.clients.chunks import QueryLimits, by_pod_name, fleet_groups, samples_per_hour, scoped
from rightsizer.clients.prometheus import PrometheusClient, Sample

log = logging.getLogger(__name__)
IDENT = ("Hostname", "gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE")
BY = "Hostname, gpu, UUID, GPU_I_PROFILE, GPU_I_ID"
RULE = "gpupilot:slice_activity:avg5m"
INST = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!=""}'
WHOLE = "DCGM_FI_DEV_GPU_UTIL"
CLUSTER = "cluster"
"""The default cluster label, as Thanos' and VictoriaMetrics' multi-cluster setups name it."""


def _blind(cluster_label: str) -> str:
    """Nodes whose exporter could not see other containers' processes at some point of the hour."""
    return (
        f"(min by ({cluster_label}, Hostname) (min_over_time(gpupilot_exporter_process_visibility[1h])) == 0)"
    )


Progress = Callable[[str], None]
MAX_INSTANCES = 7
"""MIG instances a GPU holds at most (seven 1g slices): the series per GPU before they are counted."""
PROGRESS_EVERY_S = 5.0
"""At most one progress line per this many seconds while node groups are queried."""


@dataclass(frozen=True)
class AnalysisSettings:
    window_s: float = 7 * 86400.0
    """How far back to look (default 7 days: one weekly cycle of traffic)."""
    chunk_s: float = 0.0
    """Queries cover at most this much history each; 0: the whole window at once (node groups keep
    each query under the engine's limits; asking a day at a time reads every storage block once per
    day and made a 14-day plan ten times slower)."""
    idle_threshold: float = 0.05
    """An hour counts as idle when no ``min_busy``-minute mean in it reaches this ratio (5 %: noise)."""
    headroom: float = 0.2
    """Demand is the peak ``min_busy``-minute mean activity and peak memory times (1 + headroom)."""
    min_busy_s: float = 900.0
    """Length of the rolling mean that sizes a device (15 min): a burst this long is never missed."""
    inventory_lookback_s: float = 900.0
    """Info series older than this before the end of the window are ignored (15 min)."""
    limits: QueryLimits = field(default_factory=QueryLimits)
    """What one query may cost: a large fleet's queries are cut into node groups under it."""
    cluster_label: str = CLUSTER
    """Label naming a series' cluster in a multi-cluster store; series without it: one unnamed cluster."""


def _ident(labels: Mapping[str, str], cluster_label: str) -> Ident:
    get = labels.get
    return Ident(
        get(cluster_label, ""), get("Hostname", ""), get("gpu", ""), get("UUID", ""), get("GPU_I_ID", ""),
        get("GPU_I_PROFILE", ""),
    )  # fmt: skip


def _rolling_mean(*, rule: bool, busy_s: float, cluster_label: str = CLUSTER) -> str:
    """The ``busy_s``-second rolling mean activity (0-1) of every device.

    From the 5-minute recording rule, the mean of its values over the last ``busy_s - 5 min`` spans
    ``busy_s`` of raw samples; from the raw series, the mean of their samples over ``busy_s``.
    The raw window is 1 ms shorter, so a sample exactly ``busy_s`` old is out of it on every engine
    (Prometheus 2 closes ranges at their start; 3 and VictoriaMetrics leave them open): a mean
    evaluated on the samples' own grid (evenly spaced history, :func:`subquery_step`) is the mean of
    the samples of the last ``busy_s`` everywhere, never of one more."""
    by = f"{cluster_label}, {BY}"
    if rule:
        return f"max by ({by}) (avg_over_time({RULE}[{max(60, round(busy_s - 300))}s]))"
    rng = f"{max(60, round(busy_s)) * 1000 - 1}ms"
    return (
        f"max by ({by}) (avg_over_time({INST}[{rng}])) or max by ({by}) (avg_over_time({WHOLE}[{rng}])) / 100"
    )


def subquery_step(busy_s: float, interval_s: float | None = None) -> int:
    """Seconds between the rolling means an hour's peak is taken from.

    60 s (or a third of ``busy_s`` when shorter) for samples that close; for sparser samples (a
    downsampled long-term store, a 5-minute scrape), the largest step dividing the mean's length,
    the samples' interval and the hour. A ``busy_s`` mean over samples ``interval_s`` apart changes
    only when a sample enters or leaves it, and with all three multiples of the step those changes
    fall one step or more apart, so stepping by it still sees every distinct mean (exact for evenly
    spaced samples) at a fraction of the cost: 15× fewer evaluations for 15-minute samples."""
    base = max(1, min(60, round(busy_s / 3)))
    if interval_s is None or not math.isfinite(interval_s) or round(interval_s) <= base:
        return base
    return max(base, math.gcd(math.gcd(max(60, round(busy_s)), round(interval_s)), 3600))


def hourly_peak_query(
    *, rule: bool, busy_s: float, cluster_label: str = CLUSTER, step_s: int | None = None
) -> str:
    """Per device, the highest ``busy_s`` rolling mean in the hour ending at the evaluation time.

    With a step coarser than the default (:func:`subquery_step`) the hour reaches back to its first
    instant, so the mean current when the hour starts counts in it, as it does with 60-second steps."""
    default = subquery_step(busy_s)
    step = step_s or default
    span = 3600 if step == default else 3601
    mean = _rolling_mean(rule=rule, busy_s=busy_s, cluster_label=cluster_label)
    return f"max by ({cluster_label}, {BY}) (max_over_time(({mean})[{span}s:{step}s]))"


HOUR_CODE = 65536
"""Hours a window may span for :func:`peak_hour_query` (2¹⁶: 7 years; ``--window`` is at most 366 days)."""
PEAK_GRAIN = 2**20
"""Resolution of the peak in :func:`peak_hour_query`'s ordering (about 10⁻⁶ of a GPU)."""


def peak_hour_query(hourly: str, *, sub: str, origin: float) -> str:
    """Per device, the window's highest hourly peak and its first hour in one number: the peak
    (0–1, to :data:`PEAK_GRAIN`) times :data:`HOUR_CODE`, plus the hours from the hour ending at
    ``origin`` (aligned to the hour) counted down from ``HOUR_CODE - 1``, so the largest value is
    the highest peak's earliest hour (see :func:`decode_peak_hour`). One server-side pass instead of
    the window's hourly points (a 10,000-node fleet's 14 days: 64 M points to parse)."""
    hour = f"({HOUR_CODE - 1} - (time() - {origin:.0f}) / 3600)"
    enc = f"floor(clamp_min(clamp_max({hourly}, 1), 0) * {PEAK_GRAIN}) * {HOUR_CODE} + {hour}"
    return f"max_over_time(({enc})[{sub}:1h])"


def decode_peak_hour(value: float, origin: float) -> float:
    """The end (Unix seconds) of the hour :func:`peak_hour_query` encoded in ``value`` (finite:
    :func:`_fold` leaves NaN and ±Inf out)."""
    return origin + (HOUR_CODE - 1 - int(value) % HOUR_CODE) * 3600.0


def _window_queries(hourly: str, *, sub: str, origin: float, threshold: float) -> dict[str, str]:
    """The sizing statistic's instant queries over ``sub`` (the chunk less 1 s): highest hourly peak,
    its hour (encoded), and the idle hours (hourly peak under ``threshold``)."""
    return {
        "peak": f"max_over_time(({hourly})[{sub}:1h])",
        "peak_hour": peak_hour_query(hourly, sub=sub, origin=origin),
        "idle_hours": f"count_over_time(({hourly} < {threshold!r})[{sub}:1h])",
    }


def _activity_queries(*, rule: bool, rng: str, sub: str, cluster_label: str = CLUSTER) -> dict[str, str]:
    """Instant queries per statistic for one chunk; ``sub`` is the chunk length less 1 s, so an hourly
    subquery yields exactly one point per hour of the chunk (its range is closed at both ends)."""
    by, blind, on = f"{cluster_label}, {BY}", _blind(cluster_label), f"{cluster_label}, Hostname"

    def q(fn: str, arg: str = "") -> str:
        if rule:
            return f"max by ({by}) ({fn}({arg}{RULE}[{rng}]))"
        return f"max by ({by}) ({fn}({arg}{INST}[{rng}])) or max by ({by}) ({fn}({arg}{WHOLE}[{rng}])) / 100"

    def hourly(fn: str) -> str:
        if rule:
            return f"max by ({by}) ({fn}({RULE}[1h]))"
        return f"(max by ({by}) ({fn}({INST}[1h])) or max by ({by}) ({fn}({WHOLE}[1h])))"

    return {
        "p50": q("quantile_over_time", "0.5, "),
        "p95": q("quantile_over_time", "0.95, "),
        "max": q("max_over_time"),
        "coverage_hours": f"count_over_time({hourly('count_over_time')}[{sub}:1h])",
        "fb_peak_mib": f"max by ({by}) (max_over_time(DCGM_FI_DEV_FB_USED[{rng}]))",
        # Without profiling metrics (Ampere MIG instances have no GPM), an hour in which the device
        # ran no compute process is still an idle hour; activity stays unknown. Hours in which the node's
        # exporter could not see other containers' processes (visibility 0) are not counted at all.
        "proc_idle_hours": (
            f"count_over_time(((max by ({by}) (max_over_time(gpupilot_device_compute_processes[1h])) == 0)"
            f" unless on ({on}) {blind})[{sub}:1h])"
        ),
        "proc_coverage_hours": (
            f"count_over_time((max by ({by}) (count_over_time(gpupilot_device_compute_processes[1h]))"
            f" unless on ({on}) {blind})[{sub}:1h])"
        ),
        "allocated_hours": (
            f"count_over_time((max by ({by}) (max_over_time(gpupilot_device_pod_info[1h])))[{sub}:1h])"
        ),
    }


def chunks(start: float, end: float, size: float) -> list[tuple[float, float]]:
    """``(start, end]`` cut into pieces of at most ``size`` seconds (0: one piece), newest last."""
    if size <= 0:
        return [(start, end)] if end > start else []
    out = []
    t = end
    while t > start + 1e-6:
        lo = max(start, t - size)
        out.append((lo, t))
        t = lo
    return out[::-1]


MAXED = ("p50", "p95", "max", "fb_peak_mib", "peak", "peak_hour")
"""Per-chunk statistics combined by their maximum; every other one (hours) is summed."""


class Ident(NamedTuple):
    """A series' device identity (see the module docstring); ``profile`` last, as the driver spells it."""

    cluster: str
    node: str
    gpu: str
    uuid: str
    gpu_instance_id: str
    profile: str

    @property
    def device(self) -> DeviceKey:
        return DeviceKey(self.cluster, self.node, self.gpu, self.uuid, self.gpu_instance_id)


class DeviceKey(NamedTuple):
    """A device's identity without its profile's spelling (``3g.39gb`` and ``3g.40gb`` alike)."""

    cluster: str
    node: str
    gpu: str
    uuid: str
    gpu_instance_id: str


"""A device's identity: the cluster label's value, then :data:`IDENT`'s labels."""


@dataclass
class WindowStats:
    """Per device identity, the window's statistics folded piece by piece (bounded by the number of
    devices, never by the number of pieces, groups or samples)."""

    stats: dict[Ident, dict[str, float]]
    rule_s: float
    """Seconds of the window answered from the recording rule."""
    groups: int = 1
    """Node groups each piece was cut into (1: whole-fleet queries)."""

    @property
    def rule_used(self) -> bool:
        return self.rule_s > 0


def _fold(
    into: dict[Ident, dict[str, float]], samples: Iterable[Sample], column: str, cluster_label: str
) -> None:
    summed = column not in MAXED
    for s in samples:
        if not math.isfinite(s.value):  # NaN/±Inf (a division by zero upstream): no statistic
            continue
        row = into.setdefault(_ident(s.labels, cluster_label), {})
        old = row.get(column)
        if old is None:
            row[column] = s.value
        elif summed:
            row[column] = old + s.value
        elif s.value > old:
            row[column] = s.value


def window_stats(
    client: PrometheusClient,
    *,
    start: float,
    end: float,
    settings: AnalysisSettings,
    progress: Progress = lambda _m: None,
    groups: Sequence[tuple[str, ...] | None] = (None,),
    named_clusters: bool = False,
    probe_nodes: Sequence[str] = (),
) -> WindowStats:
    """Per device identity (cluster first): p50/p95/max, peak rolling mean and its time, fb peak, hours.
    Each piece of the window (:func:`rule_pieces`) is asked once per node group
    (:func:`rightsizer.clients.chunks.node_groups`) and the answers are folded into one summary per
    device as they arrive. A node group names nodes by ``Hostname`` only, so in a multi-cluster store
    it selects that name in every cluster; the answers stay apart because every query groups by the
    cluster label too and the summaries are keyed by it.

    ``named_clusters``: the inventory's series carry the cluster label; the recording rule then serves
    only where its own series carry it too (one rule evaluated over several clusters' series in one
    store would have merged their devices), else the raw series are read. ``probe_nodes``: nodes whose
    raw series are asked for their sampling interval (all of them when empty: a small fleet)."""
    label = settings.cluster_label
    stats: dict[Ident, dict[str, float]] = {}
    pieces = rule_pieces(client, start=start, end=end, settings=settings, named_clusters=named_clusters)
    rule_step = raw_step = subquery_step(settings.min_busy_s)
    if any(not rule for _lo, _hi, rule in pieces):
        per_hour = samples_per_hour(client, probe_nodes or None, end)
        raw_step = subquery_step(settings.min_busy_s, 3600.0 / per_hour if per_hour > 0 else None)
    origin = start - start % 3600.0
    started = shown = time.monotonic()
    total = len(pieces) * len(groups)
    for i, (lo, hi, rule) in enumerate(pieces, 1):
        step = rule_step if rule else raw_step
        progress(
            f"querying {(hi - lo) / 86400:.3g} day(s) of history ending {format_time(hi)}"
            + (f" (part {i}/{len(pieces)})" if len(pieces) > 1 else "")
            + (" from the recording rule" if rule else f", rolling means every {step} s")
            + (f" in {len(groups)} node groups" if len(groups) > 1 else "")
        )
        queries = _piece_queries(lo, hi, rule=rule, step=step, origin=origin, settings=settings)
        ask = partial(_group_answers, client, queries, at=hi)
        with ThreadPoolExecutor(max_workers=max(1, min(settings.limits.concurrency, len(groups)))) as pool:
            # answers folded in group order (map keeps it), piece after piece: the same summaries
            # whatever the concurrency
            for g, answers in enumerate(pool.map(ask, groups), 1):
                for column, samples in answers:
                    _fold(stats, samples, column, label)
                now = time.monotonic()
                if len(groups) > 1 and (
                    now - shown >= PROGRESS_EVERY_S or (i, g) == (len(pieces), len(groups))
                ):
                    shown = now
                    done = (i - 1) * len(groups) + g
                    left = (now - started) / done * (total - done)
                    progress(
                        f"{done}/{total} node group queries answered, {now - started:.0f} s, about {left:.0f} s left"
                    )
    for row in stats.values():
        code = row.pop("peak_hour", None)
        if code is not None and "peak" in row:
            row["peak_at"] = decode_peak_hour(code, origin) - 3600.0
    rule_s = sum(hi - lo for lo, hi, rule in pieces if rule)
    return WindowStats(stats, rule_s, len(groups))


def rule_pieces(
    client: PrometheusClient,
    *,
    start: float,
    end: float,
    settings: AnalysisSettings,
    named_clusters: bool = False,
) -> list[tuple[float, float, bool]]:
    """``(start, end]`` as pieces of at most ``settings.chunk_s`` (0: the whole window), each with
    whether the recording rule answers it: from the first day whose first hour the rule covers (a
    rule deployed mid-window serves the days since), else nowhere. One cheap probe when the rule
    covers the window's first hour, one per day otherwise."""
    probe = f'{RULE}{{{settings.cluster_label}!=""}}' if named_clusters else RULE
    since = None
    for lo, hi in chunks(start, end, 86400.0):
        if client.has_data(probe, start=lo, end=min(hi, lo + 3600)):
            since = lo
            break
    if since is None:
        return [(lo, hi, False) for lo, hi in chunks(start, end, settings.chunk_s)]
    return [(lo, hi, False) for lo, hi in chunks(start, since, settings.chunk_s)] + [
        (lo, hi, True) for lo, hi in chunks(since, end, settings.chunk_s)
    ]


def _piece_queries(
    lo: float, hi: float, *, rule: bool, step: int, origin: float, settings: AnalysisSettings
) -> list[tuple[str, str]]:
    """(column, instant query at ``hi``) for the piece ``(lo, hi]``."""
    seconds = max(2, round(hi - lo))
    rng, sub = f"{seconds}s", f"{seconds - 1}s"
    label = settings.cluster_label
    hourly = hourly_peak_query(rule=rule, busy_s=settings.min_busy_s, cluster_label=label, step_s=step)
    return [
        *_activity_queries(rule=rule, rng=rng, sub=sub, cluster_label=label).items(),
        *_window_queries(hourly, sub=sub, origin=origin, threshold=settings.idle_threshold).items(),
    ]


def _group_answers(
    client: PrometheusClient, queries: Sequence[tuple[str, str]], nodes: tuple[str, ...] | None, *, at: float
) -> list[tuple[str, list[Sample]]]:
    """One node group's answers to ``queries`` (scoped to ``nodes``), evaluated at ``at``."""
    return [(column, client.instant(scoped(query, nodes), at)) for column, query in queries]


# ---------------------------------------------------------------------------------------------- inventory


def inventory(
    client: PrometheusClient,
    *,
    at: float,
    lookback_s: float,
    limits: QueryLimits | None = None,
    cluster_label: str = CLUSTER,
    skipped: list[str] | None = None,
) -> tuple[list[NodeInventory], dict[tuple[str, str, str, str], tuple[PodKey, ...]]]:
    """Nodes and GPUs from the exporter's info series at ``at`` (sorted by cluster, then name);
    current (cluster, node, GPU UUID, GI id) → pods.

    A node with a series whose label is not the number it should be (``placement_start="x"``,
    ``memory_total_mib="inf"``) is left out, with one line in ``skipped`` naming the node, the series
    and the label: its layout cannot be known, the rest of the fleet is planned.

    ``gpupilot_gpu_info`` (one series per GPU) is asked for the whole fleet; the per-instance and
    per-pod series are asked per node group when the fleet, at up to 7 MIG instances per GPU, would
    exceed ``limits``. A node name's cost counts its GPUs in every cluster (its ``Hostname`` matcher
    selects them all); the answers are keyed by cluster and name.

    Duplicate series (one GPU or MIG instance exported twice: two scrape jobs, a changed ``instance``
    label within the lookback) count once — the first in label order — so the work is linear in the
    series returned (90,000 copies of one GPU's series, 810,000 with its instances and pods: about
    1.5 s; before, each copy re-read every copy of its instances)."""
    lb = f"{max(1, round(lookback_s))}s"

    def where(s: Sample) -> tuple[str, str]:
        return s.labels.get(cluster_label, ""), s.labels.get("Hostname", "")

    gpus = _first_of_each(
        client.instant(f"last_over_time(gpupilot_gpu_info[{lb}])", at),
        lambda s: (*where(s), s.labels.get("UUID", "")),
        ("gpu", "pci_device_id", "mig_mode", "memory_total_mib"),
    )
    per_node: dict[str, int] = {}
    for s in gpus:
        host = s.labels.get("Hostname", "")
        per_node[host] = per_node.get(host, 0) + MAX_INSTANCES
    groups = fleet_groups(
        client, per_node, limits=limits or QueryLimits(), span_s=lookback_s, at=at, selectors=1
    )
    insts: list[Sample] = []
    pods: list[Sample] = []
    for part in groups:
        insts += client.instant(scoped(f"last_over_time(gpupilot_mig_instance_info[{lb}])", part), at)
        pods += client.instant(scoped(f"last_over_time(gpupilot_device_pod_info[{lb}])", part), at)
    labels = client.instant(f"last_over_time(kube_node_labels[{lb}])", at)
    insts = _first_of_each(
        insts,
        lambda s: (*where(s), s.labels.get("UUID", ""), s.labels.get("GPU_I_ID", "")),
        ("GPU_I_PROFILE", "placement_start", "placement_size", "mig_uuid"),
    )

    bad: dict[tuple[str, str], str] = {}

    def malformed(s: Sample, series: str, exc: labels_mod.MalformedLabel) -> None:
        node = where(s)
        if node not in bad:
            bad[node] = f"its {series} series (GPU {s.labels.get('UUID', '?')}) has {exc}"

    by_gpu: dict[tuple[str, str, str], list[InstanceInfo]] = {}
    for s in insts:
        key = (*where(s), s.labels.get("UUID", ""))
        try:
            info = InstanceInfo(
                profile=s.labels.get("GPU_I_PROFILE", ""),
                gpu_instance_id=s.labels.get("GPU_I_ID", ""),
                placement_start=labels_mod.whole(s.labels, "placement_start", default=0, high=64),
                placement_size=labels_mod.whole(s.labels, "placement_size", default=0, high=64),
                uuid=s.labels.get("mig_uuid", ""),
            )
        except labels_mod.MalformedLabel as exc:
            malformed(s, "gpupilot_mig_instance_info", exc)
            continue
        by_gpu.setdefault(key, []).append(info)
    node_gpus: dict[tuple[str, str], dict[str, GpuInventory]] = {}
    for s in gpus:
        cluster, host = where(s)
        uuid = s.labels.get("UUID", "")
        try:
            index = labels_mod.whole(s.labels, "gpu", default=0, high=4096)
            memory = int(labels_mod.amount(s.labels, "memory_total_mib", default=0.0, high=2.0**40))
        except labels_mod.MalformedLabel as exc:
            malformed(s, "gpupilot_gpu_info", exc)
            continue
        try:
            device_id = int(s.labels.get("pci_device_id", "0"), 16)
        except ValueError:
            device_id = 0
        model = by_device_id(device_id)
        mig = s.labels.get("mig_mode") == "enabled"
        instances = tuple(
            sorted(
                by_gpu.get((cluster, host, uuid), []), key=lambda i: (i.placement_start, i.gpu_instance_id)
            )
        )
        if model is not None:
            instances = tuple(_canonical(model, i) for i in instances)
        node_gpus.setdefault((cluster, host), {})[uuid] = GpuInventory(
            node=host,
            index=index,
            uuid=uuid,
            model_key=model.key if model else "",
            pci_device_id=device_id,
            mig_enabled=mig,
            memory_total_mib=memory,
            instances=instances if mig else (),
        )
    for (cluster, host), why in sorted(bad.items()):
        node_gpus.pop((cluster, host), None)
        shown = f"{host} (cluster {cluster})" if cluster else host
        line = f"node {shown} left out of the plan: {why}"
        log.warning("%s", line)
        if skipped is not None:
            skipped.append(line)
    node_labels = {(s.labels.get(cluster_label, ""), s.labels.get("node", "")): s.labels for s in labels}
    nodes = []
    for cluster, host in sorted(node_gpus):
        lab = node_labels.get((cluster, host), {})
        nodes.append(
            NodeInventory(
                name=host,
                gpus=tuple(sorted(node_gpus[cluster, host].values(), key=lambda g: g.index)),
                mig_strategy=lab.get("label_nvidia_com_mig_strategy", "") or "mixed",
                mig_strategy_known=bool(lab.get("label_nvidia_com_mig_strategy")),
                mig_config=lab.get("label_nvidia_com_mig_config", ""),
                cluster=cluster,
            )
        )
    holders: dict[tuple[str, str, str, str], set[PodKey]] = {}
    for s in pods:
        hkey = (*where(s), s.labels.get("UUID", ""), s.labels.get("GPU_I_ID", ""))
        holders.setdefault(hkey, set()).add(PodKey(s.labels.get("namespace", ""), s.labels.get("pod", "")))
    return nodes, {k: tuple(sorted(v, key=str)) for k, v in holders.items()}


def _first_of_each(
    samples: Sequence[Sample], key: Callable[[Sample], tuple[str, ...]], fields: tuple[str, ...]
) -> list[Sample]:
    """One sample per ``key``: of duplicates, the one whose ``fields`` (the labels read from it) come
    first in sort order, so the choice does not depend on the answer's order. One pass."""
    first: dict[tuple[str, ...], tuple[tuple[str, ...], Sample]] = {}
    for s in samples:
        k = key(s)
        rank = tuple(s.labels.get(f, "") for f in fields)
        seen = first.get(k)
        if seen is None or rank < seen[0]:
            first[k] = (rank, s)
    return [s for _rank, s in first.values()]


def _canonical(model: GpuModel, inst: InstanceInfo) -> InstanceInfo:
    prof = canonical_profile(model, inst.profile)
    if prof is None or prof.name == inst.profile:
        return inst
    return InstanceInfo(prof.name, inst.gpu_instance_id, inst.placement_start, inst.placement_size, inst.uuid)


def owners(
    client: PrometheusClient, *, start: float, end: float, cluster_label: str = CLUSTER
) -> dict[tuple[str, PodKey], str]:
    """(cluster, pod) → workload key from ``kube_pod_owner`` (ReplicaSet → its Deployment) or
    ``kube_pod_labels``."""
    span = f"{max(1, round(end - start))}s"
    out: dict[tuple[str, PodKey], str] = {}
    # One series per pod: a fleet's pods may be more than one answer may hold, so asked in parts then.
    for s in by_pod_name(client, lambda m: f"last_over_time(kube_pod_labels{{{m}}}[{span}])", end):
        app = s.labels.get("label_app_kubernetes_io_name") or s.labels.get("label_app")
        if app:
            ns = s.labels.get("namespace", "")
            out[s.labels.get(cluster_label, ""), PodKey(ns, s.labels.get("pod", ""))] = f"{ns}/app/{app}"
    for s in by_pod_name(client, lambda m: f"last_over_time(kube_pod_owner{{{m}}}[{span}])", end):
        ns, kind, name = (
            s.labels.get("namespace", ""),
            s.labels.get("owner_kind", ""),
            s.labels.get("owner_name", ""),
        )
        if not kind or kind == "<none>" or not name:
            continue
        if kind == "ReplicaSet":
            kind, name = "Deployment", re.sub(r"-[a-z0-9]+$", "", name)
        out[s.labels.get(cluster_label, ""), PodKey(ns, s.labels.get("pod", ""))] = f"{ns}/{kind}/{name}"
    return out


# ---------------------------------------------------------------------------------------------- top level


def _probe_nodes(names: Sequence[str]) -> tuple[str, ...]:
    """A few nodes spread over the fleet, asked for their series' sampling interval."""
    if len(names) <= 3:
        return tuple(names)
    return (names[0], names[len(names) // 2], names[-1])


def _opt(row: dict[str, float], key: str) -> float | None:
    value = row.get(key)
    if value is None:
        return None
    f = float(value)
    return None if math.isnan(f) else f


def analyse(
    client: PrometheusClient,
    *,
    end: float,
    settings: AnalysisSettings,
    progress: Progress = lambda _m: None,
) -> Analysis:
    """Inventory at ``end``, device statistics over the window, and per-workload demand."""
    start = end - settings.window_s
    progress(f"reading inventory from {client.url} at {format_time(end)}")
    label = settings.cluster_label
    skipped: list[str] = []
    nodes, holders = inventory(
        client,
        at=end,
        lookback_s=settings.inventory_lookback_s,
        limits=settings.limits,
        cluster_label=label,
        skipped=skipped,
    )
    for line in skipped:
        progress(line)
    per_name = _devices_per_name(nodes)
    span = settings.chunk_s if 0 < settings.chunk_s < settings.window_s else settings.window_s
    groups = fleet_groups(client, per_name, limits=settings.limits, span_s=span, at=end)
    summary = window_stats(
        client,
        start=start,
        end=end,
        settings=settings,
        progress=progress,
        groups=groups,
        named_clusters=any(n.cluster for n in nodes),
        probe_nodes=_probe_nodes(sorted(per_name)) if groups != [None] else (),
    )
    rows = _Rows(summary.stats)
    devices = [
        _device_stats(node, gpu, target, rows=rows, holders=holders, settings=settings)
        for node in nodes
        for gpu in node.gpus
        for target in _targets(gpu)
    ]
    progress(f"reading pod owners ({sum(1 for d, _ in devices if d.pods)} allocated devices)")
    owner_of = owners(client, start=start, end=end, cluster_label=label)
    stats = [d for d, _ in devices]
    proc_only = [d.cluster for d, from_processes in devices if from_processes]
    notes, cluster_notes = _all_notes(
        nodes, stats, proc_only, rule_s=summary.rule_s, window_s=settings.window_s
    )
    notes = (*skipped, *notes)
    return Analysis(
        start=start,
        end=end,
        prometheus_url=client.url,
        nodes=tuple(nodes),
        devices=tuple(stats),
        workloads=tuple(_workloads(nodes, stats, owner_of, headroom=settings.headroom)),
        used_recording_rule=summary.rule_used,
        notes=notes,
        cluster_notes=cluster_notes,
    )


def _devices_per_name(nodes: Sequence[NodeInventory]) -> dict[str, int]:
    """Devices per node name: node groups select by name, so a name's cost counts its devices in every
    cluster (answers stay apart by the cluster label every query groups by)."""
    per_name: dict[str, int] = {}
    for n in nodes:
        per_name[n.name] = per_name.get(n.name, 0) + sum(
            len(g.instances) if g.mig_enabled else 1 for g in n.gpus
        )
    return per_name


def _targets(gpu: GpuInventory) -> list[tuple[str, str]]:
    """(profile, GPU instance id) of every device of ``gpu``: its instances, or the whole GPU."""
    return [(i.profile, i.gpu_instance_id) for i in gpu.instances] if gpu.mig_enabled else [("", "")]


class _Rows:
    """The window's statistics by series identity, and by device for profiles spelled differently."""

    def __init__(self, stats: dict[Ident, dict[str, float]]) -> None:
        self.by_ident = stats
        self.by_device: dict[DeviceKey, list[tuple[str, dict[str, float]]]] = {}
        for ident, row in stats.items():
            self.by_device.setdefault(ident.device, []).append((ident.profile, row))

    def find(self, ident: Ident, model: GpuModel | None) -> dict[str, float]:
        row = self.by_ident.get(ident)
        if row is None and model is not None and ident.profile:
            # The driver may spell the profile differently (3g.39gb) than the catalogue.
            row = next(
                (
                    r
                    for spelled, r in self.by_device.get(ident.device, ())
                    if (p := canonical_profile(model, spelled)) is not None and p.name == ident.profile
                ),
                None,
            )
        return row or {}


def _device_stats(
    node: NodeInventory,
    gpu: GpuInventory,
    target: tuple[str, str],
    *,
    rows: _Rows,
    holders: dict[tuple[str, str, str, str], tuple[PodKey, ...]],
    settings: AnalysisSettings,
) -> tuple[DeviceStats, bool]:
    """One device's statistics, and whether its idle hours come from compute processes alone."""
    profile, gi = target
    r = rows.find(Ident(node.cluster, node.name, str(gpu.index), gpu.uuid, gi, profile), gpu.model)
    coverage = _opt(r, "coverage_hours") or 0.0
    from_processes = not coverage and (_opt(r, "proc_coverage_hours") or 0.0) > 0
    if from_processes:
        idle, covered = _opt(r, "proc_idle_hours") or 0.0, _opt(r, "proc_coverage_hours") or 0.0
    else:
        idle, covered = _opt(r, "idle_hours") or 0.0, coverage
    known = bool(coverage)
    stats = DeviceStats(
        node=node.name,
        gpu=gpu.index,
        gpu_uuid=gpu.uuid,
        profile=profile,
        gpu_instance_id=gi,
        pods=holders.get((node.cluster, node.name, gpu.uuid, gi), ()),
        allocated_hours=_opt(r, "allocated_hours") or 0.0,
        p50=_opt(r, "p50") if known else None,
        p95=_opt(r, "p95") if known else None,
        max=_opt(r, "max") if known else None,
        fb_peak_mib=_opt(r, "fb_peak_mib"),
        idle_hours=min(idle, covered),
        coverage_hours=covered,
        window_hours=settings.window_s / 3600.0,
        peak=_opt(r, "peak") if known else None,
        peak_at=_opt(r, "peak_at") if known else None,
        busy_minutes=settings.min_busy_s / 60.0,
        cluster=node.cluster,
    )
    return stats, from_processes


def _workloads(
    nodes: Sequence[NodeInventory],
    devices: Sequence[DeviceStats],
    owner_of: dict[tuple[str, PodKey], str],
    *,
    headroom: float,
) -> list[Workload]:
    """Workloads of each cluster on their own (a pod's owner key is unique within its cluster only)."""
    return [
        w
        for cluster in sorted({n.cluster for n in nodes})
        for w in build_workloads(
            [n for n in nodes if n.cluster == cluster],
            [d for d in devices if d.cluster == cluster],
            {pod: key for (c, pod), key in owner_of.items() if c == cluster},
            headroom=headroom,
            cluster=cluster,
        )
    ]


def _all_notes(
    nodes: Sequence[NodeInventory],
    devices: Sequence[DeviceStats],
    proc_only: Sequence[str],
    *,
    rule_s: float,
    window_s: float,
) -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    """The fleet's notes, and each cluster's own when there are several."""
    rule_days, days = rule_s / 86400.0, window_s / 86400.0
    notes = _notes(devices, len(proc_only), rule_days=rule_days, days=days)
    clusters = sorted({n.cluster for n in nodes})
    if len(clusters) < 2:
        return notes, {}
    return notes, {
        c: _notes(
            [d for d in devices if d.cluster == c], list(proc_only).count(c), rule_days=rule_days, days=days
        )
        for c in clusters
    }


def _notes(
    devices: Sequence[DeviceStats], proc_only: int, *, rule_days: float, days: float
) -> tuple[str, ...]:
    notes = []
    if rule_days < days - 1e-6:
        notes.append(
            f"{RULE} covered {rule_days:.3g} of {days:.3g} day(s) of the window; raw DCGM series used for the rest"
        )
    if proc_only:
        notes.append(
            f"{proc_only} device(s) without profiling metrics: idle hours from compute processes, activity unknown"
        )
    unknown = sum(1 for d in devices if d.unknown)
    if unknown:
        notes.append(f"{unknown} device(s) without activity data in the window are 'unknown', not idle")
    return tuple(notes)


def build_workloads(
    nodes: Iterable[NodeInventory],
    devices: Iterable[DeviceStats],
    owner_of: dict[PodKey, str],
    *,
    headroom: float,
    cluster: str = "",
) -> list[Workload]:
    """Group allocated devices (of one cluster) by their pods' owner; demand per replica from the worst
    replica: its peak rolling-mean activity × its compute slices × (1 + headroom), and peak memory × the same."""
    gpu_model = {(g.node, g.index): g.model for n in nodes for g in n.gpus}
    groups: dict[str, list[tuple[PodKey, DeviceStats]]] = {}
    for d in devices:
        for pod in d.pods:
            groups.setdefault(owner_of.get(pod, str(pod)), []).append((pod, d))
    out = []
    for key in sorted(groups):
        members = groups[key]
        slices_need = 0.0
        mem_need = 0.0
        peak_slices = peak_mem = 0.0
        peaks = [d.peak for _, d in members if not d.unknown and d.peak is not None]
        fbs = [d.fb_peak_mib for _, d in members if d.fb_peak_mib is not None]
        for _, d in members:
            model = gpu_model.get((d.node, d.gpu))
            size, mem = _device_size(model, d)
            if d.unknown or d.peak is None:
                # No data: keep what it has; shrinking a device we cannot see would be a guess.
                slices_need, mem_need = max(slices_need, size), max(mem_need, mem)
                peak_slices, peak_mem = max(peak_slices, size), max(peak_mem, mem)
            else:
                # The busiest rolling mean anywhere in the window, never a quantile: a daily burst
                # of min_busy minutes or more sizes the device, wherever the window is cut.
                slices_need = max(slices_need, d.peak * size * (1 + headroom))
                mem_need = max(mem_need, (d.fb_peak_mib or 0.0) * (1 + headroom))
                peak_slices = max(peak_slices, d.peak * size)
                peak_mem = max(peak_mem, d.fb_peak_mib or 0.0)
        pods = tuple(sorted({p for p, _ in members}, key=str))
        out.append(
            Workload(
                key=key,
                namespace=pods[0].namespace,
                pods=pods,
                peak=max(peaks) if peaks else None,
                fb_peak_mib=max(fbs) if fbs else None,
                demand_slices=slices_need,
                demand_memory_mib=mem_need,
                cluster=cluster,
                peak_slices=peak_slices,
                peak_memory_mib=peak_mem,
            )
        )
    return out


def _device_size(model: GpuModel | None, d: DeviceStats) -> tuple[int, float]:
    """Compute slices and memory (MiB) of the device ``d``."""
    if model is None:
        return 1, 0.0
    if d.whole_gpu:
        return max(1, model.compute_slices), float(model.memory_mib)
    prof = canonical_profile(model, d.profile)
    if prof is None:
        return 1, 0.0
    return prof.compute_slices, float(prof.memory_mib)
