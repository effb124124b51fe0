"""``gpupilot-exporter``: flags → :class:`~exporter.settings.Settings` → backend, collector, server.

``gpupilot-exporter backfill …`` and ``gpupilot-exporter cluster …`` are the simulator's own
commands (:mod:`simulator.cli`), dispatched before any flag parsing. Bad flags or files end the
process with one line on stderr and exit status 2; a failed ``--once`` collection with status 1.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

from exporter.attribute import kubeapi, procs
from exporter.attribute.podresources import dra
from exporter.collect.backend import Backend
from exporter.collect.collector import AllocationsSource, Collector, OwnersSource
from exporter.commands import dcgmflags
from exporter.contract import counters
from exporter.contract.layout import HOSTNAME_LABELS, MIG_SERIES, SeriesLayout
from exporter.errors import ConfigError
from exporter.expose import windows
from exporter.serve import webconfig
from exporter.serve.server import MetricsServer
from exporter.settings import (
    DEFAULT_POD_RESOURCES_SOCKET,
    CollectorSettings,
    ListenAddress,
    Settings,
)
from gpupilot_common import argtypes, loops, numbers
from gpupilot_common.cli import OneLineParser, add_version
from gpupilot_common.paths import exists, file_problem

PROG = "gpupilot-exporter"
MIN_INTERVAL_S = 0.1
"""Shorter collection periods only burn CPU: NVML's own sampling is coarser than that."""
MAX_INTERVAL_S = 3600.0
"""Longer periods make every scrape an hour stale; a scrape interval is 10-60 s."""
SUBCOMMANDS = ("backfill", "cluster")
# the top-level modules of the simulator extra: missing, --backend sim and the simulator's commands say so
SIMULATOR_NEEDS = frozenset({"simulator", "numpy", "aiohttp"})
log = logging.getLogger("exporter")


