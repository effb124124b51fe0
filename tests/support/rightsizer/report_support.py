"""Synthetic report inputs (a plan with changes and evidence, trend, heatmap, alerts) for fast tests."""

from __future__ import annotations

import functools
import math
from typing import Any

from rightsizer.plan.model import Plan, plan_from_dict, plan_to_dict
from rightsizer.report.build import build_report
from rightsizer.report.data import AlertSeen, Heatmap, ReportData, Trend
from rightsizer.report.model import Report
from tests.support.rightsizer.apply_support import Change, make_plan

END = 1_764_460_800.0  # 2025-11-30 00:00 UTC
WEEK = 7 * 86400.0


def plan_with_evidence() -> Plan:
    plan = make_plan(
        [
            Change("gpu-node-1", "all-1g.10gb", {"3g.40gb": 1, "1g.10gb": 4}, gpus_freed=2),
            Change("gpu-node-2", "all-balanced", {"7g.80gb": 1}, gpus_freed=1),
        ],
        unchanged=["gpu-node-3"],
    )
    doc: dict[str, Any] = plan_to_dict(plan)
    for n, node in enumerate(doc["nodes"][:2]):
        node["evidence"] = [
            {
                "gpu": g,
                "profile": "1g.10gb",
                "gpu_instance_id": str(7 + g),
                "allocated": g % 2 == 0,
                "pod": f"ml/infer-{n}-{g}" if g % 2 == 0 else "",
                "idle_hours": 168.0 - 20 * g - 7 * n,
                "p95_activity": 0.01 * g,
                # GPU 1 bursts (60 % for a while each day): many idle hours, yet never idle.
                "peak_activity": 0.6 if g == 1 else 0.01 * g,
                "peak_at": "2025-11-29T03:00:00Z",
                "coverage_hours": 168.0,
                "window_hours": 168.0,
            }
            for g in range(4)
        ]
        node["pods_disrupted"] = [{"namespace": "ml", "name": f"infer-{n}", "devices": []}]
    return plan_from_dict(doc, source="synthetic")


def report_data(*, price: float | None = 2.5, alerts: bool = True) -> ReportData:
    start = END - WEEK
    times = tuple(start + 1800 * (i + 1) for i in range(336))
    day = [0.5 + 0.5 * math.sin(2 * math.pi * (t % 86400) / 86400) for t in times]
    trend = Trend(
        times, tuple(3 + 4 * (1 - d) for d in day), tuple(18 + 3 * d for d in day), tuple(28.0 for _ in times)
    )
    hours = tuple(start + 3600 * (i + 1) for i in range(168))
    nodes = ("gpu-node-1", "gpu-node-2", "gpu-node-3")
    values = tuple(
        tuple(
            None
            if (k == 2 and i < 10)
            else (0.5 + 0.45 * math.sin(2 * math.pi * i / 24 + k)) * (0.3 + 0.35 * k)
            for i in range(168)
        )
        for k in range(3)
    )
    seen = (
        AlertSeen(
            "MIGSliceIdle24h",
            "warning",
            "Hostname=gpu-node-1, GPU_I_PROFILE=1g.10gb",
            start + 86400,
            END - 600,
            5200.0,
        ),
        AlertSeen(
            "GPUXidError",
            "critical",
            "Hostname=gpu-node-2, gpu=3",
            start + 3 * 86400,
            start + 3 * 86400 + 900,
            15.0,
        ),
    )
    return ReportData(
        start,
        END,
        trend,
        Heatmap(hours, nodes, values),
        seen if alerts else (),
        plan_with_evidence(),
        price,
        "http://prometheus:9090",
    )


@functools.cache
def synthetic_report(*, price: float | None = 2.5, alerts: bool = True) -> Report:
    """``build_report(report_data(...))``, built once per set of arguments (its charts take about half a
    second): a frozen record the tests only read."""
    return build_report(report_data(price=price, alerts=alerts))
