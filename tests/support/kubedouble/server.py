"""HTTP front of the double: routing, REST verbs, watches, evictions, reviews and fault injection.

Routes (``{ns}`` = namespace; cluster-wide lists exist for namespaced kinds too):

    /api/v1/nodes[/{name}]                       get list watch patch update create delete
    /api/v1[/namespaces/{ns}]/pods[/{name}]      get list watch patch update create delete
    /api/v1/namespaces/{ns}/pods/{name}/eviction POST policy/v1 Eviction (PDBs respected: 429)
    /api/v1[/namespaces/{ns}]/configmaps[/{name}] and /events[/{name}]
    /apis/events.k8s.io/v1[/namespaces/{ns}]/events
    /apis/policy/v1[/namespaces/{ns}]/poddisruptionbudgets[/{name}]   (status computed on read)
    /apis/nvidia.com/v1/clusterpolicies[/{name}]  (custom resource: merge/JSON patch only, like a CRD)
    /apis/autoscaling/v2[/namespaces/{ns}]/horizontalpodautoscalers[/{name}]
    /apis/metrics.k8s.io/v1beta1[/namespaces/{ns}]/pods[/{name}]  (PodMetrics, as metrics-server)
    /apis/apps/v1[/namespaces/{ns}]/daemonsets[/{name}]
    /apis/apiregistration.k8s.io/v1/apiservices[/{name}]
    /apis/authentication.k8s.io/v1/tokenreviews  POST
    /apis/authorization.k8s.io/v1/subjectaccessreviews POST
    /version, /healthz
"""

from __future__ import annotations

import copy
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.support.kubedouble import admission, patching, selectors
from tests.support.kubedouble.discovery import discovery
from tests.support.kubedouble.disruption import check_eviction, record_disruption
from tests.support.kubedouble.errors import REASONS, ApiError
from tests.support.kubedouble.store import Kind, Store, find_kind, now_rfc3339, storage_key

_CORE = re.compile(
    r"^/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?/?$"
)
_GROUP = re.compile(
    r"^/apis/(?P<group>[^/]+)/(?P<version>[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>[a-z]+))?/?$"
)
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

MAX_REQUEST_BYTES = 3 * 1024 * 1024
"""k8s.io/apiserver ``server/config.go``: ``MaxRequestBodyBytes = 3 * 1024 * 1024`` (413 beyond)."""
MAX_CONFIGMAP_BYTES = 1024 * 1024
"""pkg/apis/core/validation ``ValidateConfigMap``: data + binaryData at most ``core.MaxSecretSize``."""

KNOWN_FIELDS: dict[str, frozenset[str]] = {
    "Node": frozenset({"apiVersion", "kind", "metadata", "spec", "status"}),
    "Pod": frozenset({"apiVersion", "kind", "metadata", "spec", "status"}),
    "ConfigMap": frozenset({"apiVersion", "kind", "metadata", "data", "binaryData", "immutable"}),
    "Namespace": frozenset({"apiVersion", "kind", "metadata", "spec", "status"}),
    "PodDisruptionBudget": frozenset({"apiVersion", "kind", "metadata", "spec", "status"}),
    "ReplicaSet": frozenset({"apiVersion", "kind", "metadata", "spec", "status"}),
    "Lease": frozenset({"apiVersion", "kind", "metadata", "spec"}),
    "ClusterPolicy": frozenset({"apiVersion", "kind", "metadata", "spec", "status"}),
}
"""Top-level fields each kind has; others are dropped on write (the decoder drops unknown fields of
built-in types, ``fieldValidation=Warn`` being the default since v1.27; a structural CRD schema
prunes them)."""
GENERATED = frozenset({"Deployment", "StatefulSet", "ReplicaSet", "Job", "CronJob", "DaemonSet"})
"""Kinds whose ``metadata.generation`` counts spec changes (controllers report ``observedGeneration``)."""
KNOWN_METADATA = frozenset(
    {
        "name", "generateName", "namespace", "uid", "resourceVersion", "generation",
        "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
        "annotations", "ownerReferences", "finalizers", "managedFields", "selfLink",
    }
)  # fmt: skip


