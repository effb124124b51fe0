"""``gpupilot-exporter backfill …`` and ``gpupilot-exporter cluster …``: the simulator's commands.

Dispatched by :mod:`exporter.commands.cli`. Bad input ends with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from exporter.contract import counters
from exporter.contract.layout import HOSTNAME_LABELS, MIG_SERIES, SeriesLayout
from exporter.errors import ConfigError
from gpupilot_common import argtypes, numbers
from gpupilot_common import timefmt as timespec
from gpupilot_common.cli import OneLineParser, add_version
from simulator import backfill, cluster_server
from simulator import scenario as scenario_mod

MAX_DAYS = 90.0
"""Longer ranges need ``--force``: 90 days of a large fleet is hours of promtool and gigabytes of disk."""
FUTURE_SLACK_S = 60.0


def backfill_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="gpupilot-exporter backfill",
        description=(
            "Write the simulator's history (every node's device series plus the cluster's "
            "kube-state-metrics and application series) as TSDB blocks a Prometheus can be started on. "
            "Values equal what live 'gpupilot-exporter --backend sim' and 'gpupilot-exporter cluster' "
            "publish at the same times."
        ),
    )
    add_version(p)
    p.add_argument(
        "--scenario", required=True, type=Path, help="fleet scenario YAML (e.g. examples/fleet-demo.yaml)"
    )
    p.add_argument(
        "--start", help="first sample time: ISO 8601 (2026-11-01T00:00:00Z), Unix seconds, or now-14d"
    )
    p.add_argument("--end", help="last sample time, same forms as --start (default: now)")
    p.add_argument(
        "--days",
        type=numbers.real(low=0, low_open=True, high=36500, unit="days"),
        help="instead of --start: this many days ending at --end (or now)",
    )
    p.add_argument(
        "--step", default="15s", help="seconds between samples, like a scrape interval: 15s, 1m (default 15s)"
    )
    p.add_argument("--out", required=True, type=Path, help="Prometheus data directory to write blocks into")
    p.add_argument(
        "--keep-openmetrics",
        action="store_true",
        help="keep the OpenMetrics files in OUT/openmetrics (Prometheus ignores that folder)",
    )
    p.add_argument(
        "--jobs",
        type=numbers.whole(low=1, high=64),
        default=2,
        help="promtool processes run side by side (default 2; 1 on a busy machine)",
    )
    p.add_argument(
        "--batch-samples",
        type=numbers.whole(low=10_000, high=10**9),
        default=backfill.DEFAULT_BATCH_SAMPLES,
        metavar="N",
        help="samples per promtool run (one block each; a window's series are cut into batches of "
        "nodes): what bounds memory, about 0.5 GiB per promtool process at the default "
        f"{backfill.DEFAULT_BATCH_SAMPLES:,}",
    )
    p.add_argument("--force", action="store_true", help=f"allow ranges longer than {MAX_DAYS:g} days")
    p.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    p.add_argument(
        "-f",
        "--collectors",
        type=Path,
        metavar="FILE",
        help="dcgm-exporter counters CSV, as the live exporter's -f (DCGM_EXP_* series are not "
        "backfilled: they count across collections)",
    )
    p.add_argument(
        "--mig-series",
        choices=MIG_SERIES,
        default="per-gpu",
        help="MIG series layout, as the live exporter's flag (default per-gpu)",
    )
    p.add_argument(
        "--hostname-label",
        choices=HOSTNAME_LABELS,
        default="Hostname",
        help="node label name, as the live exporter's flag (default Hostname)",
    )
    return p


def parse_backfill(argv: Sequence[str], *, now: float) -> tuple[Path, backfill.BackfillSettings, bool]:
    """Settings from the command line; :class:`ConfigError` (one line) on a bad range."""
    args = backfill_parser().parse_args(list(argv))
    try:
        step = timespec.parse_duration(args.step, maximum=86400.0)
    except ValueError as e:
        raise ConfigError(f"--step: {e}") from None
    try:
        end = timespec.parse_time(args.end, now=now) if args.end else now
    except ValueError as e:
        raise ConfigError(f"--end: {e}") from None
    if args.start and args.days is not None:
        raise ConfigError("give either --start or --days, not both")
    if args.days is not None:
        if args.days <= 0:
            raise ConfigError(f"--days: must be positive, got {args.days:g}")
        start = end - args.days * 86400.0
    elif args.start:
        try:
            start = timespec.parse_time(args.start, now=now)
        except ValueError as e:
            raise ConfigError(f"--start: {e}") from None
    else:
        raise ConfigError("give --start (e.g. now-7d) or --days N")
    if end <= start:
        raise ConfigError(
            f"--end {timespec.format_time(end)} is not after --start {timespec.format_time(start)}"
        )
    if end > now + FUTURE_SLACK_S:
        raise ConfigError(f"--end {timespec.format_time(end)} is in the future; Prometheus would drop it")
    days = (end - start) / 86400.0
    if days > MAX_DAYS and not args.force:
        raise ConfigError(f"the range is {days:.1f} days, more than {MAX_DAYS:g}; add --force if you mean it")
    if args.jobs < 1:
        raise ConfigError(f"--jobs: must be at least 1, got {args.jobs}")
    layout = SeriesLayout(mig_series=args.mig_series, hostname_label=args.hostname_label)
    if args.collectors is not None:
        layout = dataclasses.replace(layout, selection=counters.select(counters.load(args.collectors)))
    settings = backfill.BackfillSettings(
        start=start,
        end=end,
        step=step,
        out_dir=args.out,
        keep_openmetrics=args.keep_openmetrics,
        jobs=args.jobs,
        layout=layout,
        batch_samples=args.batch_samples,
    )
    return args.scenario, settings, bool(args.quiet)


def backfill_main(argv: Sequence[str]) -> int:
    prog = "gpupilot-exporter backfill"
    try:
        path, settings, quiet = parse_backfill(argv, now=time.time())
        scenario = scenario_mod.load(path)
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if settings.layout is not None:
        skipped = backfill.backfill_layout(settings.layout).selection.unreadable
        if skipped:
            print(f"{prog}: not backfilled: {', '.join(skipped)}", file=sys.stderr)
    try:
        stats = backfill.run(scenario, settings, progress=None if quiet else sys.stderr)
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted; {settings.out_dir} holds the blocks written so far", file=sys.stderr)
        return 130
    rate = stats.samples / max(stats.seconds, 1e-9)
    print(
        f"{prog}: {stats.samples} samples of {stats.series} series in {stats.blocks} blocks "
        f"({stats.windows} windows), "
        f"{timespec.format_time(settings.start)} – {timespec.format_time(settings.end)} every {settings.step:g}s, "
        f"{stats.seconds:.1f}s ({rate / 1e3:.0f}k samples/s) → {settings.out_dir}",
        file=sys.stderr,
    )
    return 0


def cluster_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="gpupilot-exporter cluster",
        description=(
            "Serve what a cluster around the simulated GPUs would publish, on /metrics: kube-state-metrics "
            "series (pods, nodes with their MIG labels, deployments, HPAs) and the workloads' application "
            "series (e.g. inference_queue_depth). Values follow the clock, like the sim exporters."
        ),
    )
    add_version(p)
    p.add_argument(
        "--scenario", required=True, type=Path, help="fleet scenario YAML (e.g. examples/fleet-demo.yaml)"
    )
    p.add_argument(
        "--listen",
        default=":9401",
        type=argtypes.listen_address,
        help="HOST:PORT to listen on (default :9401; empty host = all; port 0 picks a free one)",
    )
    return p


def cluster_main(argv: Sequence[str]) -> int:
    prog = "gpupilot-exporter cluster"
    args = cluster_parser().parse_args(list(argv))
    try:
        host, port = args.listen
        scenario = scenario_mod.load(args.scenario)
        server = cluster_server.ClusterServer(scenario, host=host, port=port)
    except (ConfigError, OSError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    print(
        f"{prog}: serving {args.scenario} on http://{host or '*'}:{server.port}/metrics",
        file=sys.stderr,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0
