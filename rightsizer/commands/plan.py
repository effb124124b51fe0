"""``gpupilot-rightsizer plan``: read Prometheus history, propose MIG layouts, write plan.json (read-only)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpupilot_common import timefmt
from gpupilot_common.timefmt import format_time
from rightsizer.analysis import history as analysis
from rightsizer.clients.prometheus import PrometheusClient, PrometheusError
from rightsizer.migparted import manifest
from rightsizer.migparted.config import MigPartedConfig, MigPartedError
from rightsizer.optimise import fleet as optimiser
from rightsizer.plan import build as planning
from rightsizer.plan import table
from rightsizer.plan.model import dump_plan

# Prometheus keeps 15 days by default and long-term stores keep years; past a year a window is a typo.
MAX_WINDOW = 366 * 86400.0


def parse_duration(text: str) -> float:
    """``--window``: Prometheus' duration grammar (``7d``, ``36h``, ``1h30m``), positive, at most 366 days."""
    try:
        return timefmt.parse_duration(text, maximum=MAX_WINDOW)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_time(text: str) -> float:
    """Unix seconds, or an RFC 3339 / ISO 8601 time (``2026-11-29T12:00:00Z``; no zone means UTC)."""
    try:
        return timefmt.parse_time(text, now=time.time())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError("must be between 0 and 1")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Read GPU history from Prometheus, find idle and oversized MIG slices, and propose per-node "
        "MIG layouts that free whole GPUs. Read-only: it changes nothing in the cluster. Prints a "
        "table and writes plan.json for 'apply' and 'report'."
    )
    parser.add_argument(
        "--prometheus-url", required=True, metavar="URL", help="Prometheus (or Thanos/Mimir) base URL"
    )
    parser.add_argument(
        "--window",
        type=parse_duration,
        default=7 * 86400.0,
        metavar="DUR",
        help="history to analyse, e.g. 7d, 36h (default 7d)",
    )
    parser.add_argument(
        "--at",
        type=parse_time,
        default=None,
        metavar="TIME",
        help="end of the window: Unix seconds or ISO 8601 (default: now)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("plan.json"),
        metavar="FILE",
        help="where to write the plan (default plan.json)",
    )
    parser.add_argument(
        "--max-nodes",
        type=_positive_int,
        default=None,
        metavar="N",
        help="change at most N nodes in this plan, the most valuable first (default: no limit)",
    )
    parser.add_argument(
        "--allow-moves",
        action="store_true",
        help="let pods move to other nodes of the same GPU model (default: pods stay on their node)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=30.0,
        metavar="S",
        help="seconds for the exact MILP solver in total; past it the greedy packing is used (default 30)",
    )
    parser.add_argument(
        "--keep-profiles",
        action="store_true",
        help="consolidate only: every pod keeps its current MIG profile (no resource-name changes)",
    )
    parser.add_argument(
        "--headroom",
        type=float,
        default=0.2,
        metavar="R",
        help="demand = p95 activity and peak memory × (1 + R) (default 0.2)",
    )
    parser.add_argument(
        "--idle-threshold",
        type=_fraction,
        default=0.05,
        metavar="R",
        help="an hour with mean activity below R counts as idle (default 0.05)",
    )
    parser.add_argument(
        "--mig-config",
        type=Path,
        default=None,
        metavar="FILE",
        help=(
            "the cluster's mig-parted ConfigMap (e.g. kubectl get cm default-mig-parted-config -o yaml); "
            "a proposed layout equal to one of its configs (all-1g.10gb, all-balanced, ...) is named by "
            "it instead of a new gpupilot-... config"
        ),
    )
    parser.add_argument("--all-nodes", action="store_true", help="list unchanged nodes in the table too")
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="per-query HTTP timeout in seconds (default 60)",
    )


def run(args: argparse.Namespace) -> int:
    end = args.at if args.at is not None else time.time()
    cluster_configs: list[MigPartedConfig] = []
    if args.mig_config is not None:
        try:
            cluster_configs = manifest.load_path(args.mig_config).mig
        except MigPartedError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        broken = [i.line() for d in cluster_configs for i in d.issues]
        if broken or not cluster_configs:
            print(
                f"error: {broken[0] if broken else f'{args.mig_config}: no mig-parted config found'}",
                file=sys.stderr,
            )
            return 2
    window_text = _window_text(args.window)
    settings = analysis.AnalysisSettings(
        window_s=args.window, idle_threshold=args.idle_threshold, headroom=args.headroom
    )
    opt = optimiser.OptimiserSettings(
        max_nodes=args.max_nodes,
        allow_moves=args.allow_moves,
        time_limit_s=args.time_limit,
        keep_profiles=args.keep_profiles,
    )

    def progress(msg: str) -> None:
        print(f"… {msg}", file=sys.stderr, flush=True)

    try:
        with PrometheusClient(args.prometheus_url, timeout=args.timeout) as client:
            result = analysis.analyse(client, end=end, settings=settings, progress=progress)
            progress(f"{client.queries} queries answered")
    except PrometheusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not result.nodes:
        print(
            f"error: no gpupilot_gpu_info series at {format_time(end)} in {args.prometheus_url}; "
            "is the exporter scraped? (use --at for history that ended earlier)",
            file=sys.stderr,
        )
        return 1
    progress(f"optimising {len(result.nodes)} node(s), {len(result.devices)} device(s)")
    fleet = optimiser.optimise(result, settings=opt)
    plan = planning.build_plan(
        result,
        fleet,
        context=planning.PlanContext(
            window=window_text,
            settings={
                "max_nodes": args.max_nodes,
                "allow_moves": args.allow_moves,
                "time_limit_s": args.time_limit,
                "keep_profiles": args.keep_profiles,
                "headroom": args.headroom,
                "idle_threshold": args.idle_threshold,
            },
            cluster_configs=cluster_configs,
        ),
    )
    try:
        dump_plan(plan, args.out)
    except OSError as exc:
        print(f"error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(table.plan_table(plan, all_nodes=args.all_nodes))
    print(f"\nwrote {args.out}")
    return 0


def _window_text(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"
