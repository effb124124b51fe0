"""Wiring for ``serve``: settings → Prometheus client, config holder, pod source, discovery, the
refreshing value cache, authentication, authorisation and the HTTPS server. :class:`Adapter`
starts and stops them all, and reloads the serving certificate and client CAs when their files
change."""

from __future__ import annotations

import gc
import logging
import ssl
from pathlib import Path

from adapter.clients import membudget
from adapter.clients.kube import AuthenticationConfigMap, KubeClient
from adapter.clients.prometheus import PrometheusClient
from adapter.config.reload import ConfigHolder
from adapter.config.settings import ServeSettings
from adapter.errors import ConfigError
from adapter.provider.discovery import Discovery
from adapter.provider.podsource import KubernetesPodSource, PodSource, PrometheusPodSource
from adapter.provider.refresh import RefreshingCache
from adapter.provider.valuecheck import ValueCheck
from adapter.provider.values import MetricValues
from adapter.serving.api import MetricsApi
from adapter.serving.auth import Authenticator, Authorizer, RequestHeaderSettings, load_pem_certs
from adapter.serving.certreload import FilesWatch
from adapter.serving.keda.grpcserver import ScalerServer
from adapter.serving.keda.scaler import Scaler
from adapter.serving.selfmetrics import SelfMetrics
from adapter.serving.server import AdapterHTTPServer, App
from adapter.serving.tlsutil import certificate_expiry, self_signed_pair, server_context
from gpupilot_common import yamlsafe

log = logging.getLogger(__name__)


def _read(path: Path, flag: str) -> bytes:
    try:
        return yamlsafe.read_bytes(path)  # a regular file only: a named pipe would block the start
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot read: {exc.strerror or exc}") from exc


def freeze_heap() -> None:
    """Move everything alive now — modules, the pod index just listed — out of the cyclic garbage
    collector's reach (``gc.freeze``). With 50,000 pods the heap holds ~120,000 tracked objects and a
    full collection, which runs every few refreshes, stopped every request for ~100 ms (the p99 of
    the benchmark); with them frozen it takes ~1 ms. Objects frozen are still freed when no longer
    referenced; only cycles among them would be kept, so garbage is collected first (once per pod
    list: at start and after a relist)."""
    gc.collect()
    gc.freeze()
    log.debug("froze %d objects after the pod list", gc.get_freeze_count())


def _memory_budget(given: int | None) -> membudget.MemoryBudget:
    if given is not None:
        budget, why = given, "--memory-budget"
    else:
        limit = membudget.container_limit()
        budget = membudget.default_budget()
        why = "no container memory limit" if limit is None else f"half the container's {membudget.mib(limit)}"
    log.info("memory budget for Prometheus answers being read: %s (%s)", membudget.mib(budget), why)
    return membudget.MemoryBudget(budget)


