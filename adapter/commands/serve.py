"""``gpupilot-adapter serve``: the custom/external metrics API server over HTTPS."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

from adapter.clients import membudget
from adapter.commands import check_apiservices, options
from adapter.config.settings import (
    AuthSettings,
    PrometheusSettings,
    ScalerSettings,
    ServerLimits,
    ServeSettings,
    TlsSettings,
)
from adapter.errors import ConfigError
from adapter.quantity import parse_quantity
from adapter.serving.app import Adapter
from gpupilot_common import argtypes, numbers

log = logging.getLogger("adapter")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    options.add_prometheus(parser)
    parser.add_argument(
        "--bind-address",
        default="0.0.0.0",  # noqa: S104 - pods listen on all interfaces
        help="address to listen on (default 0.0.0.0)",
    )
    parser.add_argument(
        "--secure-port", type=numbers.whole(low=1, high=65535), default=6443, help="HTTPS port (default 6443)"
    )
    parser.add_argument("--tls-cert-file", type=Path, help="serving certificate (PEM)")
    parser.add_argument("--tls-private-key-file", type=Path, help="serving key (PEM)")
    parser.add_argument(
        "--self-signed-cert-dir",
        type=Path,
        help="local use only: create/reuse a self-signed pair in this folder",
    )
    parser.add_argument(
        "--client-ca-file", type=Path, help="CA for client certificates (user = CN, groups = O)"
    )
    parser.add_argument(
        "--requestheader-client-ca-file",
        type=Path,
        help="CA of the aggregation layer's proxy client certificate; only certificates it issued may set "
        "X-Remote-User/Group/Extra-* (default: read from kube-system/extension-apiserver-authentication)",
    )
    parser.add_argument(
        "--requestheader-allowed-names",
        type=options.csv_list,
        default=(),
        help="comma-separated CNs allowed to pass user headers (empty = any CN from that CA)",
    )
    parser.add_argument(
        "--requestheader-username-headers",
        type=options.csv_list,
        default=("X-Remote-User",),
        help="comma-separated headers carrying the user name (default X-Remote-User)",
    )
    parser.add_argument(
        "--requestheader-group-headers",
        type=options.csv_list,
        default=("X-Remote-Group",),
        help="comma-separated headers carrying groups (default X-Remote-Group)",
    )
    parser.add_argument(
        "--requestheader-extra-headers-prefix",
        type=options.csv_list,
        default=("X-Remote-Extra-",),
        help="comma-separated prefixes of extra-attribute headers (default X-Remote-Extra-)",
    )
    parser.add_argument(
        "--authentication-skip-lookup",
        action="store_true",
        help="do not read kube-system/extension-apiserver-authentication for missing CA settings",
    )
    parser.add_argument(
        "--authorization-mode",
        choices=("subjectaccessreview", "none"),
        default="subjectaccessreview",
        help="subjectaccessreview (default) asks the Kubernetes API; none allows every caller (local use only)",
    )
    parser.add_argument(
        "--kube-api-timeout",
        type=options.seconds,
        default=10.0,
        help="deadline in seconds for each Kubernetes call: TokenReview, SubjectAccessReview, "
        "one page of the pod list (default 10)",
    )
    parser.add_argument(
        "--auth-cache-ttl",
        type=options.seconds,
        default=10.0,
        help="seconds TokenReview/SAR answers are cached",
    )
    parser.add_argument(
        "--authorization-always-allow-paths",
        type=options.csv_list,
        default=("/healthz", "/readyz", "/livez"),
        help="paths served without authentication (default /healthz,/readyz,/livez)",
    )
    parser.add_argument(
        "--pod-cache-seconds",
        type=options.seconds,
        default=15.0,
        help="prometheus pod source: reuse a namespace's pods this long",
    )
    parser.add_argument(
        "--discovery-interval",
        type=options.seconds,
        default=30.0,
        help="seconds between metric-list refreshes",
    )
    parser.add_argument(
        "--disable-external-metrics",
        action="store_true",
        help="do not serve external.metrics.k8s.io (when KEDA or another adapter owns it)",
    )
    parser.add_argument(
        "--refresh-interval",
        type=options.seconds,
        default=None,
        help="seconds between re-evaluations of each metric held in memory "
        "(default: Prometheus' global scrape_interval, else 15)",
    )
    parser.add_argument(
        "--refresh-idle-timeout",
        type=options.seconds,
        default=600.0,
        help="stop refreshing a metric nobody asked for in this many seconds (default 600)",
    )
    parser.add_argument(
        "--max-requests-inflight",
        type=options.positive_int,
        default=8,
        help="metric requests answered at once in worker threads (answers already in memory are "
        "given on the event loop and not counted); others wait up to 10 s, then 429 (default 8)",
    )
    parser.add_argument(
        "--max-connections",
        type=options.positive_int,
        default=512,
        help="open connections (TLS handshakes included, ~60 KB each); more wait in the listen backlog "
        "(default 512)",
    )
    parser.add_argument(
        "--idle-connection-timeout",
        type=options.seconds,
        default=60.0,
        help="close a kept-alive connection idle between requests for this long (default 60)",
    )
    parser.add_argument(
        "--request-head-timeout",
        type=options.seconds,
        default=10.0,
        help="seconds a client has to send a complete request head after the TLS handshake; slower "
        "ones are cut (default 10)",
    )
    parser.add_argument(
        "--tls-handshake-timeout",
        type=options.seconds,
        default=10.0,
        help="seconds a client has to complete the TLS handshake (default 10)",
    )
    parser.add_argument(
        "--config-check-interval",
        type=options.seconds,
        default=5.0,
        help="seconds between checks of the config, certificate and CA files (SIGHUP: config now)",
    )

    parser.add_argument(
        "--external-scaler-address",
        metavar="HOST:PORT",
        help="also serve KEDA's external scaler (gRPC externalscaler.ExternalScaler) here, e.g. :9443 "
        "(default: not served)",
    )
    parser.add_argument(
        "--external-scaler-tls-cert-file",
        type=Path,
        help="the external scaler's serving certificate (PEM); default: plaintext gRPC",
    )
    parser.add_argument("--external-scaler-tls-key-file", type=Path, help="its key (PEM)")
    parser.add_argument(
        "--external-scaler-client-ca-file",
        type=Path,
        help="require client certificates issued by this CA (KEDA's tlsClientCert/tlsClientKey)",
    )

    parser.add_argument(
        "--memory-budget",
        type=memory_size,
        default=None,
        metavar="BYTES",
        help="memory all Prometheus answers being read and parsed may take together, in bytes or as a "
        "Kubernetes quantity (96Mi); an answer is charged what it takes once parsed (5-15x its size, "
        "by its series and labels); past it new reads "
        "wait up to 1 s, then fail with 503/UNAVAILABLE naming it (default: half the container's "
        f"memory limit, else {membudget.DEFAULT_BYTES >> 20} MiB)",
    )

    check_apiservices.add_owner_flag(parser)


def memory_size(text: str) -> int:
    """``--memory-budget``: bytes or a Kubernetes quantity, at least 1Mi."""
    try:
        value = parse_quantity(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text[:40]!r}: expected bytes or a quantity such as 96Mi"
        ) from None
    if value < 1 << 20:
        raise argparse.ArgumentTypeError(f"{text[:40]!r}: at least 1Mi")
    return int(value)


def scaler_settings(args: argparse.Namespace) -> ScalerSettings | None:
    cert, key, ca = (
        args.external_scaler_tls_cert_file,
        args.external_scaler_tls_key_file,
        args.external_scaler_client_ca_file,
    )
    if args.external_scaler_address is None:
        if cert or key or ca:
            raise ConfigError(
                "--external-scaler-tls-* and --external-scaler-client-ca-file need --external-scaler-address"
            )
        return None
    text = args.external_scaler_address
    try:
        host, port = argtypes.listen_address(text)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"--external-scaler-address {exc}") from None
    if port == 0:
        raise ConfigError(
            f"--external-scaler-address {text[:60]!r}: KEDA needs a fixed port (1-65535), e.g. :9443"
        )
    if bool(cert) != bool(key):
        raise ConfigError("--external-scaler-tls-cert-file and --external-scaler-tls-key-file go together")
    if ca and not cert:
        raise ConfigError(
            "--external-scaler-client-ca-file needs --external-scaler-tls-cert-file and -key-file"
        )
    return ScalerSettings(
        host=host or "0.0.0.0",  # noqa: S104 - in a pod KEDA reaches it through a Service
        port=int(port),
        tls_cert_file=cert,
        tls_key_file=key,
        client_ca_file=ca,
    )


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    if args.secure_port <= 0 or args.secure_port > 65535:
        raise ConfigError(f"--secure-port {args.secure_port}: must be 1-65535")
    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        raise ConfigError("--tls-cert-file and --tls-private-key-file go together")
    return ServeSettings(
        prometheus=PrometheusSettings(
            url=args.prometheus_url,
            timeout=args.prometheus_timeout,
            auth=options.prometheus_auth(args),
            limits=options.answer_limits(args),
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
            header_timeout=args.request_head_timeout,
            handshake_timeout=args.tls_handshake_timeout,
        ),
        refresh_interval=args.refresh_interval,
        refresh_idle_drop=args.refresh_idle_timeout,
        external_scaler=scaler_settings(args),
        memory_budget=args.memory_budget,
    )


def run(args: argparse.Namespace) -> int:
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
        check_apiservices.warn_at_start(
            adapter.kube, owner=args.apiservice_owner, external=adapter.settings.external_metrics
        )
    try:
        while not stop.wait(1.0):
            pass
    finally:
        log.info("shutting down")
        adapter.stop()
    return 0


def _start_failure(exc: OSError, args: argparse.Namespace) -> str:
    reason = exc.strerror or str(exc)
    if exc.filename:
        return f"cannot use {exc.filename}: {reason}; check the file and folder flags"
    return (
        f"cannot listen on --bind-address {args.bind_address} --secure-port {args.secure_port}: "
        f"{reason}; choose a local address and a free port"
    )
