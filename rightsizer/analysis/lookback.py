"""Past the window: when a plan's window is shorter than a week, the hours beyond it (up to
``--lookback``) in which a device was busy, read coarsely from the recording rule.

One range query, one point per hour: the hour's highest 5-minute mean of
``gpupilot:slice_activity:avg5m``, returned by the server only for hours at or over the idle
threshold (``>=`` filters the rest out), so what comes back grows with the busy hours, not with the
lookback. Each busy hour becomes a demand in compute slices (mean × the device's compute slices ×
(1 + headroom)), kept on the device (:attr:`DeviceStats.past_need`); the optimiser keeps a slice whose
past demand recurs weekly and the plan says when every slice it shrinks was last busy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpupilot_common.timefmt import format_time
from mig_geometry.names import canonical_profile
from rightsizer.analysis import labels as labels_mod
from rightsizer.analysis.history import BY, RULE
from rightsizer.analysis.types import Analysis
from rightsizer.clients.prometheus import PrometheusClient

WEEK_S = 7 * 86400.0
HOUR_S = 3600.0


@dataclass(frozen=True)
class LookbackSettings:
    lookback_s: float = 28 * 86400.0
    """How far back before the window's end to read (default 28 days: four weekly cycles)."""
    idle_threshold: float = 0.05
    """An hour whose highest 5-minute mean stays under this is not busy."""
    headroom: float = 0.2
    """The same headroom as the window's sizing."""
    cluster_label: str = "cluster"


def past_need_query(*, cluster_label: str, threshold: float) -> str:
    return f"max by ({cluster_label}, {BY}) (max_over_time({RULE}[1h])) >= {threshold!r}"


def attach(
    client: PrometheusClient, analysis: Analysis, *, settings: LookbackSettings
) -> tuple[Analysis, str]:
    """``analysis`` with each device's busy hours before the window (``past_need``), and a note
    saying how far back the history reached (the longest available, up to ``lookback_s``)."""
    first = analysis.end - settings.lookback_s + HOUR_S
    last = analysis.start
    if last <= first:
        return analysis, ""
    series = client.range(
        past_need_query(cluster_label=settings.cluster_label, threshold=settings.idle_threshold),
        first,
        last,
        HOUR_S,
    )
    found: dict[tuple[str, str, int, str], list[tuple[float, float]]] = {}
    earliest: float | None = None
    for s in series:
        labels = s.labels
        try:
            gpu = labels_mod.whole(labels, "gpu", default=-1, high=4096)
        except labels_mod.MalformedLabel:
            continue  # a series of a GPU the inventory left out (its node is set aside, said once there)
        key = (
            labels.get(settings.cluster_label, ""),
            labels.get("Hostname", ""),
            gpu,
            labels.get("GPU_I_ID", ""),
        )
        found.setdefault(key, []).extend(s.points)
        if s.points:
            earliest = min(earliest or s.points[0][0], s.points[0][0])
    models = {(n.cluster, n.name, g.index): g.model for n in analysis.nodes for g in n.gpus}
    devices = []
    for d in analysis.devices:
        points = found.get((d.cluster, d.node, d.gpu, d.gpu_instance_id))
        model = models.get((d.cluster, d.node, d.gpu))
        if not points or model is None:
            devices.append(d)
            continue
        prof = canonical_profile(model, d.profile) if d.profile else model.full_profile
        size = prof.compute_slices if prof is not None else 1
        # Each point covers the hour before it: keep the hour's start.
        need = tuple(sorted((t - HOUR_S, v * size * (1 + settings.headroom)) for t, v in points))
        devices.append(replace(d, past_need=need))
    days = settings.lookback_s / 86400.0
    if earliest is None:
        note = (
            f"no busy hour of {RULE} in the {days:g} days before the window (--lookback): either none, "
            "or the recording rules of rules/ were not deployed then"
        )
    else:
        note = f"history beyond the window read hourly from {RULE} (--lookback {days:g}d, busy hours found back to {_day(earliest)})"
    return replace(analysis, devices=tuple(devices)), note


def _day(t: float) -> str:
    return format_time(t)[:10]


def busy_beyond(past_need: Sequence[tuple[float, float]], *, above: int) -> tuple[float, ...]:
    """The hours (their starts) before the window whose demand needed more than ``above`` compute slices."""
    return tuple(t for t, need in past_need if need > above + 1e-9)


def recurs_weekly(hours: Sequence[float]) -> bool:
    """Busy at the same hour of the week in at least two different weeks (a daily job too)."""
    weeks_at: dict[int, set[int]] = {}
    for t in hours:
        h = round(t / HOUR_S)
        weeks_at.setdefault(h % 168, set()).add(h // 168)
    return any(len(w) >= 2 for w in weeks_at.values())
