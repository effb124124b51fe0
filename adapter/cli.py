"""``gpupilot-adapter``: ``serve`` (the custom/external metrics API server), ``explain-hpa`` and
``replay-hpa``, ``check-apiservices`` (before installing: does another adapter own the metrics APIs?)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from adapter import apiservice_check, convert, explain, hpa, hpaspec, hpastate, replay, timeline
from adapter.app import Adapter
from adapter.config import load_config
from adapter.errors import AdapterError, ConfigError, PrometheusDenied
from adapter.kube import KubeClient
from adapter.podsource import KubernetesPodSource, PodSource, PrometheusPodSource
from adapter.prometheus import DEFAULT_LIMITS, PrometheusClient
from adapter.quantity import parse_quantity
from adapter.settings import AuthSettings, PrometheusSettings, ServerLimits, ServeSettings, TlsSettings
from adapter.values import MetricValues
from gpupilot_common import atomicfile, numbers, promanswer, promauth, timefmt
from gpupilot_common.cli import OneLineParser
from gpupilot_common.urls import base_url

log = logging.getLogger("adapter")


def seconds(text: str) -> float:
    """A duration (``90``, ``30s``, ``1m30s``), finite and > 0 (``--discovery-interval 0`` would spin)."""
    try:
        return timefmt.parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seconds_or_zero(text: str) -> float:
    """A duration, finite and >= 0 (0 = no limit)."""
    try:
        return timefmt.parse_duration(text, allow_zero=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _add_prometheus(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument(
        "--prometheus-url",
        required=required,
        type=base_url,
        metavar="URL",
        help="Prometheus (or Thanos/Mimir/VictoriaMetrics) base URL, with any path prefix "
        "(http://mimir:8080/prometheus)" + ("" if required else "; required unless --state is given"),
    )
    p.add_argument(
        "--prometheus-timeout",
        type=seconds,
        default=5.0,
        help="deadline in seconds for each Prometheus request, connect to last byte (default 5)",
    )
    limits = DEFAULT_LIMITS
    p.add_argument(
        "--max-answer-series",
        type=numbers.whole(low=1, high=100_000_000),
        default=limits.max_series,
        metavar="N",
        help="series one Prometheus answer may hold; past it the query fails (503, one line naming it) "
        f"and the answer is not read further (default {limits.max_series:,})",
    )
    p.add_argument(
        "--max-answer-bytes",
        type=numbers.whole(low=1024, high=1 << 40),
        default=limits.max_bytes,
        metavar="N",
        help=f"bytes one Prometheus answer may hold, likewise (default {limits.max_bytes:,}, 64 MiB)",
    )
    promauth.add_arguments(p)
    p.add_argument(
        "--config", type=Path, help="metric mapping file (YAML); default: the packaged default-config.yaml"
    )
    p.add_argument(
        "--pod-source",
        choices=("kubernetes", "prometheus", "none"),
        default=None,
        help="how label selectors become pods: a pods watch on the Kubernetes API (serve default), "
        "kube-state-metrics' kube_pod_labels in Prometheus (explain-hpa default), or none",
    )
    p.add_argument("--kubeconfig", default="", help="kubeconfig file; default: in-cluster service account")
    p.add_argument(
        "--max-value-age",
        type=seconds_or_zero,
        default=120.0,
        help="seconds; values whose newest sample is older are not served (0 = no limit; default 120)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="gpupilot-adapter",
        description="Serve Prometheus metrics to the HPA as custom.metrics.k8s.io / external.metrics.k8s.io.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages to stderr")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("serve", help="run the HTTPS API server", description="Run the metrics API server.")
    _add_prometheus(s)
    s.add_argument(
        "--bind-address",
        default="0.0.0.0",  # noqa: S104 - pods listen on all interfaces
        help="address to listen on (default 0.0.0.0)",
    )
    s.add_argument(
        "--secure-port", type=numbers.whole(low=1, high=65535), default=6443, help="HTTPS port (default 6443)"
    )
    s.add_argument("--tls-cert-file", type=Path, help="serving certificate (PEM)")
    s.add_argument("--tls-private-key-file", type=Path, help="serving key (PEM)")
    s.add_argument(
        "--self-signed-cert-dir",
        type=Path,
        help="local use only: create/reuse a self-signed pair in this folder",
    )
    s.add_argument("--client-ca-file", type=Path, help="CA for client certificates (user = CN, groups = O)")
    s.add_argument(
        "--requestheader-client-ca-file",
        type=Path,
        help="CA of the aggregation layer's proxy client certificate; only certificates it issued may set "
        "X-Remote-User/Group/Extra-* (default: read from kube-system/extension-apiserver-authentication)",
    )
    s.add_argument(
        "--requestheader-allowed-names",
        type=_csv,
        default=(),
        help="comma-separated CNs allowed to pass user headers (empty = any CN from that CA)",
    )
    s.add_argument(
        "--requestheader-username-headers",
        type=_csv,
        default=("X-Remote-User",),
        help="comma-separated headers carrying the user name (default X-Remote-User)",
    )
    s.add_argument(
        "--requestheader-group-headers",
        type=_csv,
        default=("X-Remote-Group",),
        help="comma-separated headers carrying groups (default X-Remote-Group)",
    )
    s.add_argument(
        "--requestheader-extra-headers-prefix",
        type=_csv,
        default=("X-Remote-Extra-",),
        help="comma-separated prefixes of extra-attribute headers (default X-Remote-Extra-)",
    )
    s.add_argument(
        "--authentication-skip-lookup",
        action="store_true",
        help="do not read kube-system/extension-apiserver-authentication for missing CA settings",
    )
    s.add_argument(
        "--authorization-mode",
        choices=("subjectaccessreview", "none"),
        default="subjectaccessreview",
        help="subjectaccessreview (default) asks the Kubernetes API; none allows every caller (local use only)",
    )
    s.add_argument(
        "--kube-api-timeout",
        type=seconds,
        default=10.0,
        help="deadline in seconds for each Kubernetes call: TokenReview, SubjectAccessReview, "
        "one page of the pod list (default 10)",
    )
    s.add_argument(
        "--auth-cache-ttl", type=seconds, default=10.0, help="seconds TokenReview/SAR answers are cached"
    )
    s.add_argument(
        "--authorization-always-allow-paths",
        type=_csv,
        default=("/healthz", "/readyz", "/livez"),
        help="paths served without authentication (default /healthz,/readyz,/livez)",
    )
    s.add_argument(
        "--pod-cache-seconds",
        type=seconds,
        default=15.0,
        help="prometheus pod source: reuse a namespace's pods this long",
    )
    s.add_argument(
        "--discovery-interval", type=seconds, default=30.0, help="seconds between metric-list refreshes"
    )
    s.add_argument(
        "--disable-external-metrics",
        action="store_true",
        help="do not serve external.metrics.k8s.io (when KEDA or another adapter owns it)",
    )
    s.add_argument(
        "--refresh-interval",
        type=seconds,
        default=None,
        help="seconds between re-evaluations of each metric held in memory "
        "(default: Prometheus' global scrape_interval, else 15)",
    )
    s.add_argument(
        "--refresh-idle-timeout",
        type=seconds,
        default=600.0,
        help="stop refreshing a metric nobody asked for in this many seconds (default 600)",
    )
    s.add_argument(
        "--max-requests-inflight",
        type=positive_int,
        default=8,
        help="metric requests answered at once in worker threads (answers already in memory are "
        "given on the event loop and not counted); others wait up to 10 s, then 429 (default 8)",
    )
    s.add_argument(
        "--max-connections",
        type=positive_int,
        default=512,
        help="open connections (TLS handshakes included, ~60 KB each); more wait in the listen backlog "
        "(default 512)",
    )
    s.add_argument(
        "--idle-connection-timeout",
        type=seconds,
        default=60.0,
        help="close a connection without a complete request head for this long: idle or slow (default 60)",
    )
    s.add_argument(
        "--tls-handshake-timeout",
        type=seconds,
        default=10.0,
        help="seconds a client has to complete the TLS handshake (default 10)",
    )
    s.add_argument(
        "--config-check-interval",
        type=seconds,
        default=5.0,
        help="seconds between checks of the config, certificate and CA files (SIGHUP: config now)",
    )

    apiservice_check.add_owner_flag(s)
    apiservice_check.add_parser(cast("argparse._SubParsersAction[argparse.ArgumentParser]", sub))
    convert.add_parser(cast("argparse._SubParsersAction[argparse.ArgumentParser]", sub))

    e = sub.add_parser(
        "explain-hpa",
        help="show what an HPA would do now, metric by metric",
        description="Fetch the values an autoscaling/v2 HPA would see and apply the HPA's algorithm.",
    )
    e.add_argument(
        "-f",
        "--filename",
        type=Path,
        required=True,
        help="YAML file holding the HPA (and optionally its target)",
    )
    _add_prometheus(e, required=False)
    e.add_argument(
        "--state",
        type=Path,
        help="answer offline from this file's pods, metric values, replicas and history "
        "(format: README, 'explain-hpa --state'); no Prometheus needed",
    )
    e.add_argument(
        "--current-replicas",
        type=numbers.whole(low=0, high=2**31 - 1),
        help="current replica count (default: pods matching the selector)",
    )
    e.add_argument("--selector", help="scale target's label selector (default: from the target in the file)")
    e.add_argument(
        "--no-history",
        action="store_true",
        help="do not rebuild the controller's recent recommendations and scale events from Prometheus",
    )

    r = sub.add_parser(
        "replay-hpa",
        help="replay an HPA (as written or with other targets) over Prometheus history",
        description="Run the HPA controller's decision over past metric values and show replicas over time.",
    )
    r.add_argument(
        "-f", "--filename", type=Path, required=True, help="YAML file holding the HPA (and its target)"
    )
    _add_prometheus(r)
    r.add_argument("--since", default="7d", help="how far back to replay (e.g. 6h, 7d; default 7d)")
    r.add_argument(
        "--until", default="", help="end of the replay: RFC 3339 time or Unix seconds (default now)"
    )
    r.add_argument("--step", default="15s", help="controller sync period to replay at (default 15s)")
    r.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="METRIC=TARGET",
        help="replay also with this metric's target changed (repeatable; e.g. DCGM_FI_DEV_GPU_UTIL=60)",
    )
    r.add_argument("--chart", type=Path, help="write a PNG chart of replicas over time to this file")
    r.add_argument(
        "--gpus-per-pod", type=float, default=1.0, help="GPUs per replica, for GPU-hours (default 1)"
    )
    r.add_argument("--selector", help="scale target's label selector (default: from the target in the file)")
    r.add_argument("--rows", type=int, default=24, help="rows of the replicas-over-time table (default 24)")
    return parser


def _prometheus_auth(args: argparse.Namespace) -> promauth.PrometheusAuth:
    try:
        return promauth.from_args(args)
    except promauth.CredentialError as exc:
        raise ConfigError(str(exc)) from None


def _answer_limits(args: argparse.Namespace) -> promanswer.AnswerLimits:
    return promanswer.AnswerLimits(max_series=args.max_answer_series, max_bytes=args.max_answer_bytes)


def _open_prometheus(args: argparse.Namespace, *, timeout: float) -> PrometheusClient:
    """The client for explain-hpa / replay-hpa, stopped at once (one line, exit 1) when the backend
    refuses the tenant or credentials, rather than a table of per-metric 401s."""
    prometheus = PrometheusClient(
        args.prometheus_url, timeout=timeout, auth=_prometheus_auth(args), limits=_answer_limits(args)
    )
    try:
        prometheus.check_access()
    except PrometheusDenied:
        prometheus.close()
        raise
    return prometheus


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    if args.secure_port <= 0 or args.secure_port > 65535:
        raise ConfigError(f"--secure-port {args.secure_port}: must be 1-65535")
    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        raise ConfigError("--tls-cert-file and --tls-private-key-file go together")
    return ServeSettings(
        prometheus=PrometheusSettings(
            url=args.prometheus_url,
            timeout=args.prometheus_timeout,
            auth=_prometheus_auth(args),
            limits=_answer_limits(args),
        ),
        tls=TlsSettings(args.tls_cert_file, args.tls_private_key_file, args.self_signed_cert_dir),
        auth=AuthSettings(
            client_ca_file=args.client_ca_file,
            requestheader_client_ca_file=args.requestheader_client_ca_file,
            requestheader_allowed_names=tuple(args.requestheader_allowed_names),
            requestheader_username_headers=tuple(args.requestheader_username_headers),
            requestheader_group_headers=tuple(args.requestheader_group_headers),
            requestheader_extra_headers_prefix=tuple(args.requestheader_extra_headers_prefix),
            authentication_skip_lookup=args.authentication_skip_lookup,
            authorization_mode=args.authorization_mode,
            cache_ttl=args.auth_cache_ttl,
            always_allow_paths=tuple(args.authorization_always_allow_paths),
        ),
        config_path=args.config,
        bind_address=args.bind_address,
        secure_port=args.secure_port,
        kubeconfig=args.kubeconfig,
        kube_timeout=args.kube_api_timeout,
        pod_source=args.pod_source or "kubernetes",
        pod_cache_seconds=args.pod_cache_seconds,
        discovery_interval=args.discovery_interval,
        max_value_age=args.max_value_age,
        external_metrics=not args.disable_external_metrics,
        config_check_interval=args.config_check_interval,
        limits=ServerLimits(
            max_connections=args.max_connections,
            max_inflight=args.max_requests_inflight,
            idle_timeout=args.idle_connection_timeout,
            handshake_timeout=args.tls_handshake_timeout,
        ),
        refresh_interval=args.refresh_interval,
        refresh_idle_drop=args.refresh_idle_timeout,
    )


def _serve(args: argparse.Namespace) -> int:
    try:
        adapter = Adapter(serve_settings(args))
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGHUP, lambda *_: adapter.config.request_reload())
        adapter.start()
    except OSError as exc:  # a folder that cannot be created, an address that cannot be bound
        raise ConfigError(_start_failure(exc, args)) from None
    if adapter.kube is not None:
        apiservice_check.warn_at_start(
            adapter.kube, owner=args.apiservice_owner, external=adapter.settings.external_metrics
        )
    try:
        while not stop.wait(1.0):
            pass
    finally:
        log.info("shutting down")
        adapter.stop()
    return 0


def _explain_offline(args: argparse.Namespace, spec: hpaspec.HpaSpec) -> int:
    """explain-hpa --state FILE: pods, values, replicas (and history, if given) from the file."""
    state = hpastate.load_state(args.state, spec)
    inputs = explain.Inputs(
        pods=list(state.pods),
        observations=list(state.observations),
        current=args.current_replicas if args.current_replicas is not None else state.current,
        status=state.status,
        history=state.history,
        now=state.now,
        sources=[f"pods, values and replicas from {args.state}"],
    )
    if state.history_given:
        inputs.sources.append(f"history from {args.state}")
    else:
        inputs.caveats.append(explain.no_history_caveat(spec, inputs) or "")
    print(explain.render(explain.explain(spec, inputs)))
    return 0


def _start_failure(exc: OSError, args: argparse.Namespace) -> str:
    reason = exc.strerror or str(exc)
    if exc.filename:
        return f"cannot use {exc.filename}: {reason}; check the file and folder flags"
    return (
        f"cannot listen on --bind-address {args.bind_address} --secure-port {args.secure_port}: "
        f"{reason}; choose a local address and a free port"
    )


def _explain(args: argparse.Namespace) -> int:
    spec = hpaspec.load_hpa(args.filename)
    if args.current_replicas is not None and args.current_replicas < 0:
        raise ConfigError(f"--current-replicas {args.current_replicas}: must be 0 or more")
    if args.state is not None:
        return _explain_offline(args, spec)
    if not args.prometheus_url:
        raise ConfigError("explain-hpa needs --prometheus-url, or --state FILE to answer offline")
    config = load_config(args.config)
    prometheus = _open_prometheus(args, timeout=args.prometheus_timeout)
    pods_source: PodSource | None
    mode = args.pod_source or "prometheus"
    kube = KubeClient(kubeconfig=args.kubeconfig) if mode == "kubernetes" or args.kubeconfig else None
    if mode == "kubernetes" and kube is not None:
        k8s = KubernetesPodSource(kube)
        if not k8s.wait_synced(30):
            raise ConfigError("the pod list from the Kubernetes API did not arrive within 30 s")
        pods_source = k8s
    elif mode == "prometheus":
        pods_source = PrometheusPodSource(prometheus, ttl=60)
    else:
        pods_source = None
    try:
        values = MetricValues(
            config=lambda: config, prometheus=prometheus, pods=pods_source, max_value_age=args.max_value_age
        )
        selector, origin = explain.target_selector(spec, args.selector)
        if kube is not None:
            pods = explain.cluster_pod_states(kube, spec.namespace, selector)
        else:
            listed = pods_source.select(spec.namespace, selector) if pods_source is not None else []
            pods = explain.pod_states(listed)
        observations, pods = explain.observe(
            spec, values=values, prometheus=prometheus, selector=selector, pods=pods, kube=kube
        )
        current = (
            args.current_replicas
            if args.current_replicas is not None
            else sum(1 for p in pods if not p.deleting and p.phase not in ("Succeeded", "Failed"))
        )
        now = time.time()
        inputs = explain.Inputs(
            pods=pods,
            observations=observations,
            current=current,
            status=current,
            history=hpa.History(started=True),
            now=now,
            sources=[
                f"selector from {origin}; pods from "
                + (
                    "the Kubernetes API; Resource metrics from metrics.k8s.io"
                    if kube
                    else f"the {mode} pod source"
                ),
                f"values from {prometheus.url}, newer than {args.max_value_age:g}s",
            ],
        )
        found = 0
        if not args.no_history:
            window = replay.history_window(spec.model)
            line = timeline.fetch(
                spec,
                values=values,
                prometheus=prometheus,
                selector=selector,
                start=now - window,
                end=now - 15,
                step=15,
            )
            inputs.history, found = replay.recorded_history(spec.model, line, pods=pods, now=now)
            events = len(inputs.history.scale_up_events) + len(inputs.history.scale_down_events)
            if found:
                inputs.sources.append(
                    f"history: {found} recommendation(s) of the last {window}s recomputed from Prometheus range "
                    f"queries of the same metrics (15 s steps); {events} scale event(s) from {line.recorded_from}"
                )
        if not found:
            inputs.history = hpa.History(started=True)
            inputs.caveats.append(explain.no_history_caveat(spec, inputs) or "")
        if kube is not None:
            explain.check_hpa_status(spec, inputs, kube=kube)
        print(explain.render(explain.explain(spec, inputs)))
    finally:
        if pods_source is not None:
            pods_source.close()
        prometheus.close()
    return 0


def _replay(args: argparse.Namespace) -> int:
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
    prometheus = _open_prometheus(args, timeout=max(args.prometheus_timeout, 30.0))
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
        from adapter.replay_chart import write_chart  # noqa: PLC0415 - matplotlib loads only for a chart

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
        print(f"  chart: {args.chart}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        commands = {
            "serve": _serve,
            "explain-hpa": _explain,
            "replay-hpa": _replay,
            "check-apiservices": apiservice_check.run,
            "convert-config": convert.run,
        }
        return commands[args.command](args)
    except AdapterError as exc:
        print(f"gpupilot-adapter {args.command}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())