@dataclass
class Fault:
    """Answer matching requests with ``status`` instead of serving them: after letting ``skip`` of
    them through, the next ``count`` (``None``: every one from then on).

    A 429 or 503 carries ``Retry-After: retry_after_s`` when set (API Priority and Fairness sends
    ``Retry-After`` with its 429s; an API server shutting down or overloaded answers 503/500/504).
    """

    status: int
    method: str = "*"
    path_contains: str = ""
    count: int | None = 1
    message: str = "injected fault"
    skip: int = 0
    retry_after_s: int | None = None
    hits: int = 0


@dataclass(frozen=True)
class Rule:
    subject: str  # user name or group name; "*" = anyone
    verb: str = "*"
    resource: str = "*"
    group: str = "*"
    namespace: str = "*"
    subresource: str = "*"
    name: str = "*"
    path: str | None = None  # non-resource URL (``/metrics``, ``/apis/*``)

    def matches(self, subjects: set[str], attrs: dict[str, Any], non_resource: bool) -> bool:
        if self.subject != "*" and self.subject not in subjects:
            return False
        if self.verb not in ("*", attrs.get("verb", "")):
            return False
        if non_resource:
            if self.path is None:
                return False
            want = attrs.get("path", "")
            return self.path == want or (self.path.endswith("*") and want.startswith(self.path[:-1]))
        if self.path is not None:
            return False
        return all(
            getattr(self, f) in ("*", attrs.get(f, "") or "")
            for f in ("resource", "group", "namespace", "subresource", "name")
        )


@dataclass
class AuthConfig:
    tokens: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    extras: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    """TokenReview ``status.user.extra`` per token (a service account token carries its pod's name)."""
    rules: list[Rule] = field(default_factory=list)
    require_token: bool = False
    enforce_rules: bool = False

    def allowed(self, user: str, groups: list[str], attrs: dict[str, Any], non_resource: bool) -> bool:
        subjects = {user, *groups}
        return any(r.matches(subjects, attrs, non_resource) for r in self.rules)


def validate_labels(obj: dict[str, Any], kind: Kind) -> None:
    meta = obj.get("metadata", {})
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, name = key.rpartition("/")
        bad_key = (
            not name
            or len(name) > 63
            or not _LABEL_NAME.match(name)
            or (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)))
        )
        if bad_key:
            raise ApiError(
                422,
                "Invalid",
                f'{kind.kind} "{meta.get("name")}" is invalid: metadata.labels: Invalid value: "{key}"',
            )
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_NAME.match(value):
            raise ApiError(
                422,
                "Invalid",
                f'{kind.kind} "{meta.get("name")}" is invalid: metadata.labels: Invalid value: "{value}": '
                "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                "and must start and end with an alphanumeric character (at most 63 characters)",
            )
    for key, value in (meta.get("annotations") or {}).items():
        if not isinstance(value, str):
            raise ApiError(422, "Invalid", f"metadata.annotations[{key}]: must be a string")


