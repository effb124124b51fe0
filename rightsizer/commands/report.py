"""``gpupilot-rightsizer report``: the weekly rightsizing report (HTML + Markdown + PNG charts)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpupilot_common import argtypes, atomicfile, numbers, promauth, timefmt
from gpupilot_common.urls import base_url
from rightsizer.clients.prometheus import PrometheusClient, PrometheusError
from rightsizer.commands import plan as plan_cmd
from rightsizer.plan.model import PlanError, load_plan
from rightsizer.plan.pipeline import NoInventoryError, UnknownClusterError
from rightsizer.plan.settings import PlanSettings
from rightsizer.report import build as report
from rightsizer.report.hpas import HpaRecommendationError

_window = argtypes.bounded(timefmt.parse_duration, low=3600, high=366 * 86400.0, show=timefmt.format_duration)
_price = argtypes.real(low=0, high=1e6)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Write the weekly rightsizing report to DIR: report.html (self-contained, charts inlined), "
        "report.md and the PNG charts: fleet idle-slice trend, per-node slice activity, top idle slices, "
        "proposed layout changes with GPUs, GPU-hours and cost saved, and the alerts that fired. "
        "Read-only. Without --plan it computes the plan from the same history."
    )
    parser.add_argument(
        "--prometheus-url",
        required=True,
        type=base_url,
        metavar="URL",
        help="Prometheus (or Thanos/Mimir/VictoriaMetrics) base URL, with any path prefix "
        "(http://mimir:8080/prometheus)",
    )
    promauth.add_arguments(parser)
    parser.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="directory to write into (created if missing)"
    )
    parser.add_argument(
        "--window",
        type=_window,
        default=7 * 86400.0,
        metavar="DURATION",
        help="history to cover, e.g. 7d (default 7d)",
    )
    parser.add_argument(
        "--at",
        type=plan_cmd.parse_time,
        default=None,
        metavar="TIME",
        help="end of the window: Unix seconds or ISO 8601 (default: now)",
    )
    parser.add_argument(
        "--price-per-gpu-hour",
        type=_price,
        default=None,
        metavar="X",
        help="cost of one GPU-hour in your currency; adds cost saved per week and year",
    )
    parser.add_argument(
        "--plan",
        type=Path,
        default=None,
        metavar="FILE",
        help="plan.json to report on (default: compute one)",
    )
    parser.add_argument(
        "--headroom", type=plan_cmd.headroom_arg, default=0.2, metavar="R", help="as for 'plan' (default 0.2)"
    )
    parser.add_argument(
        "--idle-threshold",
        type=plan_cmd.fraction_arg,
        default=0.05,
        metavar="R",
        help="as for 'plan': a slice is idle when no --min-busy mean reached R (default 0.05)",
    )
    parser.add_argument(
        "--min-busy",
        type=plan_cmd.min_busy_arg,
        default=900.0,
        metavar="DUR",
        help="as for 'plan': length of the rolling mean that sizes slices (default 15m)",
    )
    parser.add_argument(
        "--timeout",
        type=numbers.real(low=0, low_open=True, high=3600, unit="seconds"),
        default=60.0,
        metavar="S",
        help="per-query HTTP timeout in seconds (default 60)",
    )
    parser.add_argument(
        "--hpa-recommendation",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="a 'gpupilot-adapter recommend-hpa -o json' answer, or a folder of them (*.json): one line each "
        "in the report's autoscaling section (repeatable)",
    )
    plan_cmd.add_cluster_arguments(parser, what="report")
    plan_cmd.add_query_arguments(parser)
    parser.add_argument(
        "--previous",
        type=Path,
        default=None,
        metavar="DIR",
        help="an earlier report's folder: the week-over-week section compares with its figures.json "
        "(default: the newest dated folder before --out beside it, as serve writes them)",
    )


def run(args: argparse.Namespace) -> int:
    end = args.at if args.at is not None else time.time()
    try:
        plan = load_plan(args.plan) if args.plan is not None else None
        with PrometheusClient(
            args.prometheus_url,
            timeout=args.timeout,
            auth=plan_cmd.prometheus_auth(args),
            limits=plan_cmd.answer_limits_from(args),
        ) as client:
            settings = PlanSettings(
                window_s=args.window,
                headroom=args.headroom,
                idle_threshold=args.idle_threshold,
                min_busy_s=args.min_busy,
                cluster_label=args.cluster_label,
                cluster=args.cluster,
                query_limits=plan_cmd.query_limits_from(args),
            )
            written = report.generate(
                client,
                out=args.out,
                end=end,
                settings=settings,
                price=args.price_per_gpu_hour,
                plan=plan,
                progress=plan_cmd.progress_printer(args, tty_only=True),
                previous=args.previous,
                hpa_recommendations=args.hpa_recommendation,
            )
    except HpaRecommendationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (PlanError, PrometheusError, NoInventoryError, UnknownClusterError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except atomicfile.WriteFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot write the report to {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {written.html}")
    print(f"wrote {written.markdown}")
    for path in (*written.images, *(p for p in (written.csv, written.figures) if p is not None)):
        print(f"wrote {path}")
    return 0
