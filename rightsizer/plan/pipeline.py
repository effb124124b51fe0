"""Prometheus → plan in one call (analysis, optimiser, plan building), for ``report`` and ``serve``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupilot_common.timefmt import format_time
from rightsizer.analysis import history as analysis
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.errors import RightsizerError
from rightsizer.optimise import fleet as optimiser
from rightsizer.plan import build as planning
from rightsizer.plan.model import Plan


class NoInventoryError(RightsizerError, RuntimeError):
    """Prometheus has no ``gpupilot_gpu_info`` at the end of the window: nothing to plan."""


@dataclass(frozen=True)
class PlanSettings:
    window_s: float = 7 * 86400.0
    window_text: str = "7d"
    optimiser: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of :class:`rightsizer.optimise.fleet.OptimiserSettings` (e.g. ``max_nodes``)."""


def make_plan(
    client: PrometheusClient,
    *,
    end: float,
    settings: PlanSettings,
    progress: Callable[[str], None] = lambda _m: None,
) -> Plan:
    result = analysis.analyse(
        client, end=end, settings=analysis.AnalysisSettings(window_s=settings.window_s), progress=progress
    )
    if not result.nodes:
        raise NoInventoryError(
            f"no gpupilot_gpu_info series at {format_time(end)} in {client.url}; is the exporter scraped?"
        )
    fleet = optimiser.optimise(result, settings=optimiser.OptimiserSettings(**dict(settings.optimiser)))
    return planning.build_plan(
        result,
        fleet,
        context=planning.PlanContext(window=settings.window_text, settings=dict(settings.optimiser)),
    )


def window_text(seconds: float) -> str:
    """``7d``, ``36h``: a window as the plan records it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
