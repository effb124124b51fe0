"""The adapter's only door to the Kubernetes API (official ``kubernetes`` client).

Three things: TokenReview (bearer tokens), SubjectAccessReview (authorisation), and a pods
list+watch that keeps an in-memory index fresh (so a request never lists pods). Also reads the
``kube-system/extension-apiserver-authentication`` ConfigMap, where the cluster publishes its
request-header CA and allowed names. Failures become ``KubernetesUnavailable`` (temporary).
"""

from __future__ import annotations

import concurrent.futures
import functools
import http.client
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar, overload

import orjson
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from adapter.errors import KubernetesUnavailable
from adapter.quantity import parse_quantity, to_milli
from gpupilot_common import loops, neterror, timefmt, urllib3deadline, watchdog
from gpupilot_common.paths import file_problem

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class ReviewedUser:
    name: str
    uid: str
    groups: tuple[str, ...]
    extra: Mapping[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class PodRecord:
    """What the adapter keeps of a pod (about 250 bytes; a full pod object is 10-20 KB)."""

    namespace: str
    name: str
    labels: Mapping[str, str]
    """Shared between pods with the same labels (a ReplicaSet's pods): see :func:`_shared_labels`."""
    phase: str
    ready: bool
    deleting: bool


@dataclass(frozen=True)
class PodDetail:
    """A pod as the HPA controller reads it (explain-hpa with a cluster at hand)."""

    name: str
    labels: Mapping[str, str]
    phase: str
    ready: bool
    has_ready_condition: bool
    deleting: bool
    start_time: float | None
    ready_transition: float | None
    requests: Mapping[str, int]
    """Milli-units per resource summed over containers, and per ``container/resource``."""


@dataclass(frozen=True)
class PodUsage:
    """metrics.k8s.io PodMetrics: usage per resource (cores, bytes), summed and per container."""

    usage: Mapping[str, float]
    timestamp: float | None
    window_seconds: float


@dataclass(frozen=True)
class HpaStatus:
    """What an HPA object's status says about its last scale (explain-hpa's cross-check)."""

    current_replicas: int
    desired_replicas: int
    last_scale_time: float | None
    """Unix seconds of ``status.lastScaleTime``; None when the HPA never scaled."""


@dataclass(frozen=True)
class AuthenticationConfigMap:
    """What ``kube-system/extension-apiserver-authentication`` publishes (PEM text, names)."""

    requestheader_client_ca: str
    requestheader_allowed_names: tuple[str, ...]
    client_ca: str


class KubeClient:
    def __init__(
        self, *, kubeconfig: str = "", context: str = "", timeout: float = 10.0, page_size: int = 500
    ) -> None:
        self.timeout = timeout
        """Seconds for each call (a TokenReview, a SubjectAccessReview, one page of a list)."""
        self.page_size = page_size
        if kubeconfig and (problem := file_problem(Path(kubeconfig))):  # a named pipe would block here
            raise KubernetesUnavailable(f"--kubeconfig {kubeconfig}: {problem}; give the kubeconfig file")
        try:
            if kubeconfig:
                api_client = config.new_client_from_config(  # type: ignore[no-untyped-call]
                    config_file=kubeconfig, context=context or None
                )
            else:
                config.load_incluster_config()  # type: ignore[no-untyped-call]
                api_client = client.ApiClient()
        except (config.ConfigException, OSError) as exc:
            hint = kubeconfig or "in-cluster service account"
            raise KubernetesUnavailable(
                f"Kubernetes client configuration ({hint}) failed: {str(exc).rstrip('.')}; pass --kubeconfig"
            ) from exc
        self._api_client = api_client
        urllib3deadline.bound(api_client.rest_client.pool_manager)  # answers end by their deadline
        self._core = client.CoreV1Api(api_client)
        self._authn = client.AuthenticationV1Api(api_client)
        self._authz = client.AuthorizationV1Api(api_client)
        self._autoscaling = client.AutoscalingV2Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._apireg = client.ApiregistrationV1Api(api_client)

    def token_review(self, token: str, *, audiences: tuple[str, ...] = ()) -> ReviewedUser | None:
        body = client.V1TokenReview(
            spec=client.V1TokenReviewSpec(token=token, audiences=list(audiences) or None)
        )
        result = self._call(
            "TokenReview", lambda: self._authn.create_token_review(body, _request_timeout=self.timeout)
        )
        status = result.status
        if status is None or not status.authenticated or status.user is None:
            return None
        user = status.user
        extra = {k: tuple(v) for k, v in (user.extra or {}).items()}
        return ReviewedUser(user.username or "", user.uid or "", tuple(user.groups or ()), extra)

    def subject_access_review(
        self,
        *,
        user: str,
        groups: tuple[str, ...],
        extra: Mapping[str, tuple[str, ...]],
        uid: str,
        resource: Mapping[str, str] | None,
        non_resource: Mapping[str, str] | None,
    ) -> tuple[bool, str]:
        spec = client.V1SubjectAccessReviewSpec(
            user=user,
            groups=list(groups),
            uid=uid or None,
            extra={k: list(v) for k, v in extra.items()} or None,
            resource_attributes=_resource_attributes(resource),
            non_resource_attributes=client.V1NonResourceAttributes(**non_resource) if non_resource else None,
        )
        review = client.V1SubjectAccessReview(spec=spec)
        result = self._call(
            "SubjectAccessReview",
            lambda: self._authz.create_subject_access_review(review, _request_timeout=self.timeout),
        )
        status = result.status
        return bool(status and status.allowed), (status.reason or "") if status else ""

    def authentication_configmap(self) -> AuthenticationConfigMap:
        what = "reading ConfigMap kube-system/extension-apiserver-authentication"
        cm = self._json(
            what,
            lambda: self._core.read_namespaced_config_map(
                "extension-apiserver-authentication", "kube-system", **self._raw
            ),
            hint="bind Role extension-apiserver-authentication-reader to the adapter's ServiceAccount",
        )
        data = _mapping(cm.get("data"))
        try:
            names = json.loads(str(data.get("requestheader-allowed-names") or "[]"))
        except ValueError:
            names = None
        if not isinstance(names, list):
            raise KubernetesUnavailable(f"{what}: requestheader-allowed-names is not a JSON list of names")
        return AuthenticationConfigMap(
            requestheader_client_ca=str(data.get("requestheader-client-ca-file", "")),
            requestheader_allowed_names=tuple(str(n) for n in names),
            client_ca=str(data.get("client-ca-file", "")),
        )

    def pod_details(self, namespace: str) -> list[PodDetail]:
        """Every pod of ``namespace`` with phase, readiness times and requests (one list call)."""
        body = self._json(
            f"listing pods of {namespace}", lambda: self._core.list_namespaced_pod(namespace, **self._raw)
        )
        return [_pod_detail(item) for item in _items(body)]

    def pod_usage(self, namespace: str) -> dict[str, PodUsage]:
        """metrics-server's PodMetrics of ``namespace`` (``metrics.k8s.io/v1beta1``), by pod name."""
        body = self._json(
            f"reading metrics.k8s.io pods of {namespace}",
            lambda: self._custom.list_namespaced_custom_object(
                "metrics.k8s.io", "v1beta1", namespace, "pods", **self._raw
            ),
        )
        out: dict[str, PodUsage] = {}
        for item in _items(body):
            usage: dict[str, float] = {}
            for c in item.get("containers") or []:
                for resource, qty in (c.get("usage") or {}).items():
                    value = _quantity(qty)
                    usage[resource] = usage.get(resource, 0.0) + value
                    usage[f"{c.get('name', '')}/{resource}"] = value
            stamp = item.get("timestamp")
            window = str(item.get("window") or "60s")
            out[(item.get("metadata") or {}).get("name", "")] = PodUsage(
                usage,
                timefmt.parse_time(stamp, now=0.0) if stamp else None,
                timefmt.parse_duration(window, allow_zero=True),
            )
        return out

    def hpa_status(self, namespace: str, name: str) -> HpaStatus | None:
        """The HPA's status, or None when the object does not exist."""
        body = self._json(
            f"reading HPA {namespace}/{name}",
            lambda: self._autoscaling.read_namespaced_horizontal_pod_autoscaler(name, namespace, **self._raw),
            missing_ok=True,
        )
        if body is None:
            return None
        status = _mapping(body.get("status"))
        last = status.get("lastScaleTime")
        return HpaStatus(
            current_replicas=int(status.get("currentReplicas") or 0),
            desired_replicas=int(status.get("desiredReplicas") or 0),
            last_scale_time=timefmt.parse_time(last, now=0.0) if last else None,
        )

    def watch_pods(
        self,
        *,
        on_reset: Callable[[list[PodRecord]], None],
        on_event: Callable[[str, PodRecord], None],
        stop: threading.Event,
        timeout_seconds: int = 300,
    ) -> None:
        """List all pods, then follow the watch, relisting after errors or 410 Gone, until ``stop``.

        The watch resumes from the last resourceVersion it saw, BOOKMARK events included (the API
        server sends them about once a minute, so a quiet watch does not fall out of the watch
        cache's window). A 410 relists at once; a 410 again before any event arrived backs off like any
        other error (0.5 s doubling to 30 s), as does everything until the watch delivers an event.
        """
        backoff = 0.5
        expired_in_a_row = 0
        quiet = loops.Backoff(initial_s=0.5, max_s=30.0)
        while not stop.is_set():
            try:
                pods, version = self.list_pods()  # paginated (limit/continue)
                on_reset(pods)
                while not stop.is_set():
                    started, events = time.monotonic(), 0
                    # the whole watch ends by its deadline, however the server trickles its bytes
                    with watchdog.within(timeout_seconds + 30):
                        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
                            self._core.list_pod_for_all_namespaces,
                            resource_version=version,
                            timeout_seconds=timeout_seconds,
                            allow_watch_bookmarks=True,
                            _request_timeout=(self.timeout, timeout_seconds + 30),
                        )
                        for event in stream:
                            if stop.is_set():
                                return
                            events += 1
                            backoff, expired_in_a_row = 0.5, 0  # the watch works again
                            kind, raw = event["type"], event["raw_object"]
                            version = (raw.get("metadata") or {}).get("resourceVersion", version)
                            if kind in ("ADDED", "MODIFIED", "DELETED"):
                                on_event(kind, _pod(raw))
                    # a watch the server ended at once without an event is not reopened at once
                    stop.wait(
                        loops.watch_pause(lasted_s=time.monotonic() - started, events=events, backoff=quiet)
                    )
            except ApiException as exc:
                if exc.status == 410:
                    expired_in_a_row += 1
                    if expired_in_a_row == 1:
                        log.info("pod watch expired (410 Gone); relisting")
                        continue
                    log.warning(
                        "pod watch expired again before any event (%d in a row); relisting in %.1fs",
                        expired_in_a_row,
                        backoff,
                    )
                else:
                    log.warning("pod watch failed: %s; retrying in %.1fs", _why(exc), backoff)
            except (HTTPError, OSError, ValueError, http.client.HTTPException) as exc:
                log.warning("pod watch failed: %s; retrying in %.1fs", _why(exc), backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)

    def apiservices(self, names: list[str]) -> dict[str, dict[str, Any] | None]:
        """The named APIServices as plain objects; ``None`` for those that do not exist."""
        out: dict[str, dict[str, Any] | None] = {}
        for name in names:
            out[name] = self._json(
                f"reading APIService {name}",
                functools.partial(self._apireg.read_api_service, name, **self._raw),
                missing_ok=True,
            )
        return out

    def list_pods(self) -> tuple[list[PodRecord], str]:
        """Every pod as a slim record, in pages of ``page_size`` (``limit``/``continue``), each page
        within the deadline; only one page's JSON is held at a time. Returns (pods, resourceVersion)."""
        pods: list[PodRecord] = []
        token: str | None = None
        version = ""
        while True:
            body = self._json(
                "listing pods",
                functools.partial(
                    self._core.list_pod_for_all_namespaces, limit=self.page_size, _continue=token, **self._raw
                ),
            )
            pods.extend(_pod(o) for o in _items(body))
            meta = _mapping(body.get("metadata"))
            version = meta.get("resourceVersion", version)
            token = meta.get("continue") or None
            if token is None:
                return pods, version

    @property
    def _raw(self) -> dict[str, Any]:
        """Keyword arguments for a call whose JSON :meth:`_json` reads itself (one parser, one check)."""
        return {"_preload_content": False, "_request_timeout": self.timeout}

    @overload
    def _json(
        self, what: str, call: Callable[[], Any], *, missing_ok: Literal[False] = False, hint: str = ""
    ) -> dict[str, Any]: ...

    @overload
    def _json(
        self, what: str, call: Callable[[], Any], *, missing_ok: Literal[True], hint: str = ""
    ) -> dict[str, Any] | None: ...

    def _json(
        self, what: str, call: Callable[[], Any], *, missing_ok: bool = False, hint: str = ""
    ) -> dict[str, Any] | None:
        """One JSON object from a call made with :attr:`_raw`: the body is parsed inside the same
        error mapping as the call, so an HTML page or a truncated answer is a ``KubernetesUnavailable``
        naming the call, never a traceback."""
        raw: Any = self._call(what, call, missing_ok=missing_ok, hint=hint)
        if raw is None:
            return None
        data = getattr(raw, "data", b"")
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise KubernetesUnavailable(
                f"{what} failed: the answer is not JSON ({len(data)} bytes"
                f"{', truncated?' if data[:1] in (b'{', b'[') else ''}); is the API server address right?"
            ) from None
        if not isinstance(body, dict):
            raise KubernetesUnavailable(f"{what} failed: the answer is JSON but not an object")
        return body

    @overload
    def _call(
        self, what: str, call: Callable[[], T], *, missing_ok: Literal[False] = False, hint: str = ""
    ) -> T: ...

    @overload
    def _call(self, what: str, call: Callable[[], T], *, missing_ok: bool, hint: str = "") -> T | None: ...

    def _call(
        self, what: str, call: Callable[[], T], *, missing_ok: bool = False, hint: str = ""
    ) -> T | None:
        """The one mapping from the client's failures to this door's error: every call goes through it.

        ``missing_ok``: a 404 is an answer (``None``), not a failure. Anything else the client or the
        connection raises is ``KubernetesUnavailable`` naming ``what`` (temporary: callers retry or
        answer 503)."""
        error: Exception
        try:
            return self._within(what, call)
        except ApiException as exc:
            if missing_ok and exc.status == 404:
                return None
            error = exc
        except (HTTPError, OSError, ValueError, TypeError) as exc:  # ValueError: an HTML body
            error = exc
        suffix = f" ({hint})" if hint else ""
        raise KubernetesUnavailable(f"{what} failed: {_why(error)}{suffix}") from error

    def _within(self, what: str, call: Callable[[], T]) -> T:
        """``call`` with one deadline for the whole exchange: the client's own timeout applies per
        socket read, so a server trickling bytes could hold it much longer."""
        future = _CALLS.submit(self._bounded, call)
        try:
            return future.result(self.timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise KubernetesUnavailable(
                f"{what}: no complete answer from the Kubernetes API within {self.timeout:g}s"
            ) from None

    def _bounded(self, call: Callable[[], T]) -> T:
        """In the worker: the answer's socket is shut down at the deadline (headers included), so a
        trickling server cannot keep the worker after the caller stopped waiting."""
        with watchdog.within(self.timeout + 0.5):
            return call()

    def close(self) -> None:
        self._api_client.close()


_CALLS = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="kube-call")
"""Runs Kubernetes calls so the caller can stop waiting at the deadline (a stuck call ends at the
client's own socket timeout)."""


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _items(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A list answer's objects; anything that is not an object is skipped (never a traceback)."""
    items = body.get("items")
    return [i for i in items if isinstance(i, Mapping)] if isinstance(items, list) else []


def _resource_attributes(attrs: Mapping[str, str] | None) -> client.V1ResourceAttributes | None:
    if not attrs:
        return None
    return client.V1ResourceAttributes(
        verb=attrs.get("verb"),
        group=attrs.get("group"),
        version=attrs.get("version"),
        resource=attrs.get("resource"),
        subresource=attrs.get("subresource"),
        name=attrs.get("name"),
        namespace=attrs.get("namespace"),
    )


def _pod(raw: Mapping[str, Any]) -> PodRecord:
    meta = raw.get("metadata") or {}
    status = raw.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    return PodRecord(
        namespace=sys.intern(meta.get("namespace", "")),
        name=meta.get("name", ""),
        labels=_shared_labels(meta.get("labels") or {}),
        phase=sys.intern(status.get("phase", "")),
        ready=ready,
        deleting=bool(meta.get("deletionTimestamp")),
    )


def _quantity(text: object) -> float:
    try:
        return parse_quantity(text)  # type: ignore[arg-type]
    except (ValueError, TypeError):
        return 0.0


def _pod_detail(raw: Mapping[str, Any]) -> PodDetail:
    meta = raw.get("metadata") or {}
    status = raw.get("status") or {}
    cond = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    requests: dict[str, int] = {}
    for c in (raw.get("spec") or {}).get("containers") or []:
        for resource, qty in ((c.get("resources") or {}).get("requests") or {}).items():
            milli = to_milli(_quantity(qty))
            requests[resource] = requests.get(resource, 0) + milli
            requests[f"{c.get('name', '')}/{resource}"] = milli
    start = status.get("startTime")
    transition = (cond or {}).get("lastTransitionTime")
    return PodDetail(
        name=meta.get("name", ""),
        labels=dict(meta.get("labels") or {}),
        phase=status.get("phase", ""),
        ready=bool(cond and cond.get("status") == "True"),
        has_ready_condition=cond is not None,
        deleting=bool(meta.get("deletionTimestamp")),
        start_time=timefmt.parse_time(start, now=0.0) if start else None,
        ready_transition=timefmt.parse_time(transition, now=0.0) if transition else None,
        requests=requests,
    )


_LABEL_SETS: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}


def _shared_labels(labels: Mapping[str, str]) -> Mapping[str, str]:
    """One read-only mapping per distinct label set: the pods of a ReplicaSet carry identical labels,
    so 50,000 pods hold a few hundred mappings, not 50,000 dicts."""
    key = tuple(sorted(labels.items()))
    shared = _LABEL_SETS.get(key)
    if shared is None:
        if len(_LABEL_SETS) >= 200_000:  # bounded: a churn of unique label sets cannot grow it forever
            _LABEL_SETS.clear()
        shared = _LABEL_SETS[key] = MappingProxyType({sys.intern(k): v for k, v in key})
    return shared


def _why(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason}".strip()
    return neterror.cause(exc)
