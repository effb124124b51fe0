"""``gpupilot-adapter replay-hpa``: an HPA (as written or with other targets) replayed over Prometheus
history, replicas over time as a table and optionally a PNG chart."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from adapter.commands import options
from adapter.config.mapping import load_config
from adapter.errors import ConfigError
from adapter.hpa import explain, replay, timeline
from adapter.hpa import spec as hpaspec
from adapter.hpa import state as hpastate
from adapter.provider.values import MetricValues
from adapter.quantity import parse_quantity


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--filename", type=Path, required=True, help="YAML file holding the HPA (and its target)"
    )
    options.add_prometheus(parser)
    parser.add_argument("--since", default="7d", help="how far back to replay (e.g. 6h, 7d; default 7d)")
    parser.add_argument(
        "--until", default="", help="end of the replay: RFC 3339 time or Unix seconds (default now)"
    )
    parser.add_argument("--step", default="15s", help="controller sync period to replay at (default 15s)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="METRIC=TARGET",
        help="replay also with this metric's target changed (repeatable; e.g. DCGM_FI_DEV_GPU_UTIL=60)",
    )
    parser.add_argument("--chart", type=Path, help="write a PNG chart of replicas over time to this file")
    parser.add_argument(
        "--gpus-per-pod", type=float, default=1.0, help="GPUs per replica, for GPU-hours (default 1)"
    )
    parser.add_argument(
        "--selector", help="scale target's label selector (default: from the target in the file)"
    )
    parser.add_argument(
        "--rows", type=int, default=24, help="rows of the replicas-over-time table (default 24)"
    )


def run(args: argparse.Namespace) -> int:
    spec = hpaspec.load_hpa(args.filename)
    since = hpastate.parse_duration(args.since, "--since", allow_zero=False)
    step = hpastate.parse_duration(args.step, "--step")
    if step < 1:
        raise ConfigError(f"--step {args.step}: must be at least 1s")
    if args.rows < 1:
        raise ConfigError(f"--rows {args.rows}: must be at least 1")
    if not (args.gpus_per_pod > 0 and args.gpus_per_pod < 1e6):
        raise ConfigError(f"--gpus-per-pod {args.gpus_per_pod}: must be a positive number")
    until = hpastate.parse_time(args.until, "--until") if args.until else time.time()
    names = {m.name for m in spec.model.metrics}
    overrides: dict[str, float] = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep or name not in names:
            raise ConfigError(
                f"--set {item!r}: expected METRIC=TARGET with METRIC one of {', '.join(sorted(names))}"
            )
        try:
            overrides[name] = parse_quantity(value)
        except ValueError as exc:
            raise ConfigError(f"--set {item!r}: {exc}") from exc
        if not 0 < overrides[name] < 1e15:
            raise ConfigError(f"--set {item!r}: the target must be a positive number")
    config = load_config(args.config)
    prometheus = options.open_prometheus(args, timeout=max(args.prometheus_timeout, 30.0))
    try:
        values = MetricValues(
            config=lambda: config, prometheus=prometheus, pods=None, max_value_age=args.max_value_age
        )
        selector, origin = explain.target_selector(spec, args.selector)
        print(
            f"replay-hpa {spec.namespace}/{spec.name}: fetching {len(spec.sources)} metric(s) over {args.since} "
            f"at {args.step} steps…",
            file=sys.stderr,
        )
        line = timeline.fetch(
            spec,
            values=values,
            prometheus=prometheus,
            selector=selector,
            start=until - since,
            end=until,
            step=step,
        )
        requests = timeline.resource_requests(spec, prometheus=prometheus, at=until)
        per_pod = next(iter(requests.values()), {})
        runs = [replay.replay(spec.model, line, label="as written", requests=per_pod)]
        if overrides:
            label = ", ".join(f"{k}={v:g}" for k, v in overrides.items())
            runs.append(
                replay.replay(replay.with_targets(spec.model, overrides), line, label=label, requests=per_pod)
            )
    finally:
        prometheus.close()
    print(
        replay.report(
            spec, line, runs, step=step, gpus_per_pod=args.gpus_per_pod, rows=args.rows, origin=origin
        )
    )
    if args.chart:
        from adapter.hpa.replay_chart import write_chart  # noqa: PLC0415 - matplotlib loads only for a chart

        write_chart(
            args.chart,
            runs,
            title=f"{spec.namespace}/{spec.name}: replicas, recorded and replayed",
            max_replicas=spec.max_replicas,
        )
        print(f"  chart: {args.chart}")
    return 0