_RESOURCE_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _resource_names(text: str) -> tuple[str, ...]:
    """``--nvidia-resource-names``: comma-separated extended resource names (``domain/name``)."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if not _RESOURCE_NAME.fullmatch(n)]
    if bad:
        raise argparse.ArgumentTypeError(
            f"{bad[0]!r} is not a resource name like nvidia.com/gpu (domain/name, comma-separated)"
        )
    return names


def build_parser() -> OneLineParser:
    p = OneLineParser(
        prog=PROG,
        description=(
            "DCGM-compatible GPU and MIG metrics for Prometheus, from NVML/GPM or the simulator. "
            f"Subcommands of the simulator: '{PROG} backfill --help', '{PROG} cluster --help'."
        ),
        epilog=(
            "HTTP: /metrics (text 0.0.4, OpenMetrics when asked, gzip when accepted), "
            "/health (process alive), /ready (503 until a collection succeeded or when the last "
            "good one is older than 3 intervals). dcgm-exporter's options and DCGM_EXPORTER_* "
            "variables are accepted too (-a/--address, -c/--collect-interval in ms, -k, -f, "
            "--web-config-file, …); one it cannot honour stops with a line saying why "
            "(docs/exporter.md)."
        ),
    )
    add_version(p)
    p.add_argument(
        "--backend",
        choices=("nvml", "sim"),
        default="nvml",
        help="where device values come from: nvml (real GPUs) or sim (a scenario file) (default nvml)",
    )
    p.add_argument("--scenario", type=Path, metavar="FILE", help="fleet scenario YAML for --backend sim")
    p.add_argument(
        "--node",
        metavar="NAME",
        help="which node of the scenario this exporter plays (--backend sim; default: the first node)",
    )
    p.add_argument(
        "--listen",
        default=":9400",
        type=argtypes.listen_address,
        metavar="HOST:PORT",
        help="HOST:PORT to serve /metrics, /health and /ready on; ':PORT' = every interface; "
        "port 0 picks a free one (default :9400)",
    )
    p.add_argument(
        "--interval",
        type=numbers.real(low=MIN_INTERVAL_S, high=MAX_INTERVAL_S, unit="seconds"),
        metavar="SECONDS",
        default=10.0,
        help="seconds between collections; scrapes are served from the last one (default 10)",
    )
    p.add_argument(
        "--collect-timeout",
        type=numbers.real(low=0, low_open=True, high=MAX_INTERVAL_S, unit="seconds"),
        metavar="SECONDS",
        help="seconds one backend read may take before it is abandoned and the last snapshot is "
        "kept (default: the smaller of 5 and --interval)",
    )
    p.add_argument(
        "--node-name",
        metavar="NAME",
        help="value of the node label, Hostname unless --hostname-label says otherwise (default: "
        "$NODE_NAME, else the scenario node with --backend sim, else the host name)",
    )
    p.add_argument(
        "-f",
        "--collectors",
        type=Path,
        metavar="FILE",
        help="dcgm-exporter counters CSV ('DCGM field, gauge|counter|label, help' per line, '#' "
        "comments a line out) naming the fields to publish (default $DCGM_EXPORTER_COLLECTORS, "
        "else dcgm-exporter's default set plus SM_ACTIVE, SM_OCCUPANCY and volatile ECC totals)",
    )
    p.add_argument(
        "--mig-series",
        choices=MIG_SERIES,
        default="per-gpu",
        help="per-gpu: GPU-level fields (power, temperature…) once per physical GPU, so sums are "
        "right; per-instance: dcgm-exporter's layout, every field once per MIG instance with its "
        "GPU_I_PROFILE, GPU_I_ID and pods (default per-gpu)",
    )
    p.add_argument(
        "--hostname-label",
        choices=HOSTNAME_LABELS,
        default="Hostname",
        help="name of the node label: Hostname (dcgm-exporter 4.x), hostname (its next release) "
        "or none (as its --no-hostname) (default Hostname)",
    )
    p.add_argument(
        "--xid-count-window-size",
        type=float,
        metavar="MS",
        default=300000.0,
        help="window of DCGM_EXP_XID_ERRORS_COUNT in milliseconds (default 300000)",
    )
    p.add_argument(
        "--clock-events-count-window-size",
        type=float,
        metavar="MS",
        default=300000.0,
        help="window of DCGM_EXP_CLOCK_EVENTS_COUNT in milliseconds (default 300000)",
    )
    p.add_argument(
        "--kubernetes",
        action="store_true",
        help="add pod, namespace and container labels from kubelet's pod-resources API "
        "(with --backend sim the scenario's own pods label the devices unless "
        "--pod-resources-socket is given)",
    )
    p.add_argument(
        "--pod-resources-socket",
        type=Path,
        metavar="PATH",
        help=f"kubelet pod-resources socket (default {DEFAULT_POD_RESOURCES_SOCKET}); giving it "
        "implies --kubernetes, and with --backend sim replaces the scenario's own pods",
    )
    p.add_argument(
        "--kubernetes-enable-dra",
        action="store_true",
        help="also attribute GPUs and MIG devices that Dynamic Resource Allocation assigned (driver "
        "gpu.nvidia.com), with dcgm-exporter's dra_* labels; their UUIDs come from the node's "
        "ResourceSlices, else from NVIDIA's canonical device names (dcgm-exporter's flag of the same "
        "name; $KUBERNETES_ENABLE_DRA)",
    )
    p.add_argument(
        "--kubernetes-virtual-gpus",
        action="store_true",
        help="shared GPUs (time-slicing, MPS) as dcgm-exporter 4.5.3 labels them: the device's series "
        "without pod labels, plus one series per pod holding a replica, with pod, namespace, container, "
        "pod_uid and vgpu (the replica index), carrying that pod's own DCGM_FI_DEV_GPU_UTIL and "
        "DCGM_FI_DEV_FB_USED (0 when idle; needs hostPID) and the device's value of every other field "
        "($KUBERNETES_VIRTUAL_GPUS)",
    )
    p.add_argument(
        "--nvidia-resource-names",
        type=_resource_names,
        default=(),
        metavar="NAMES",
        help="comma-separated device-plugin resource names attributed besides nvidia.com/gpu, "
        "nvidia.com/gpu.shared and nvidia.com/mig-* (dcgm-exporter's $NVIDIA_RESOURCE_NAMES)",
    )
    p.add_argument(
        "--web-config",
        type=Path,
        metavar="FILE",
        help="TLS and basic-auth settings in the Prometheus exporter-toolkit format "
        "(dcgm-exporter: --web-config-file)",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="collect once, print the exposition (text format) on stdout and exit; "
        "exit 1 with one line on stderr when the collection fails",
    )
    p.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="log verbosity on stderr (default info)",
    )
    return p


def parse_settings(argv: Sequence[str], *, environ: dict[str, str] | None = None) -> Settings:
    """Flags → Settings; raises ConfigError (one line) for values argparse cannot check."""
    env = os.environ if environ is None else environ
    # dcgm-exporter's flags and DCGM_EXPORTER_* variables become ours (or one refusing line).
    args = build_parser().parse_args(dcgmflags.translate(argv, env))
    timeout = args.collect_timeout if args.collect_timeout is not None else min(5.0, args.interval)
    if timeout <= 0 or timeout > args.interval:
        raise ConfigError(
            f"--collect-timeout {timeout:g}: must be positive and at most --interval ({args.interval:g})"
        )
    if args.backend == "sim" and args.scenario is None:
        raise ConfigError("--backend sim needs --scenario FILE (e.g. examples/fleet-demo.yaml)")
    if args.backend != "sim" and (args.scenario is not None or args.node is not None):
        raise ConfigError("--scenario and --node only apply to --backend sim")
    for flag, ms in (
        ("--xid-count-window-size", args.xid_count_window_size),
        ("--clock-events-count-window-size", args.clock_events_count_window_size),
    ):
        if not (1000.0 <= ms <= 86_400_000.0):  # NaN fails too
            raise ConfigError(f"{flag} {ms:g}: must be between 1000 and 86400000 milliseconds")
        if ms / 1000.0 / args.interval > windows.MAX_ENTRIES:
            raise ConfigError(
                f"{flag} {ms:g}: the window holds more than {windows.MAX_ENTRIES} collections at "
                f"--interval {args.interval:g}; shorten the window or raise --interval"
            )
    if args.collectors is not None:
        selection = counters.select(counters.load(args.collectors))
    else:
        selection = counters.gpupilot_default()
    layout = SeriesLayout(
        selection=selection,
        mig_series=args.mig_series,
        hostname_label=args.hostname_label,
        xid_window_s=args.xid_count_window_size / 1000.0,
        clock_events_window_s=args.clock_events_count_window_size / 1000.0,
        virtual_gpus=args.kubernetes_virtual_gpus,
    )
    node_name = args.node_name or env.get("NODE_NAME", "")
    if not node_name and args.backend != "sim":
        node_name = socket.gethostname()
    return Settings(
        backend=args.backend,
        scenario=args.scenario,
        sim_node=args.node,
        node_name=node_name,
        kubernetes=args.kubernetes or args.pod_resources_socket is not None,
        pod_resources_socket=args.pod_resources_socket or DEFAULT_POD_RESOURCES_SOCKET,
        pod_resources_socket_given=args.pod_resources_socket is not None,
        enable_dra=args.kubernetes_enable_dra,
        resource_names=args.nvidia_resource_names,
        kube_api_url=access.url if (access := kubeapi.in_cluster(env)) is not None else "",
        web_config=args.web_config,
        once=args.once,
        log_level=args.log_level,
        listen=ListenAddress(*args.listen),
        collector=CollectorSettings(interval=args.interval, collect_timeout=timeout),
        layout=layout,
    )


def unreadable_line(layout: SeriesLayout) -> str:
    """One line naming the counters-file fields this exporter cannot read ("" when none)."""
    names = layout.selection.unreadable
    if not names:
        return ""
    return (
        f"{layout.selection.source}: {len(names)} field(s) this exporter cannot read, not published: "
        + ", ".join(names)
    )


def simulator_module(name: str, *, wanted_by: str) -> ModuleType:
    """``simulator.<name>``, loaded by name: the simulator is a separate package with its own extra
    (numpy, aiohttp), absent from an exporter-only install. Missing, it is one line naming the extra."""
    try:
        return importlib.import_module(f"simulator.{name}")
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] in SIMULATOR_NEEDS:
            raise ConfigError(
                f"{wanted_by} needs the simulator (missing module {exc.name!r}): "
                "pip install 'gpupilot[simulator]'"
            ) from None
        raise


def build_backend(settings: Settings) -> Backend:
    """The configured backend (imported lazily: nvml needs the driver library, sim the simulator)."""
    if settings.backend == "sim":
        scenario_mod = simulator_module("scenario", wanted_by="--backend sim")
        sim_backend = simulator_module("backend", wanted_by="--backend sim")

        assert settings.scenario is not None
        if problem := file_problem(settings.scenario):
            what = (
                "scenario file not found"
                if problem.startswith("no such file")
                else f"the scenario is {problem}"
            )
            raise ConfigError(f"{settings.scenario}: {what}; check --scenario")
        scenario = scenario_mod.load(settings.scenario)
        if not scenario.nodes:
            raise ConfigError(f"{settings.scenario}: the scenario has no nodes; add one under nodes:")
        node = settings.sim_node or scenario.nodes[0].name
        backend: Backend = sim_backend.SimBackend(scenario, node=node)
        return backend
    from exporter.nvml.backend import NvmlBackend  # noqa: PLC0415

    return NvmlBackend()


def build_allocations(
    settings: Settings, backend: Backend, *, hostname: str = "", failures: loops.LoopFailures | None = None
) -> AllocationsSource | None:
    """Pod attribution: kubelet when asked for, else the simulator's own pods in sim mode. With DRA
    on and an API to ask, the node's ResourceSlices are watched (listed once with ``--once``)."""
    if settings.kubernetes and (settings.backend != "sim" or settings.pod_resources_socket_given):
        from exporter.attribute.podresources.client import (  # noqa: PLC0415
            PodResourcesClient,
            resource_names,
        )

        slices = None
        if settings.enable_dra and settings.kube_api_url and hostname:
            watcher = kubeapi.SliceWatcher(
                kubeapi.ApiAccess(url=settings.kube_api_url), node=hostname, failures=failures
            )
            if failures is not None:
                failures.register("resourceslices")
            if settings.once:
                try:
                    watcher.list_once()
                except kubeapi.KubeApiError as exc:
                    watcher.mark_unavailable(str(exc))
            else:
                watcher.start()
            slices = watcher.current
        client = PodResourcesClient(
            str(settings.pod_resources_socket),
            dra_drivers=(dra.NVIDIA_DRIVER,) if settings.enable_dra else (),
            resources=resource_names(settings.resource_names),
            slices=slices,
        )
        return client.attribution
    sim_allocations: Callable[[], object] | None = getattr(backend, "allocations", None)
    if settings.backend == "sim" and sim_allocations is not None:
        return sim_allocations  # type: ignore[return-value]
    return None


