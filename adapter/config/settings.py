"""Settings for ``gpupilot-adapter serve``, parsed once from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpupilot_common.promanswer import AnswerLimits
from gpupilot_common.promauth import PrometheusAuth


@dataclass(frozen=True)
class PrometheusSettings:
    url: str
    timeout: float = 5.0
    """Seconds per Prometheus request; the aggregation layer gives discovery 5 s, the HPA more."""
    auth: PrometheusAuth = field(default_factory=PrometheusAuth)
    """Tenant, basic auth or bearer token file, CA bundle and client certificate."""
    limits: AnswerLimits = field(default_factory=AnswerLimits)
    """Series and bytes one answer may hold (``--max-answer-series``, ``--max-answer-bytes``)."""


@dataclass(frozen=True)
class TlsSettings:
    cert_file: Path | None
    key_file: Path | None
    self_signed_dir: Path | None = None
    """Only for local use: generate (or reuse) a self-signed pair here."""


@dataclass(frozen=True)
class AuthSettings:
    client_ca_file: Path | None = None
    requestheader_client_ca_file: Path | None = None
    requestheader_allowed_names: tuple[str, ...] = ()
    """Empty = any CN signed by the request-header CA, as in kube-apiserver."""
    requestheader_username_headers: tuple[str, ...] = ("X-Remote-User",)
    requestheader_group_headers: tuple[str, ...] = ("X-Remote-Group",)
    requestheader_extra_headers_prefix: tuple[str, ...] = ("X-Remote-Extra-",)
    authentication_skip_lookup: bool = False
    """Do not read kube-system/extension-apiserver-authentication for missing CA settings."""
    authorization_mode: str = "subjectaccessreview"
    cache_ttl: float = 10.0
    """Seconds TokenReview and SubjectAccessReview answers are reused (kube's delegated default)."""
    always_allow_paths: tuple[str, ...] = ("/healthz", "/readyz", "/livez")


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = 512
    """Open connections (incl. TLS handshakes in progress); more wait in the listen backlog. A
    connection in its TLS handshake costs about 60 KB (OpenSSL 3), so 512 stay within ~30 MiB; the
    adapter's real clients (each kube-apiserver's pool, Prometheus) need a few dozen."""
    max_inflight: int = 8
    """Metric requests answered at once (worker threads); more wait ``inflight_wait``, then 429."""
    inflight_wait: float = 10.0
    handshake_timeout: float = 10.0
    """Seconds for the TLS handshake."""
    busy_handshake_timeout: float = 1.0
    """Seconds for the TLS handshake while all ``max_connections`` are taken: slower ones are shed."""
    idle_timeout: float = 60.0
    """Seconds a kept-alive connection may sit idle between requests."""
    header_timeout: float = 10.0
    """Seconds for a complete request head, from the end of the TLS handshake (a kept-alive connection:
    from the first byte of the next head), like Go's ``ReadHeaderTimeout``; a slower client is cut."""
    write_timeout: float = 30.0
    """Seconds to hand an answer to the client before the connection is cut."""
    max_url_bytes: int = 16384
    max_header_bytes: int = 8190
    max_headers: int = 100
    max_body_bytes: int = 0
    """Read-only API: any request body is refused (413)."""
    backlog: int = 2048
    """Connections the kernel queues beyond ``max_connections`` (capped by net.core.somaxconn)."""


@dataclass(frozen=True)
class ScalerSettings:
    """KEDA's external scaler over gRPC (``--external-scaler-*``)."""

    host: str
    port: int
    """0 = any free port (tests)."""
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    client_ca_file: Path | None = None
    """When given, clients must present a certificate issued by it (KEDA's ``tlsClientCert``)."""
    max_streams: int = 1000
    """``StreamIsActive`` streams open at once (KEDA opens one per ``external-push`` trigger, all on
    one connection); the next one gets RESOURCE_EXHAUSTED at once. A stream costs no thread (the
    server is asyncio) and about 10 KB."""
    max_unary: int = 256
    """Unary calls (IsActive, GetMetricSpec, GetMetrics) in flight at once, counted apart from the
    streams, so open streams never take their place; the next one gets RESOURCE_EXHAUSTED at once."""
    max_streams_per_connection: int = 4096
    """HTTP/2 streams one connection may open: above ``max_streams + max_unary``, so the limits
    above answer first (HTTP/2's own limit makes a client queue calls silently, unary ones too)."""
    workers: int = 8
    """Threads for unary reads that wait on Prometheus (a metric's first evaluation); reads already
    in memory are answered on the event loop."""
    stream_workers: int = 8
    """Threads for the first evaluations of streams, apart from the unary calls' threads."""
    max_message_bytes: int = 64 * 1024
    """Largest message received or sent: a trigger's metadata is a few hundred bytes."""
    keepalive_time: float = 60.0
    """Seconds of silence after which the server pings a connection; one unanswered for
    ``keepalive_timeout`` seconds is closed (a KEDA pod that went away)."""
    keepalive_timeout: float = 20.0
    min_client_ping_interval: float = 10.0
    """Clients may ping at most this often (seconds); faster pingers are disconnected."""
    max_connection_idle: float = 600.0
    """Seconds a connection without calls is kept; KEDA reconnects transparently."""


@dataclass(frozen=True)
class ServeSettings:
    prometheus: PrometheusSettings
    tls: TlsSettings
    auth: AuthSettings
    config_path: Path | None = None
    """None = the packaged default-config.yaml."""
    bind_address: str = "0.0.0.0"  # noqa: S104 - in a pod the Service must reach it
    secure_port: int = 6443
    kubeconfig: str = ""
    """Empty = in-cluster service account (when the Kubernetes API is needed at all)."""
    kube_timeout: float = 10.0
    """Deadline in seconds for each Kubernetes call: TokenReview, SubjectAccessReview, one list page."""
    pod_source: str = "kubernetes"
    pod_cache_seconds: float = 15.0
    """Prometheus pod source only: how long a namespace's pod listing is reused (one HPA sync)."""
    discovery_interval: float = 30.0
    max_value_age: float = 120.0
    """Seconds; older values are not served (0 = no limit)."""
    external_metrics: bool = True
    limits: ServerLimits = ServerLimits()
    refresh_interval: float | None = None
    """Seconds between re-evaluations of each metric asked for; None = Prometheus' global
    scrape_interval (15 s when Prometheus does not publish its config)."""
    refresh_idle_drop: float = 600.0
    """Seconds after the last request for a metric before it is no longer refreshed."""
    config_check_interval: float = 5.0
    """Seconds between checks of the config file for changes (SIGHUP reloads at once)."""
    external_scaler: ScalerSettings | None = None
    """KEDA's external scaler over gRPC; None = not served."""
    memory_budget: int | None = None
    """Bytes all Prometheus answers being read and parsed may take together (``--memory-budget``);
    None = half the container's memory limit, else 512 MiB (``adapter.clients.membudget``)."""
