"""``gpupilot-rightsizer plan``: read Prometheus history, propose MIG layouts, write plan.json (read-only)."""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpupilot_common import argtypes, atomicfile, numbers, output, promanswer, promauth, timefmt
from gpupilot_common.urls import base_url
from rightsizer.analysis.history import CLUSTER
from rightsizer.clients import prometheus as prometheus_client
from rightsizer.clients.chunks import QueryLimits
from rightsizer.clients.kube import Kube, KubeError, KubeSettings, PermanentKubeError
from rightsizer.clients.prometheus import PrometheusAuthError, PrometheusClient, PrometheusError
from rightsizer.migparted import manifest
from rightsizer.migparted.config import MigPartedConfig, MigPartedError
from rightsizer.optimise.proposal import OptimiserSettings
from rightsizer.plan import management, table
from rightsizer.plan.model import Plan, dump_plan, plan_to_dict
from rightsizer.plan.pipeline import NoInventoryError, UnknownClusterError, make_plan
from rightsizer.plan.settings import PlanSettings

OUTPUT_SCHEMA = """
## Output with `-o json` / `-o yaml`

The plan itself on stdout, the same document as the `--out` file (`plan.json`); `wrote FILE` and
progress go to stderr. Exit codes are those of the table output. [MIG rightsizing](../rightsizer.md)
explains each field.

The keys (generated from the plan's dataclass):

{table}

```bash
gpupilot-rightsizer plan --prometheus-url http://prometheus:9090 -o json \\
  | jq -r '.nodes[] | select(.changed) | "\\(.name) frees \\(.gpus_freed) GPU(s)"'
```
"""
OUTPUT_DATACLASS = Plan
"""The dataclass ``-o json`` encodes: the reference page's ``{table}`` of keys is generated from it."""

# Prometheus keeps 15 days by default and long-term stores keep years; past a year a window is a typo.
MAX_WINDOW = 366 * 86400.0
MAX_UNIX_S = 253402300799.0
"""9999-12-31T23:59:59Z, the last time ISO 8601 and Python's datetime can write."""


parse_duration = argtypes.duration(maximum=MAX_WINDOW)
"""``--window``: Prometheus' duration grammar (``7d``, ``36h``, ``1h30m``), positive, at most 366 days."""
parse_time = argtypes.moment
fraction_arg = argtypes.real(low=0, high=1)
headroom_arg = argtypes.real(low=0, high=4)
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def namespaces_arg(text: str) -> tuple[str, ...]:
    """``--grow-for-headroom``: ``*`` or comma-separated Kubernetes namespace names."""
    names = argtypes.csv_list(text)
    if not names:
        raise argparse.ArgumentTypeError("give namespaces separated by commas, or * for every namespace")
    for name in names:
        if name != "*" and not _NAMESPACE.fullmatch(name):
            raise argparse.ArgumentTypeError(
                f"{name[:60]!r} is not a namespace name (lower-case letters, digits and '-', at most 63)"
            )
    return names


min_busy_arg = argtypes.bounded(timefmt.parse_duration, low=300, high=6 * 3600, show=timefmt.format_duration)
label_name_arg = argtypes.label_name
cluster_name_arg = argtypes.cluster_name


def add_cluster_arguments(parser: argparse.ArgumentParser, *, what: str) -> None:
    """``--cluster-label`` and ``--cluster``, shared by ``plan`` and ``report``."""
    parser.add_argument(
        "--cluster-label",
        type=label_name_arg,
        default=CLUSTER,
        metavar="LABEL",
        help=(
            "label naming each series' cluster in a multi-cluster store (Thanos, Mimir or VictoriaMetrics "
            f"global view); each cluster is planned on its own and {what} groups by it; series without it "
            f"are one unnamed cluster (default {CLUSTER})"
        ),
    )
    parser.add_argument(
        "--cluster",
        type=cluster_name_arg,
        default=None,
        metavar="NAME",
        help=f"{what} only the cluster whose --cluster-label value is NAME (default: every cluster)",
    )