class Api:
    """The API semantics, independent of HTTP (the handler below only parses and writes)."""

    def __init__(
        self,
        store: Store,
        auth: AuthConfig,
        *,
        pod_termination_s: float = 0.0,
        bookmark_interval_s: float = 60.0,
    ) -> None:
        self.store = store
        self.auth = auth
        self.faults: list[Fault] = []
        self.pod_termination_s = pod_termination_s
        self.bookmark_interval_s = bookmark_interval_s
        self.bookmarks_sent: list[int] = []
        self.expire_watches: int | None = 0
        """Watches still to be answered with an in-stream 410 whatever their resourceVersion
        (``None``: all); see ``KubeDouble.expire_watches``."""
        self.request_log: list[tuple[str, str]] = []
        self._timers: list[threading.Timer] = []
        self.admission: list[admission.Bound] = []
        """ValidatingAdmissionPolicies with their Deny bindings (``KubeDouble.load_admission_policies``)."""

    # -- faults --------------------------------------------------------------------------------
    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.store.lock:
            for f in self.faults:
                if not (f.method in ("*", method) and f.path_contains in path):
                    continue
                f.hits += 1
                if f.hits <= f.skip:
                    continue
                if f.count is None:
                    return f
                if f.count > 0:
                    f.count -= 1
                    return f
        return None

    def decorate(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        return obj

    # -- pods ----------------------------------------------------------------------------------
    def delete_pod(self, ns: str, name: str, *, verb: str, grace_s: float | None = None) -> dict[str, Any]:
        """Graceful deletion (``registry/rest/delete.go`` ``BeforeDelete``): a pod bound to a node gets
        ``deletionTimestamp`` and keeps running (and holding its devices) until the kubelet has
        stopped it, here ``pod_termination_s`` later; ``gracePeriodSeconds: 0`` or an unbound pod
        goes at once (``pod/strategy.go`` ``CheckGracefulDelete``)."""
        pod = self.store.get("/pods", ns, name)
        if pod is None:
            raise ApiError(
                404, "NotFound", f'pods "{name}" not found', details={"name": name, "kind": "pods"}
            )
        self.store.record(verb, "pods", ns, name, node=pod.get("spec", {}).get("nodeName", ""))
        wait = self.pod_termination_s if grace_s is None else min(grace_s, self.pod_termination_s)
        if pod["metadata"].get("deletionTimestamp"):
            return pod  # already terminating: a second delete changes nothing
        if wait <= 0 or not pod.get("spec", {}).get("nodeName"):
            self.store.remove("/pods", ns, name)
            return pod

        def mark(o: dict[str, Any]) -> None:
            o["metadata"].setdefault("deletionTimestamp", now_rfc3339())
            o["metadata"]["deletionGracePeriodSeconds"] = max(1, int(self.pod_termination_s))

        marked = self.store.update("/pods", ns, name, mark) or pod
        timer = threading.Timer(wait, self._gone, (ns, name, pod["metadata"].get("uid")))
        timer.daemon = True
        timer.start()
        self._timers.append(timer)
        return marked

    def _gone(self, ns: str, name: str, uid: str | None) -> None:
        """The kubelet has stopped the pod: it leaves the store (and releases its devices)."""
        with self.store.lock:
            current = self.store.get("/pods", ns, name)
            if current is not None and current["metadata"].get("uid") == uid and not self.store.closed:
                self.store.remove("/pods", ns, name)

    def evict(self, ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """``pkg/registry/core/pod/storage/eviction.go`` ``EvictionREST.Create`` (PDB rules in
        :mod:`tests.support.kubedouble.disruption`)."""
        if body.get("kind") not in (None, "Eviction"):
            raise ApiError(400, "BadRequest", f"expected an Eviction body, got kind {body.get('kind')!r}")
        if (body.get("metadata") or {}).get("name") not in (None, name):
            # eviction.go: ``if name != eviction.Name`` → NewBadRequest
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
        with self.store.lock:
            pod = self.store.get("/pods", ns, name)
            if pod is None:
                raise ApiError(
                    404, "NotFound", f'pods "{name}" not found', details={"name": name, "kind": "pods"}
                )
            try:
                _, pdb = check_eviction(self.store, pod)
            except ApiError as err:
                self.store.record("evict-refused", "pods", ns, name, code=err.code, message=err.message)
                raise
            if pdb is not None:
                record_disruption(self.store, pdb, name)
            grace = (body.get("deleteOptions") or {}).get("gracePeriodSeconds")
            self.delete_pod(ns, name, verb="evict", grace_s=None if grace is None else float(grace))
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    # -- reviews -------------------------------------------------------------------------------
    def token_review(self, body: dict[str, Any]) -> dict[str, Any]:
        token = body.get("spec", {}).get("token", "")
        out = copy.deepcopy(body)
        found = self.auth.tokens.get(token)
        if found is None:
            out["status"] = {"authenticated": False, "error": "invalid bearer token"}
        else:
            user, groups = found
            out["status"] = {
                "authenticated": True,
                "user": {
                    "username": user,
                    "uid": f"uid-{user}",
                    "groups": list(groups),
                    "extra": {k: list(v) for k, v in self.auth.extras.get(token, {}).items()},
                },
                "audiences": body.get("spec", {}).get("audiences") or [],
            }
        return out

    def subject_access_review(self, body: dict[str, Any]) -> dict[str, Any]:
        spec = body.get("spec", {})
        # pkg/apis/authorization/validation ValidateSubjectAccessReviewSpec
        has_res, has_non = bool(spec.get("resourceAttributes")), bool(spec.get("nonResourceAttributes"))
        if has_res == has_non:
            raise ApiError(
                422,
                "Invalid",
                "SubjectAccessReview.authorization.k8s.io is invalid: spec.resourceAttributes: Invalid value: "
                '"null": exactly one of nonResourceAttributes or resourceAttributes must be specified',
            )
        if not spec.get("user") and not spec.get("groups"):
            raise ApiError(
                422,
                "Invalid",
                "SubjectAccessReview.authorization.k8s.io is invalid: spec.user: Invalid value: "
                '"": at least one of user or group must be specified',
            )
        non_resource = "nonResourceAttributes" in spec and "resourceAttributes" not in spec
        attrs = spec.get("nonResourceAttributes" if non_resource else "resourceAttributes") or {}
        allowed = self.auth.allowed(spec.get("user", ""), list(spec.get("groups") or []), attrs, non_resource)
        out = copy.deepcopy(body)
        out["status"] = {"allowed": allowed}
        if not allowed:
            out["status"]["reason"] = f"no rule allows {spec.get('user', '')!r} to {attrs.get('verb', '')}"
        self.store.record(
            "review", "subjectaccessreviews", "", spec.get("user", ""), attrs=attrs, allowed=allowed
        )
        return out

    def close(self) -> None:
        for t in self._timers:
            t.cancel()


def prune_unknown(obj: dict[str, Any], kind: Kind) -> None:
    known = KNOWN_FIELDS.get(kind.kind)
    if known is not None:
        for key in [k for k in obj if k not in known]:
            del obj[key]
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        for key in [k for k in meta if k not in KNOWN_METADATA]:
            del meta[key]


def validate_size(obj: dict[str, Any], kind: Kind) -> None:
    if kind.kind != "ConfigMap":
        return
    total = sum(len(k) + len(str(v).encode()) for k, v in (obj.get("data") or {}).items())
    total += sum(len(k) + len(str(v)) * 3 // 4 for k, v in (obj.get("binaryData") or {}).items())
    if total > MAX_CONFIGMAP_BYTES:
        raise ApiError(
            422,
            "Invalid",
            f'ConfigMap "{obj["metadata"].get("name")}" is invalid: []: Too long: '
            f"must have at most {MAX_CONFIGMAP_BYTES} bytes",
        )


Route = tuple[Kind, str, str, str]  # kind, namespace, name, subresource


def route(path: str) -> Route:
    m = _CORE.match(path)
    group, version = "", "v1"
    if m is None:
        m = _GROUP.match(path)
        if m is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        group, version = m.group("group"), m.group("version")
    kind = find_kind(group, version, m.group("plural"))
    if kind is None:
        raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
    return kind, m.group("ns") or "", urllib.parse.unquote(m.group("name") or ""), m.group("sub") or ""


def make_handler(api: Api) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall
        _raw = b""

        def log_message(self, format: str, *args: Any) -> None:  # quiet: tests read the journal instead
            pass

        # -- plumbing ---------------------------------------------------------------------------
        def _send(self, code: int, body: dict[str, Any], *, retry_after_s: int | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            if retry_after_s is not None:
                self.send_header("Retry-After", str(retry_after_s))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _read_body(self) -> bytes:
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():  # kubectl streams stdin
                out = b""
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return out
                    out += self.rfile.read(size)
                    self.rfile.readline()
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_REQUEST_BYTES:
                self.close_connection = True  # the rest of the body is not read
                return b"\0" * (MAX_REQUEST_BYTES + 1)
            return self.rfile.read(length) if length else b""

        def _body(self) -> Any:
            raw = self._raw
            if not raw:
                return {}
            try:
                return json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ApiError(400, "BadRequest", f"request body is not JSON: {exc}") from exc

        def _user(self) -> tuple[str, list[str]]:
            header = self.headers.get("Authorization", "")
            token = header[7:].strip() if header.lower().startswith("bearer ") else ""
            found = api.auth.tokens.get(token)
            if found is None:
                if api.auth.require_token:
                    raise ApiError(401, "Unauthorized", "Unauthorized")
                return "system:anonymous", ["system:unauthenticated"]
            return found[0], list(found[1])

        def _dispatch(self, method: str) -> None:
            self._raw = self._read_body()  # always drained, so keep-alive connections stay in sync
            parsed = urllib.parse.urlsplit(self.path)
            query = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query, keep_blank_values=True).items()}
            api.request_log.append((method, self.path))
            try:
                if len(self._raw) > MAX_REQUEST_BYTES:
                    raise ApiError(
                        413,
                        "RequestEntityTooLarge",
                        f"Request entity too large: limit is {MAX_REQUEST_BYTES}",
                    )
                fault = api.take_fault(method, parsed.path)
                if fault is not None:
                    reason = REASONS.get(fault.status, "InternalError")
                    raise ApiError(fault.status, reason, fault.message, retry_after_s=fault.retry_after_s)
                if parsed.path == "/version":
                    self._send(200, {"major": "1", "minor": "32", "gitVersion": "v1.32.0-kubedouble"})
                    return
                if parsed.path in ("/healthz", "/readyz", "/livez"):
                    self._send(200, {"status": "ok"})
                    return
                found = discovery(parsed.path) if method == "GET" else None
                if found is not None:
                    self._send(200, found)
                    return
                user, groups = self._user()
                kind, ns, name, sub = route(parsed.path)
                watching = query.get("watch", "").lower() in ("true", "1")
                verb = {
                    "GET": "watch" if watching else ("get" if name else "list"),
                    "POST": "create",
                    "PUT": "update",
                    "PATCH": "patch",
                    "DELETE": "delete",
                }[method]
                if api.auth.enforce_rules:  # reviews too: system:auth-delegator grants their create
                    attrs = {
                        "verb": verb,
                        "resource": kind.plural,
                        "group": kind.group,
                        "namespace": ns,
                        "subresource": sub,
                        "name": name,
                    }
                    if not api.auth.allowed(user, groups, attrs, non_resource=False):
                        raise ApiError(
                            403, "Forbidden", f'User "{user}" cannot {verb} resource "{kind.plural}"'
                        )
                handler = getattr(self, f"_{method.lower()}")
                handler(kind, ns, name, sub, query)
            except ApiError as err:
                self._send(err.code, err.status(), retry_after_s=err.retry_after_s)
            except (selectors.SelectorError, patching.PatchError) as err:
                code, reason = (
                    (400, "BadRequest") if isinstance(err, selectors.SelectorError) else (422, "Invalid")
                )
                self._send(code, ApiError(code, reason, str(err)).status())
            except (BrokenPipeError, ConnectionResetError):
                pass

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def do_PUT(self) -> None:
            self._dispatch("PUT")

        def do_PATCH(self) -> None:
            self._dispatch("PATCH")

        def do_DELETE(self) -> None:
            self._dispatch("DELETE")

        # -- verbs ------------------------------------------------------------------------------
        def _existing(self, kind: Kind, ns: str, name: str) -> dict[str, Any]:
            obj = api.store.get(storage_key(kind), ns, name)
            if obj is None:
                raise ApiError(
                    404,
                    "NotFound",
                    f'{kind.plural}.{kind.group or "core"} "{name}" not found'.replace(".core", ""),
                    details={"name": name, "group": kind.group, "kind": kind.plural},
                )
            return obj

        def _get(self, kind: Kind, ns: str, name: str, sub: str, query: dict[str, str]) -> None:
            if name:
                self._send(200, api.decorate(kind, self._existing(kind, ns, name)))
                return
            label_pred = selectors.parse_label_selector(query.get("labelSelector"))
            field_pred = selectors.parse_field_selector(query.get("fieldSelector"))

            def matches(o: dict[str, Any]) -> bool:
                return label_pred(o.get("metadata", {}).get("labels") or {}) and field_pred(o)

            if query.get("watch", "").lower() in ("true", "1"):
                self._watch(kind, ns, matches, query)
                return
            with api.store.lock:
                items = [
                    api.decorate(kind, o) for o in api.store.list(storage_key(kind), ns or None) if matches(o)
                ]
                rv = api.store.resource_version
            meta: dict[str, Any] = {"resourceVersion": str(rv)}
            limit = int(query.get("limit") or 0)
            if limit > 0:  # pagination: continue = offset of the next page (the real one is opaque)
                offset = int(query.get("continue") or 0)
                if offset + limit < len(items):
                    meta["continue"] = str(offset + limit)
                    meta["remainingItemCount"] = len(items) - offset - limit
                items = items[offset : offset + limit]
            self._send(
                200,
                {
                    "kind": f"{kind.kind}List",
                    "apiVersion": kind.api_version,
                    "metadata": meta,
                    "items": items,
                },
            )

        def _watch(
            self, kind: Kind, ns: str, matches: Callable[[dict[str, Any]], bool], query: dict[str, str]
        ) -> None:
            timeout = float(query.get("timeoutSeconds") or 3600)
            deadline = time.monotonic() + timeout
            skey = storage_key(kind)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def write_event(event: dict[str, Any]) -> None:
                line = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                self.wfile.flush()

            def emit(kind_name: str, obj: dict[str, Any]) -> None:
                write_event({"type": kind_name, "object": api.decorate(kind, obj)})

            def bookmark(rv: int) -> None:
                # BOOKMARK: an object of the watched kind holding only metadata.resourceVersion
                # (apiserver ``storage/cacher``: sent when allowWatchBookmarks=true, about once a
                # minute — ``bookmark_interval_s`` here — and before the watch times out).
                api.bookmarks_sent.append(rv)
                write_event(
                    {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": kind.kind,
                            "apiVersion": kind.api_version,
                            "metadata": {"resourceVersion": str(rv)},
                        },
                    }
                )

            bookmarks = query.get("allowWatchBookmarks", "").lower() in ("true", "1")
            start = query.get("resourceVersion", "")
            with api.store.lock:
                if start in ("", "0"):
                    last = api.store.resource_version
                    initial = [o for o in api.store.list(skey, ns or None) if matches(o)]
                else:
                    last, initial = int(start), []
                    forced = api.expire_watches is None or api.expire_watches > 0
                    if forced and api.expire_watches is not None:
                        api.expire_watches -= 1
                    if last < api.store.compacted_rv or forced:
                        # storage/cacher watch_cache.go: a resourceVersion older than the cache's
                        # window → "too old resource version" as an in-stream ERROR (410 Expired)
                        gone = ApiError(
                            410,
                            "Expired",
                            f"too old resource version: {last} ({api.store.compacted_rv + 1})",
                        )
                        write_event({"type": "ERROR", "object": gone.status()})
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                        self.close_connection = True
                        return
            for obj in initial:
                emit("ADDED", obj)
            next_bookmark = time.monotonic() + api.bookmark_interval_s
            while time.monotonic() < deadline and not api.store.closed:
                with api.store.changed:
                    if api.store.resource_version <= last:
                        api.store.changed.wait(timeout=min(0.05, max(0.0, deadline - time.monotonic())))
                    # fell out of the window while streaming: None
                    behind = last < api.store.compacted_rv or api.expire_watches is None
                    pending = None if behind else list(api.store.events_after(last))
                if pending is None:
                    gone = ApiError(
                        410, "Expired", f"too old resource version: {last} ({api.store.compacted_rv + 1})"
                    )
                    write_event({"type": "ERROR", "object": gone.status()})
                    break
                for ev in pending:
                    last = ev.rv
                    if ev.skey != skey:
                        continue
                    if ns and ev.obj.get("metadata", {}).get("namespace") != ns:
                        continue
                    if matches(ev.obj):
                        emit(ev.type, ev.obj)
                if bookmarks and time.monotonic() >= next_bookmark:
                    bookmark(last)
                    next_bookmark = time.monotonic() + api.bookmark_interval_s
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            self.close_connection = True

        def _prepare_new(self, kind: Kind, ns: str, body: dict[str, Any]) -> dict[str, Any]:
            if not isinstance(body, dict):
                raise ApiError(400, "BadRequest", "body must be a JSON object")
            meta = body.setdefault("metadata", {})
            if not meta.get("name"):
                if meta.get("generateName"):
                    meta["name"] = f"{meta['generateName']}{api.store.resource_version + 1:x}"
                else:
                    raise ApiError(
                        422, "Invalid", f"{kind.kind}: metadata.name: Required value: name is required"
                    )
            if kind.namespaced:
                if meta.get("namespace") not in (None, "", ns):
                    raise ApiError(
                        400,
                        "BadRequest",
                        "the namespace of the provided object does not match the namespace sent on the request",
                    )
                meta["namespace"] = ns
            body.pop("status", None) if kind.plural == "poddisruptionbudgets" else None
            body["apiVersion"], body["kind"] = kind.api_version, kind.kind
            if kind.kind in GENERATED:
                meta["generation"] = 1
            prune_unknown(body, kind)
            validate_labels(body, kind)
            validate_size(body, kind)
            return body

        def _post(self, kind: Kind, ns: str, name: str, sub: str, query: dict[str, str]) -> None:
            body = self._body()
            if kind.plural == "pods" and sub == "eviction":
                self._send(201, api.evict(ns, name, body))
                return
            if kind.plural == "tokenreviews":
                self._send(201, api.token_review(body))
                return
            if kind.plural == "subjectaccessreviews":
                self._send(201, api.subject_access_review(body))
                return
            if name or sub:
                raise ApiError(405, "MethodNotAllowed", "POST is only allowed on collections")
            obj = self._prepare_new(kind, ns, body)
            obj["metadata"].pop("resourceVersion", None)
            with api.store.lock:
                if api.store.get(storage_key(kind), ns, obj["metadata"]["name"]) is not None:
                    raise ApiError(
                        409,
                        "AlreadyExists",
                        f'{kind.plural} "{obj["metadata"]["name"]}" already exists',
                        details={"name": obj["metadata"]["name"], "kind": kind.plural},
                    )
                if query.get("dryRun") == "All":
                    self._send(201, api.decorate(kind, obj))
                    return
                stored = api.store.put(storage_key(kind), obj, event="ADDED")
                api.store.record("create", kind.plural, ns, obj["metadata"]["name"], body=copy.deepcopy(body))
            self._send(201, api.decorate(kind, stored))

        def _put(self, kind: Kind, ns: str, name: str, sub: str, query: dict[str, str]) -> None:
            body = self._body()
            with api.store.lock:
                current = self._existing(kind, ns, name)
                obj = self._prepare_new(kind, ns, body)
                if obj["metadata"]["name"] != name:
                    raise ApiError(
                        400, "BadRequest", "the name of the object does not match the name on the URL"
                    )
                self._check_rv(kind, name, obj, current)
                self._store_update(kind, ns, name, obj, current, verb="update", body=body, query=query)

        def _check_rv(self, kind: Kind, name: str, obj: dict[str, Any], current: dict[str, Any]) -> None:
            sent = obj.get("metadata", {}).get("resourceVersion")
            if sent and sent != current["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind.plural} "{name}": the object has been modified; '
                    "please apply your changes to the latest version and try again",
                    details={"name": name, "kind": kind.plural},
                )

        def _store_update(
            self,
            kind: Kind,
            ns: str,
            name: str,
            obj: dict[str, Any],
            current: dict[str, Any],
            *,
            verb: str,
            body: Any,
            query: dict[str, str],
        ) -> None:
            for keep in ("uid", "creationTimestamp", "deletionTimestamp"):
                if keep in current["metadata"]:
                    obj["metadata"][keep] = current["metadata"][keep]
            prune_unknown(obj, kind)
            validate_labels(obj, kind)
            validate_size(obj, kind)
            if kind.kind in GENERATED and obj.get("spec") != current.get("spec"):
                # the registry strategies' PrepareForUpdate: a spec change bumps metadata.generation
                obj["metadata"]["generation"] = int(current["metadata"].get("generation") or 1) + 1
            if kind.kind == "Job" and (obj.get("spec") or {}).get("template") != (
                current.get("spec") or {}
            ).get("template"):  # pkg/apis/batch/validation: the pod template of a Job is immutable
                raise ApiError(
                    422,
                    "Invalid",
                    f'Job.batch "{name}" is invalid: spec.template: Invalid value: field is immutable',
                )
            if api.admission:  # validating admission, after the registry's own changes
                admission.admit(api.admission, kind, self._user()[0], current, obj)
            if query.get("dryRun") == "All":
                self._send(200, api.decorate(kind, obj))
                return
            same = api.store.unchanged(storage_key(kind), obj)
            if same is not None:  # nothing changed: no new resourceVersion, no MODIFIED event
                api.store.record(verb, kind.plural, ns, name, body=copy.deepcopy(body), noop=True)
                self._send(200, api.decorate(kind, same))
                return
            stored = api.store.put(storage_key(kind), obj, event="MODIFIED")
            api.store.record(verb, kind.plural, ns, name, body=copy.deepcopy(body))
            self._send(200, api.decorate(kind, stored))

        def _patch(self, kind: Kind, ns: str, name: str, sub: str, query: dict[str, str]) -> None:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            body = self._body()
            if kind.group == "nvidia.com" and ctype == patching.STRATEGIC:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    "the body of the request was in an unknown format - accepted media types include: "
                    "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                )
            if ctype not in (patching.STRATEGIC, patching.MERGE, patching.JSON_PATCH):
                raise ApiError(415, "UnsupportedMediaType", f"unsupported patch content type {ctype!r}")
            with api.store.lock:
                current = self._existing(kind, ns, name)
                obj = patching.apply_patch(current, body, ctype)
                self._check_rv(kind, name, obj, current)
                obj["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                obj["metadata"]["name"], obj["metadata"]["namespace"] = (
                    name,
                    current["metadata"].get("namespace"),
                )
                if not kind.namespaced:
                    obj["metadata"].pop("namespace", None)
                self._store_update(kind, ns, name, obj, current, verb="patch", body=body, query=query)

        def _delete(self, kind: Kind, ns: str, name: str, sub: str, query: dict[str, str]) -> None:
            if not name:
                raise ApiError(405, "MethodNotAllowed", "deleting collections is not supported by the double")
            if kind.plural == "pods":
                opts = json.loads(self._raw) if self._raw.strip() else {}
                grace = (opts.get("gracePeriodSeconds") if isinstance(opts, dict) else None) or query.get(
                    "gracePeriodSeconds"
                )
                deleted = api.delete_pod(
                    ns, name, verb="delete", grace_s=None if grace is None else float(grace)
                )
                self._send(200, api.decorate(kind, deleted))
                return
            with api.store.lock:
                self._existing(kind, ns, name)
                gone = api.store.remove(storage_key(kind), ns, name)
                api.store.record("delete", kind.plural, ns, name)
            self._send(200, api.decorate(kind, gone or {}))

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