class Adapter:
    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        try:
            self._build(settings)
        except BaseException:
            # a fatal start-up error (bad TLS files, a port taken): close the clients opened so far,
            # so their sessions do not end in an "Unclosed client session" error after the message
            self._close_clients()
            raise

    def _build(self, settings: ServeSettings) -> None:
        self.metrics = SelfMetrics()
        self.config = ConfigHolder(
            settings.config_path,
            on_result=lambda ok: self.metrics.config_reloads.labels("success" if ok else "failure").inc(),
            on_change=self._config_changed,
            on_failure=self.metrics.loop_failure("config-watch"),
        )
        self.metrics.config_loaded.set(self.config.loaded_at)
        p = settings.prometheus
        self.budget = _memory_budget(settings.memory_budget)
        self.prometheus = PrometheusClient(
            p.url,
            timeout=p.timeout,
            auth=p.auth,
            registry_metrics=self.metrics.prometheus,
            limits=p.limits,
            budget=self.budget,
        )
        auth = settings.auth
        needs_kube = (
            settings.pod_source == "kubernetes"
            or auth.authorization_mode == "subjectaccessreview"
            or bool(settings.kubeconfig)
        )
        self.kube = (
            KubeClient(kubeconfig=settings.kubeconfig, timeout=settings.kube_timeout) if needs_kube else None
        )
        self.pods: PodSource | None = None
        if settings.pod_source == "kubernetes":
            assert self.kube is not None
            self.pods = KubernetesPodSource(
                self.kube,
                age_gauge=self.metrics.pod_cache_age,
                after_reset=freeze_heap,
                on_failure=self.metrics.loop_failure("pod-watch"),
            )
        elif settings.pod_source == "prometheus":
            prom_pods = PrometheusPodSource(self.prometheus, ttl=settings.pod_cache_seconds)
            self.metrics.pod_cache_age.set_function(prom_pods.oldest_age)
            self.pods = prom_pods
        self.discovery = Discovery(
            prometheus=self.prometheus,
            config=self.config,
            interval=settings.discovery_interval,
            age_gauge=self.metrics.discovery_age,
            on_failure=self.metrics.loop_failure("discovery"),
        )
        interval = settings.refresh_interval or self._scrape_interval()
        self.cache: RefreshingCache[object] = RefreshingCache(
            interval=interval,
            idle_drop=settings.refresh_idle_drop,
            max_age=settings.max_value_age,
            keys_gauge=self.metrics.refreshed_queries,
            oldest_gauge=self.metrics.values_age,
            budget=self.budget,
            on_failure=self.metrics.loop_failure("refresher"),
        )
        self.metrics.refresh_interval.set(interval)
        self.values = MetricValues(
            config=self.config,
            prometheus=self.prometheus,
            pods=self.pods,
            max_value_age=settings.max_value_age,
            cache=self.cache,
            checks=ValueCheck(self.metrics.registry),
        )
        self.api = MetricsApi(
            values=self.values,
            listing=lambda: self.discovery.listing,
            external_enabled=settings.external_metrics,
            ready=self._ready_checks,
        )
        self.scaler: ScalerServer | None = None  # before any socket is bound: its TLS files are read here
        if settings.external_scaler is not None:
            self.scaler = ScalerServer(
                settings=settings.external_scaler,
                scaler=Scaler(
                    values=self.values,
                    query=self.prometheus.query,
                    cache=self.cache,
                    wait=p.timeout + 1.0,
                ),
                stats=self.metrics.scaler_requests,
                poll_interval=interval,
                first_wait=p.timeout,
                on_tls_reload=lambda ok: self.metrics.scaler_tls_reloads.labels(
                    "success" if ok else "failure"
                ).inc(),
                on_tls_failure=self.metrics.loop_failure("scaler-tls"),
            )
        self._published = self._published_cas()
        self.authenticator, ca_pems = self._authenticator()
        if auth.authorization_mode == "none":
            log.warning(
                "--authorization-mode none: every authenticated caller may read every metric; for local use only"
            )
        self.authorizer = Authorizer(mode=auth.authorization_mode, kube=self.kube, ttl=auth.cache_ttl)
        self._cert, self._key = self._tls_files()
        self._ssl = self._server_context(ca_pems)
        self.app = App(
            api=self.api,
            authenticator=self.authenticator,
            authorizer=self.authorizer,
            metrics=self.metrics,
            always_allow_paths=frozenset(auth.always_allow_paths),
        )
        self.server = AdapterHTTPServer(
            (settings.bind_address, settings.secure_port),
            app=self.app,
            ssl_context=lambda: self._ssl,
            limits=settings.limits,
        )
        watched = [self._cert, self._key]
        watched += [f for f in (auth.requestheader_client_ca_file, auth.client_ca_file) if f is not None]
        self.tls_watch = FilesWatch(
            watched,
            reload=self.reload_tls,
            on_result=lambda ok: self.metrics.tls_reloads.labels("success" if ok else "failure").inc(),
            what="serving certificate and client CAs",
            on_failure=self.metrics.loop_failure("tls-watch"),
        )

    def _scrape_interval(self) -> float:
        """Prometheus' global scrape_interval: a value cannot change faster than that."""
        found = self.prometheus.scrape_interval()
        if found is None:
            log.info("Prometheus does not publish its scrape interval; refreshing values every 15s")
            return 15.0
        log.info("refreshing values every %gs (Prometheus' global scrape_interval)", found)
        return found

    def _server_context(self, ca_pems: list[bytes]) -> ssl.SSLContext:
        ctx = server_context(cert_file=self._cert, key_file=self._key, client_ca_pems=ca_pems)
        self.metrics.serving_cert_expiry.set(certificate_expiry(self._cert))
        return ctx

    def reload_tls(self) -> None:
        """Rebuild the TLS context and authenticator from the files (``ConfigError`` if unusable);
        new connections use them, open ones keep theirs."""
        authenticator, ca_pems = self._authenticator()
        context = self._server_context(ca_pems)
        self._ssl, self.authenticator = context, authenticator
        self.app.authenticator = authenticator

    def _tls_files(self) -> tuple[Path, Path]:
        tls = self.settings.tls
        if tls.cert_file and tls.key_file:
            return tls.cert_file, tls.key_file
        if tls.self_signed_dir:
            log.warning("serving a self-signed certificate from %s: for local use only", tls.self_signed_dir)
            return self_signed_pair(tls.self_signed_dir)
        raise ConfigError(
            "TLS is required: pass --tls-cert-file and --tls-private-key-file "
            "(or --self-signed-cert-dir DIR for local use)"
        )

    def _published_cas(self) -> AuthenticationConfigMap | None:
        """The cluster's published CAs, read once when a CA file is not given."""
        auth = self.settings.auth
        if auth.requestheader_client_ca_file and auth.client_ca_file:
            return None
        if self.kube is None or auth.authentication_skip_lookup:
            return None
        return self.kube.authentication_configmap()

    def _authenticator(self) -> tuple[Authenticator, list[bytes]]:
        auth = self.settings.auth
        rh_pem = (
            _read(auth.requestheader_client_ca_file, "--requestheader-client-ca-file")
            if auth.requestheader_client_ca_file
            else b""
        )
        client_pem = _read(auth.client_ca_file, "--client-ca-file") if auth.client_ca_file else b""
        allowed = auth.requestheader_allowed_names
        published = self._published
        if published is not None:
            if not rh_pem and published.requestheader_client_ca:
                rh_pem = published.requestheader_client_ca.encode()
                allowed = allowed or published.requestheader_allowed_names
            if not client_pem and published.client_ca:
                client_pem = published.client_ca.encode()
        requestheader = None
        if rh_pem:
            requestheader = RequestHeaderSettings(
                ca_certs=load_pem_certs(rh_pem, source="request-header CA"),
                allowed_names=frozenset(allowed),
                username_headers=auth.requestheader_username_headers,
                group_headers=auth.requestheader_group_headers,
                extra_prefixes=auth.requestheader_extra_headers_prefix,
            )
        client_cas = load_pem_certs(client_pem, source="client CA") if client_pem else ()
        anonymous = requestheader is None and not client_cas and self.kube is None
        if anonymous:
            log.warning(
                "no client CA, request-header CA or Kubernetes API: every caller is anonymous (local use only)"
            )
        authenticator = Authenticator(
            requestheader=requestheader,
            client_cas=client_cas,
            kube=self.kube,
            token_ttl=auth.cache_ttl,
            allow_anonymous=anonymous,
        )
        return authenticator, [pem for pem in (rh_pem, client_pem) if pem]

    def _config_changed(self) -> None:
        self.metrics.config_loaded.set(self.config.loaded_at)
        self.discovery.poke()

    def _ready_checks(self) -> list[tuple[str, bool]]:
        return [
            ("config", True),
            ("pod-source", self.pods is None or self.pods.synced()),
        ]

    @property
    def port(self) -> int:
        return self.server.port

    def start(self) -> None:
        """Starts every part; on a failure (a port taken) stops what started and closes the clients."""
        try:
            self.discovery.start()
            self.cache.start()
            self.config.watch(self.settings.config_check_interval)
            self.tls_watch.start(self.settings.config_check_interval)
            self.server.start()
            log.info("serving on https://%s:%d", self.settings.bind_address, self.port)
            if self.scaler is not None:
                self.scaler.start()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.scaler is not None:
            self.scaler.stop()
        self.server.close()
        self.tls_watch.stop()
        self.cache.stop()
        self.discovery.stop()
        self.config.stop()
        self._close_clients()

    def _close_clients(self) -> None:
        """The pod source and the Kubernetes and Prometheus clients, whichever were opened."""
        for name in ("pods", "kube", "prometheus"):
            client = getattr(self, name, None)
            if client is not None:
                client.close()
