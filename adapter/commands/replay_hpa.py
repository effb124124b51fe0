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
from gpupilot_common import atomicfile, output

OUTPUT_SCHEMA = """
## Output with `-o json` / `-o yaml`

One document on stdout (progress on stderr; the chart is still written with `--chart`; exit codes as
with the table):

| key | type | what |
|---|---|---|
| `hpa` | object | `namespace`, `name`, `target` (`Deployment/llm-inference`) |
| `kubernetes` | string | the controller release whose decision is replayed |
| `start`, `end` | string | first and last step, RFC 3339 UTC |
| `step_seconds`, `steps` | number | the sync period replayed and how many steps |
| `pods` | integer | pods that matched the selector in the range |
| `recorded_from` | string | the series the recorded replica counts came from |
| `recorded` | object | what happened: `scale_ups`, `scale_downs`, `mean_replicas`, `gpu_hours` |
| `runs` | list | one per replay: `label` (`as written`, or the `--set` targets), `targets` (metric → target; empty as written), `first_replicas`, `scale_ups`, `scale_downs`, `mean_replicas`, `gpu_hours`, `time_at_max` and `time_above_target` (0-1 shares of the steps) |
| `slices` | list | replicas over time, as the table: `from`, `recorded_mean`, `runs` (`label`, `mean`, `max`) |

```bash
gpupilot-adapter replay-hpa -f hpa.yaml --prometheus-url http://prometheus:9090 --set DCGM_FI_DEV_GPU_UTIL=60 -o json \\
  | jq '.runs[] | {label, gpu_hours, time_above_target}'
```
"""


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
    output.add_argument(parser, what="the replay")


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
    if output.structured(args):
        doc = replay.document(
            spec, line, runs, step=step, gpus_per_pod=args.gpus_per_pod, rows=args.rows, targets=overrides
        )
        output.emit(doc, args.output)
    else:
        print(
            replay.report(
                spec,
                line,
                runs,
                step=step,
                gpus_per_pod=args.gpus_per_pod,
                rows=args.rows,
                origin=origin,
                wide=args.output == "wide",
            )
        )
    if args.chart:
        from adapter.hpa.replay_chart import write_chart  # noqa: PLC0415 - matplotlib loads only for a chart

        try:
            write_chart(
                args.chart,
                runs,
                title=f"{spec.namespace}/{spec.name}: replicas, recorded and replayed",
                max_replicas=spec.max_replicas,
            )
        except atomicfile.WriteFailed as exc:
            print(f"replay-hpa: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.chart}", file=sys.stderr if output.structured(args) else sys.stdout)
    return 0
