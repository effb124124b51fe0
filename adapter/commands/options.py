"""What several ``gpupilot-adapter`` commands share: argument types, the Prometheus flags, and the
Prometheus client the offline commands open."""

from __future__ import annotations

import argparse
from pathlib import Path

from adapter.clients.prometheus import DEFAULT_LIMITS, PrometheusClient
from adapter.errors import ConfigError, PrometheusDenied
from gpupilot_common import numbers, promanswer, promauth, timefmt
from gpupilot_common.urls import base_url


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


def csv_list(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def add_prometheus(p: argparse.ArgumentParser, *, required: bool = True) -> None:
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


def prometheus_auth(args: argparse.Namespace) -> promauth.PrometheusAuth:
    try:
        return promauth.from_args(args)
    except promauth.CredentialError as exc:
        raise ConfigError(str(exc)) from None


def answer_limits(args: argparse.Namespace) -> promanswer.AnswerLimits:
    return promanswer.AnswerLimits(max_series=args.max_answer_series, max_bytes=args.max_answer_bytes)


def open_prometheus(args: argparse.Namespace, *, timeout: float) -> PrometheusClient:
    """The client for explain-hpa / replay-hpa, stopped at once (one line, exit 1) when the backend
    refuses the tenant or credentials, rather than a table of per-metric 401s."""
    prometheus = PrometheusClient(
        args.prometheus_url, timeout=timeout, auth=prometheus_auth(args), limits=answer_limits(args)
    )
    try:
        prometheus.check_access()
    except PrometheusDenied:
        prometheus.close()
        raise
    return prometheus