def build_process_owners(settings: Settings, backend: Backend) -> OwnersSource | None:
    """PID → container for per-pod figures on shared GPUs: the host's /proc and
    /var/log/containers with ``--kubernetes``, the scenario's own processes with ``--backend sim``."""
    if settings.backend == "sim":
        owners: OwnersSource | None = getattr(backend, "process_owners", None)
        return owners
    if settings.kubernetes:
        return procs.ContainerIndex().owners
    return None


def missing_socket_line(settings: Settings) -> str:
    """One line when pod attribution is on but the kubelet's socket is not there (``--once`` would
    otherwise print metrics without pods and exit 0 saying nothing); empty otherwise."""
    attributing = settings.kubernetes and (settings.backend != "sim" or settings.pod_resources_socket_given)
    if not attributing or exists(settings.pod_resources_socket):
        return ""
    return (
        f"{settings.pod_resources_socket}: kubelet pod-resources socket not found, so no metric names a pod; "
        "mount /var/lib/kubelet/pod-resources or fix --pod-resources-socket"
    )


def hostname_for(settings: Settings, backend: Backend) -> str:
    if settings.node_name:
        return settings.node_name
    return str(getattr(backend, "hostname", "") or socket.gethostname())


def run_once(collector: Collector) -> int:
    if not collector.collect_once():
        print(f"{PROG}: {collector.last_error or 'collection failed'}", file=sys.stderr)
        return 1
    if collector.attribution_note:  # --once logs errors only: say it here
        print(f"{PROG}: warning: {collector.attribution_note}", file=sys.stderr)
    body = collector.page.body(openmetrics=False, gzip=False, now=time.monotonic())
    sys.stdout.buffer.write(body)
    sys.stdout.flush()
    return 0