def prometheus_auth(args: argparse.Namespace) -> promauth.PrometheusAuth:
    """The tenant, credential and TLS flags (shared with the adapter), checked."""
    try:
        return promauth.from_args(args)
    except promauth.CredentialError as exc:
        raise PrometheusAuthError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Read GPU history from Prometheus, find idle and oversized MIG slices, and propose per-node "
        "MIG layouts that free whole GPUs. Read-only: it changes nothing in the cluster. Prints a "
        "table and writes plan.json for 'apply' and 'report'."
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
        "--window",
        type=parse_duration,
        default=7 * 86400.0,
        metavar="DUR",
        help="history to analyse, e.g. 7d, 36h (default 7d)",
    )
    parser.add_argument(
        "--at",
        type=numbers.bounded(parse_time, low=0, high=MAX_UNIX_S, unit="(year 9999)"),
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
        type=numbers.whole(low=1, high=1_000_000),
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
        type=numbers.real(low=0, low_open=True, high=86400, unit="seconds"),
        default=30.0,
        metavar="S",
        help="seconds for the exact MILP solver in total (per cluster); past it the greedy packing is used; "
        "with --allow-moves the fleet's MILP gets what is left and at least a third of it (default 30)",
    )
    parser.add_argument(
        "--keep-profiles",
        action="store_true",
        help="consolidate only: every pod keeps its current MIG profile (no resource-name changes)",
    )
    parser.add_argument(
        "--headroom",
        type=headroom_arg,
        default=0.2,
        metavar="R",
        help="demand = peak --min-busy mean activity and peak memory × (1 + R) (default 0.2)",
    )
    parser.add_argument(
        "--grow-for-headroom",
        type=namespaces_arg,
        nargs="?",
        const=("*",),
        default=(),
        metavar="NS,...",
        help="give a larger slice to pods whose peak fits the one they have but not with --headroom, "
        "in these namespaces (alone: every namespace); by default such a pod keeps its slice and the "
        "plan says so, and a slice grows only when the peak itself does not fit it",
    )
    parser.add_argument(
        "--idle-threshold",
        type=fraction_arg,
        default=0.05,
        metavar="R",
        help="a slice is idle when no --min-busy mean of its activity reached R, an hour likewise (default 0.05)",
    )
    parser.add_argument(
        "--min-busy",
        type=min_busy_arg,
        default=900.0,
        metavar="DUR",
        help="slices are sized for their busiest rolling mean of this length anywhere in the window, so a "
        "burst this long is never shrunk nor counted idle; 5m to 6h (default 15m)",
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
    parser.add_argument(
        "--allow-strategy-change",
        action="store_true",
        help="also answer single-strategy nodes as if they moved to the mixed MIG strategy, and recommend "
        "the move where it frees more (listed under strategy_changes; 'apply' does not act on it)",
    )
    parser.add_argument(
        "--lookback",
        type=parse_duration,
        default=28 * 86400.0,
        metavar="DUR",
        help="with a --window shorter than 7d, also read busy hours this far back (hourly, from the "
        "recording rule gpupilot:slice_activity:avg5m): a slice busy again every week is kept, and each "
        "slice the plan shrinks says when it was last busy (default 28d)",
    )
    parser.add_argument(
        "--ignore-history",
        action="store_true",
        help="shrink slices whose busy hours before the window recur weekly (the plan still names them)",
    )
    parser.add_argument("--all-nodes", action="store_true", help="list unchanged nodes in the table too")
    output.add_argument(parser, what="the plan")
    add_cluster_arguments(parser, what="plan")
    parser.add_argument(
        "--timeout",
        type=numbers.real(low=0, low_open=True, high=3600, unit="seconds"),
        default=60.0,
        metavar="S",
        help="per-query HTTP timeout in seconds (default 60)",
    )
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        metavar="FILE",
        help=(
            "also read the cluster (nodes and gpu.nvidia.com ResourceSlices, read-only): the nodes' "
            "nvidia.com/mig.strategy and mig.config labels (kube_node_labels has them only when "
            "kube-state-metrics allow-lists them) and the nodes NVIDIA's DRA driver manages (a DynamicMIG "
            "node is never given a MIG Manager config); '-' uses $KUBECONFIG, ~/.kube/config or the "
            "in-cluster service account (default: history only)"
        ),
    )
    add_query_arguments(parser)


@dataclass(frozen=True)
class ClusterView:
    """What the Kubernetes API says about the nodes a plan covers."""

    modes: dict[str, tuple[str, str]]
    """Node name → (mode, reason) for the nodes NVIDIA's DRA driver manages."""
    labels: dict[str, dict[str, str]]
    """Node name → its labels (the MIG strategy and config, which ``kube_node_labels`` carries only
    when kube-state-metrics allow-lists them)."""


def cluster_view(kubeconfig: Path | None) -> ClusterView:
    """The nodes as the API shows them (None: the default kubeconfig, else the in-cluster
    account); a 403 on the ResourceSlices leaves the operator's label as the only sign of DRA."""
    kube = Kube.connect(
        KubeSettings(kubeconfig=None if kubeconfig is None or str(kubeconfig) == "-" else kubeconfig)
    )
    try:
        nodes = kube.list_nodes()
        try:
            slices: list[dict[str, Any]] | None = kube.list_resource_slices(driver=management.DRIVER)
        except PermanentKubeError as exc:
            if exc.status not in (403, 404):
                raise
            slices = None
    finally:
        kube.close()
    modes, labels = {}, {}
    for node in nodes:
        name = str(node["metadata"]["name"])
        labels[name] = {str(k): str(v) for k, v in (node["metadata"].get("labels") or {}).items()}
        said = management.mode(node, slices)
        if said is not None:
            modes[name] = said
    return ClusterView(modes, labels)


def cluster_modes(kubeconfig: Path) -> dict[str, tuple[str, str]]:
    """Node name → (mode, reason) for the nodes the Kubernetes API shows DRA-managed."""
    return cluster_view(kubeconfig).modes


