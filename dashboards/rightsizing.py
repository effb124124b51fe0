"""Rightsizing: idle allocated compute (waste) and freeable GPUs over time, from recording rules.

Every panel reads the exporter's data through rules/ (no panel needs the rightsizer service),
so the dashboard shows history from the day the exporter was installed.
"""

from __future__ import annotations

from dashboards.model import Dashboard, Panel, Row, Target, stat

WASTE = "gpupilot:fleet_waste:gpu_equivalents"


def dashboard() -> Dashboard:
    d = Dashboard(
        uid="gpupilot-rightsizing",
        title="gpupilot / Rightsizing",
        description="Idle allocated GPU compute in whole-GPU units, where it is, and what could be freed.",
        time_from="now-7d",
    )
    d.add(
        Row("Now"),
        stat("Idle allocated compute (GPU-equivalents)", WASTE, "none", width=8, decimals=2),
        stat(
            "Freeable GPUs (upper bound)",
            f"floor({WASTE})",
            "none",
            width=8,
            description="Idle allocated compute rounded down: whole GPUs a tighter layout could free at most.",
        ),
        stat(
            "Unallocated devices",
            "sum(gpupilot:node_slices:total) - sum(gpupilot:node_slices:allocated)",
            "none",
            width=8,
        ),
        Row("Over time"),
        Panel(
            "Idle allocated compute by node",
            (Target("gpupilot:node_waste:gpu_equivalents", "{{Hostname}}"),),
            "none",
            stack=True,
            decimals=2,
        ),
        Panel(
            "Freeable GPUs over time",
            (
                Target(f"floor({WASTE})", "freeable GPUs (upper bound)"),
                Target(WASTE, "idle allocated compute"),
            ),
            "none",
            decimals=2,
        ),
        Panel(
            "Devices: allocated vs idle (fleet)",
            (
                Target("sum(gpupilot:node_slices:allocated)", "allocated"),
                Target("sum(gpupilot:node_slices:idle)", "allocated but idle"),
            ),
            "none",
            width=24,
        ),
        Row("Where"),
        Panel(
            "Idle allocated devices now (GPU share)",
            (
                Target(
                    "gpupilot:device_idle:bool * on (Hostname, UUID, GPU_I_ID) group_left () "
                    "gpupilot:device_gpu_fraction:ratio",
                    instant=True,
                    table=True,
                ),
            ),
            "none",
            kind="table",
            decimals=3,
        ),
        Panel(
            "Mean activity per pod over the time range",
            (
                Target(
                    '100 * avg by (namespace, pod) (avg_over_time(gpupilot:slice_activity:avg5m{pod!=""}[$__range]))',
                    instant=True,
                    table=True,
                ),
            ),
            "percent",
            kind="table",
            decimals=1,
        ),
    )
    return d