def serve(collector: Collector, server: MetricsServer) -> int:
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    collector.start()
    log.info(
        "serving %s/metrics (backend %s, interval %gs)",
        server.url,
        collector.backend.name,
        collector.settings.interval,
    )
    stop.wait()
    server.stop()
    collector.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        # the simulator's own commands (simulator/cli.py), loaded only when asked for
        try:
            sim_cli = simulator_module("cli", wanted_by=f"{PROG} {argv[0]}")
        except ConfigError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 2
        command = sim_cli.backfill_main if argv[0] == "backfill" else sim_cli.cluster_main
        return int(command(argv[1:]))
    try:
        settings = parse_settings(argv)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    level = settings.log_level.upper()
    if settings.once and level != "DEBUG":
        level = "ERROR"  # --once: the failure is the one line below, not retry chatter
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    unreadable = unreadable_line(settings.layout)
    if unreadable:
        if settings.once:
            print(f"{PROG}: {unreadable}", file=sys.stderr)
        else:
            log.warning("%s", unreadable)
    missing = missing_socket_line(settings)
    if missing and settings.once:
        print(f"{PROG}: warning: {missing}", file=sys.stderr)
    try:
        web = webconfig.load(settings.web_config) if settings.web_config else None
        backend = build_backend(settings)
        hostname = hostname_for(settings, backend)
        failures = loops.LoopFailures()
        collector = Collector(
            backend,
            hostname=hostname,
            settings=settings.collector,
            allocations=build_allocations(settings, backend, hostname=hostname, failures=failures),
            process_owners=build_process_owners(settings, backend),
            layout=settings.layout,
            loop_failures=failures,
        )
        if settings.once:
            try:
                return run_once(collector)
            finally:
                collector.stop()
        server = MetricsServer(
            collector, host=settings.listen.host, port=settings.listen.port, web_config=web, failures=failures
        )
        return serve(collector, server)
    except ConfigError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