def add_query_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by ``plan`` and ``report``: what one query may cost, and progress."""
    defaults = QueryLimits()
    parser.add_argument(
        "--max-query-series",
        type=numbers.whole(low=1, high=100_000_000),
        default=defaults.max_series,
        metavar="N",
        help="series one query may select; a larger fleet's queries are cut into node groups "
        f"(default {defaults.max_series:,}; VictoriaMetrics refuses more than 300,000 by default)",
    )
    parser.add_argument(
        "--max-query-samples",
        type=numbers.whole(low=1, high=10**12),
        default=defaults.max_samples,
        metavar="N",
        help=f"raw samples one query may read (default {defaults.max_samples:,}; Prometheus refuses "
        "more than 50,000,000 by default)",
    )
    parser.add_argument(
        "--query-concurrency",
        type=numbers.whole(low=1, high=64),
        default=defaults.concurrency,
        metavar="N",
        help=f"node groups queried at the same time (default {defaults.concurrency})",
    )
    answers = prometheus_client.DEFAULT_LIMITS
    parser.add_argument(
        "--max-answer-series",
        type=numbers.whole(low=1, high=100_000_000),
        default=answers.max_series,
        metavar="N",
        help="series one Prometheus answer may hold; past it the query fails with an error naming it "
        f"and the answer is not read further (default {answers.max_series:,})",
    )
    parser.add_argument(
        "--max-answer-bytes",
        type=numbers.whole(low=1024, high=1 << 40),
        default=answers.max_bytes,
        metavar="N",
        help=f"bytes one Prometheus answer may hold, likewise (default {answers.max_bytes:,}, 128 MiB)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress lines on stderr ('report' shows them on a terminal only)",
    )


def query_limits_from(args: argparse.Namespace) -> QueryLimits:
    return QueryLimits(
        max_series=args.max_query_series,
        max_samples=args.max_query_samples,
        concurrency=args.query_concurrency,
    )


def answer_limits_from(args: argparse.Namespace) -> promanswer.AnswerLimits:
    return promanswer.AnswerLimits(max_series=args.max_answer_series, max_bytes=args.max_answer_bytes)


def progress_printer(args: argparse.Namespace, *, tty_only: bool = False) -> Callable[[str], None]:
    """Progress lines (``… message (12 s)``, seconds since the command started) on stderr; none with
    ``--quiet``, nor with ``tty_only`` when stderr is not a terminal (``report``: one line on error)."""
    started = time.monotonic()
    shown = not args.quiet and (not tty_only or sys.stderr.isatty())

    def progress(msg: str) -> None:
        if shown:
            print(f"… {msg} ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)

    return progress


def settings_from(args: argparse.Namespace) -> PlanSettings:
    return PlanSettings(
        window_s=args.window,
        headroom=args.headroom,
        idle_threshold=args.idle_threshold,
        min_busy_s=args.min_busy,
        optimiser=OptimiserSettings(
            max_nodes=args.max_nodes,
            allow_moves=args.allow_moves,
            time_limit_s=args.time_limit,
            keep_profiles=args.keep_profiles,
            ignore_history=args.ignore_history,
            allow_strategy_change=args.allow_strategy_change,
            grow_for_headroom=tuple(args.grow_for_headroom),
        ),
        lookback_s=args.lookback,
        cluster_label=args.cluster_label,
        cluster=args.cluster,
        query_limits=query_limits_from(args),
    )


def run(args: argparse.Namespace) -> int:
    end = args.at if args.at is not None else time.time()
    if args.min_busy >= args.window:
        print(
            f"error: --min-busy ({args.min_busy:g} s) must be shorter than --window ({args.window:g} s)",
            file=sys.stderr,
        )
        return 2
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

    progress = progress_printer(args)
    view = None
    try:
        if args.kubeconfig is not None:
            view = cluster_view(args.kubeconfig)
            progress(
                f"{len(view.labels)} node(s) in the cluster, {len(view.modes)} managed by NVIDIA's DRA driver"
            )
        with PrometheusClient(
            args.prometheus_url,
            timeout=args.timeout,
            auth=prometheus_auth(args),
            limits=answer_limits_from(args),
        ) as client:
            plan = make_plan(
                client,
                end=end,
                settings=settings_from(args),
                progress=progress,
                cluster_configs=tuple(cluster_configs),
                node_modes=view.modes if view else None,
                node_labels=view.labels if view else None,
            )
            progress(f"{client.queries} queries answered")
    except (PrometheusError, NoInventoryError, UnknownClusterError, KubeError) as exc:
        where = "--kubeconfig: " if isinstance(exc, KubeError) else ""
        print(f"error: {where}{exc}", file=sys.stderr)
        return 1
    try:
        dump_plan(plan, args.out)
    except atomicfile.WriteFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    if output.structured(args):
        output.emit(plan_to_dict(plan), args.output)
        print(f"wrote {args.out}", file=sys.stderr)
        return 0
    print(table.plan_table(plan, all_nodes=args.all_nodes, wide=args.output == "wide"))
    print(f"\nwrote {args.out}")
    return 0
