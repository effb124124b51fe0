"""``gpupilot-adapter recommend-hpa``: from a week of history, the HPA targets and behaviour that spend
the fewest GPU-hours while a service bound holds, checked on days the search never saw.

Exit 0 with a recommendation, 1 when no configuration meets the bound (the closest one is shown and
why), 2 on bad input (flags, the HPA file, the history: a missing series, NaN, a gap)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from adapter.commands import options
from adapter.config.mapping import load_config
from adapter.errors import ConfigError
from adapter.hpa import explain, timeline
from adapter.hpa import spec as hpaspec
from adapter.hpa import state as hpastate
from adapter.hpa.recommend import bound as boundlib
from adapter.hpa.recommend import candidates, fitting, history, output, search
from adapter.provider.values import MetricValues
from gpupilot_common import output as outfmt

OUTPUT_SCHEMA = """
## Output with `-o json` / `-o yaml`

One document on stdout (progress on stderr when it is a terminal; exit codes as with the table). Figures are replica-hours
and GPU-hours (× `--gpus-per-pod`) of the replay engine, per part of the window:

| key | type | what |
|---|---|---|
| `hpa` | object | `namespace`, `name`, `target` (`Deployment/chat-inference`) |
| `kubernetes` | string | the controller release whose decision is replayed |
| `start`, `end`, `step_seconds` | string, number | the window and the sync period replayed |
| `held_out_days` | list | the days (UTC dates of their first step) the search never saw |
| `bound` | object | `signal`, `op` (`<=`/`>=`), `value`, `budget_share` (0-1 of each day's steps) |
| `model` | object | `capacity_per_replica` (requests/s, null when never reached), `startup_seconds`, `startup_measured_from` (scale-ups), `demand_lower_bound_share`, `curves` (`name`, `model`: `linear` or `curve`, `points`, `median_error`), `bridged_steps`, `notes` |
| `replay_error` | object | the current configuration replayed against what was recorded on the training days: `replica_hours_percent`, `mean_abs_replicas`, `broken_share_predicted`, `broken_share_recorded`, `trusted` (error within 10 %) |
| `recorded`, `current` | object | what happened, and the current configuration replayed: `held_out` (`replica_hours`, `gpu_hours`, `bound_broken_minutes` per day, `bound_broken_share_worst_day`, `bound_held`), `training` (`replica_hours`, `gpu_hours`, `bound_broken_share_worst_day`), `scale_ups`, `scale_downs`, `extrapolated_steps`; `current` also `configuration` |
| `recommended` | object or null | the same figures, `configuration` (`minReplicas`, `maxReplicas`, `targets`, `behavior`), `dropped_metrics`, `found_as`, `saving_percent` (held-out replica-hours against `current`), `hpa` (the HPA document to apply), `utilization_notes` |
| `targets_only` | object or null | the cheapest configuration that changes only targets (the HPA's own behaviour), same figures |
| `candidates` | integer | configurations tried |
| `warnings` | list | what limits the answer |

```bash
gpupilot-adapter recommend-hpa -f hpa.yaml --prometheus-url http://prometheus:9090 \\
  --bound 'inference_queue_wait_seconds{quantile="0.95"} <= 2' -o json | jq '.recommended.saving_percent'
```
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f", "--filename", type=Path, required=True, help="YAML file holding the HPA (and its target)"
    )
    options.add_prometheus(parser)
    parser.add_argument(
        "--bound",
        required=True,
        help="the service bound, on an application signal: SELECTOR OP NUMBER, e.g. "
        "'inference_queue_wait_seconds{quantile=\"0.95\"} <= 2' (one series per pod, or one for the service)",
    )
    parser.add_argument(
        "--bound-budget",
        default="1%",
        help="share of each day's minutes the bound may be broken and still hold (default 1%%)",
    )
    parser.add_argument("--since", default="7d", help="history to learn from, ending at --until (default 7d)")
    parser.add_argument(
        "--until", default="", help="end of the history: RFC 3339 time or Unix seconds (default now)"
    )
    parser.add_argument(
        "--held-out",
        default="2d",
        help="the last part of the history kept from the search and used to validate (default 2d: whole days)",
    )
    parser.add_argument("--step", default="15s", help="controller sync period to replay at (default 15s)")
    parser.add_argument(
        "--may-change",
        default=",".join(candidates.DEFAULT_CHANGES),
        help="what the recommendation may change, comma-separated among "
        f"{', '.join(candidates.CHANGES)} (default {','.join(candidates.DEFAULT_CHANGES)}; "
        "tolerance needs a cluster with per-HPA tolerance, KEP-4951)",
    )
    parser.add_argument(
        "--served-requests",
        default="inference_requests_total",
        help="counter of requests each pod served (default inference_requests_total; vLLM: vllm:request_success_total)",
    )
    parser.add_argument(
        "--rejected-requests",
        default="inference_requests_rejected_total",
        help="counter of requests each pod turned away (default inference_requests_rejected_total; optional)",
    )
    parser.add_argument(
        "--queue",
        default="inference_queue_depth",
        help="gauge of requests waiting per pod (default inference_queue_depth; vLLM: vllm:num_requests_waiting)",
    )
    parser.add_argument(
        "--startup",
        default="",
        help="seconds from a pod's creation to Ready (default: measured from the history's scale-ups)",
    )
    parser.add_argument(
        "--max-gap",
        default="10m",
        help="bridge gaps in the history up to this long with the values before them (default 10m; longer: an error)",
    )
    parser.add_argument(
        "--rate-window",
        default="",
        help="window of the counters' rate() (default: 4 × the history's sample spacing, at least 1m)",
    )
    parser.add_argument(
        "--gpus-per-pod", type=float, default=1.0, help="GPUs per replica, for GPU-hours (default 1)"
    )
    parser.add_argument(
        "--selector", help="scale target's label selector (default: from the target in the file)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="processes replaying candidates side by side (default: 2, or 1 on a single CPU)",
    )
    outfmt.add_argument(parser, what="the recommendation")


def run(args: argparse.Namespace) -> int:
    spec = hpaspec.load_hpa(args.filename)
    since = hpastate.parse_duration(args.since, "--since", allow_zero=False)
    held = hpastate.parse_duration(args.held_out, "--held-out", allow_zero=False)
    step = hpastate.parse_duration(args.step, "--step")
    if step < 1:
        raise ConfigError(f"--step {args.step}: must be at least 1s")
    if held % 86400:
        raise ConfigError(f"--held-out {args.held_out}: must be whole days (e.g. 2d)")
    if since < held + 86400:
        raise ConfigError(
            f"--since {args.since} is not longer than --held-out {args.held_out}: the search needs at least one "
            "whole day before the held-out part (e.g. --since 7d --held-out 2d)"
        )
    max_gap = hpastate.parse_duration(args.max_gap, "--max-gap")
    startup = hpastate.parse_duration(args.startup, "--startup") if args.startup else None
    rate_window = (
        hpastate.parse_duration(args.rate_window, "--rate-window", allow_zero=False)
        if args.rate_window
        else None
    )
    if not 1 <= args.jobs <= 64:
        raise ConfigError(f"--jobs {args.jobs}: must be between 1 and 64")
    if not (args.gpus_per_pod > 0 and args.gpus_per_pod < 1e6):
        raise ConfigError(f"--gpus-per-pod {args.gpus_per_pod}: must be a positive number")
    changes = [c.strip() for c in args.may_change.split(",") if c.strip()]
    unknown = [c for c in changes if c not in candidates.CHANGES]
    if unknown or not changes:
        raise ConfigError(
            f"--may-change {args.may_change!r}: expected a comma-separated list among {', '.join(candidates.CHANGES)}"
        )
    bound = boundlib.parse(args.bound, budget=args.bound_budget)
    demand = history.Demand(
        history.check_name("--served-requests", args.served_requests),
        history.check_name("--rejected-requests", args.rejected_requests),
        history.check_name("--queue", args.queue),
    )
    until = hpastate.parse_time(args.until, "--until") if args.until else time.time()
    until = until - until % step
    say = search.progress_to_stderr("recommend-hpa")
    config = load_config(args.config)
    prometheus = options.open_prometheus(args, timeout=max(args.prometheus_timeout, 30.0))
    started = time.monotonic()
    try:
        values = MetricValues(
            config=lambda: config, prometheus=prometheus, pods=None, max_value_age=args.max_value_age
        )
        selector, _ = explain.target_selector(spec, args.selector)
        say(f"{spec.namespace}/{spec.name}: fetching {args.since} of history at {args.step} steps")
        inputs = history.fetch(
            spec,
            values=values,
            prometheus=prometheus,
            selector=selector,
            bound=bound,
            demand=demand,
            start=until - since,
            end=until,
            step=step,
            max_gap=max_gap,
            rate_window=rate_window,
        )
        requests = timeline.resource_requests(spec, prometheus=prometheus, at=until)
    finally:
        prometheus.close()
    per_pod_requests = {
        name.partition("/")[2] or name: v for name, v in next(iter(requests.values()), {}).items()
    }
    fitted = fitting.fit(
        spec, inputs, bound.bound, queue_metric=demand.queue, startup=startup, requests=per_pod_requests
    )
    days = search.split(inputs.times, held_out=int(held // 86400))
    first = int(inputs.recorded[0]) if inputs.recorded[0] > 0 else spec.min_replicas
    outcome = search.search(
        fitted.model,
        spec.model,
        inputs.timeline,
        days,
        first=first,
        budget=bound.bound.budget,
        changes=changes,
        requests=next(iter(requests.values()), {}),
        jobs=args.jobs,
        progress=say,
    )
    say(
        f"{outcome.candidates} candidates, {outcome.engine_runs} engine replays in {time.monotonic() - started:.0f}s"
    )
    ctx = output.Context(
        spec=spec,
        fitted=fitted,
        outcome=outcome,
        days=days,
        times=inputs.times,
        recorded=inputs.recorded,
        signal=inputs.signal,
        bound=bound.bound,
        gpus_per_pod=args.gpus_per_pod,
        bridged=inputs.bridged,
    )
    warnings = _warnings(ctx)
    doc = output.document(ctx, requests=per_pod_requests, warnings=warnings)
    if outfmt.structured(args):
        outfmt.emit(doc, args.output)
    else:
        print(output.text(doc, wide=args.output == "wide"))
    if outcome.recommended is None:
        print(f"recommend-hpa: {_why_none(ctx)}", file=sys.stderr)
        return 1
    return 0


def _warnings(ctx: output.Context) -> list[str]:
    out = []
    error = output.replay_error(ctx)
    if not error["trusted"]:
        out.append(
            f"the model replays the current configuration {error['replica_hours_percent']:+.1f} % off the recorded "
            "replica-hours on the training days (more than 10 %): the recommendation cannot be trusted"
        )
    if ctx.fitted.censored_share > 0.05:
        out.append(
            f"{ctx.fitted.censored_share * 100:.0f} % of steps were saturated or at maxReplicas: demand there is a "
            "lower bound, and the costs shown may be too"
        )
    rec = ctx.outcome.recommended_score
    if rec is not None and rec.extrapolated:
        out.append(
            f"the recommendation drives the load per replica beyond anything fitted for {rec.extrapolated} steps: "
            "the curves are extrapolated there"
        )
    return out


def _why_none(ctx: output.Context) -> str:
    budget = ctx.bound.budget * 100
    best = ctx.outcome.best_failed
    if best is None:
        return f"no configuration was tried that meets the bound ({ctx.bound.text()})"
    _, score = best
    share = score.broken_share(ctx.days)
    worst = int(share.argmax())
    day = output._day_label(ctx, worst)
    return (
        f"no configuration keeps {ctx.bound.signal} within its bound on every day: the closest breaks it "
        f"{share[worst] * 100:.2f} % of {day} (budget {budget:g} %); allow more replicas (--may-change maxReplicas, "
        "or raise maxReplicas in the file), a larger --bound-budget, or a looser bound"
    )
