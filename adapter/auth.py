"""Who is asking, and may they? Authentication and authorisation as a Kubernetes aggregated API
server does them.

Authentication, in kube-apiserver's order:

1. **Request header** — ``X-Remote-User`` / ``X-Remote-Group`` / ``X-Remote-Extra-*`` are believed
   only when the TLS client certificate was issued by a CA in ``--requestheader-client-ca-file``
   *and* its CN is in ``--requestheader-allowed-names`` (empty list = any CN from that CA). That is
   how the aggregation layer (kube-apiserver's proxy client certificate) passes the user along.
   Headers arriving any other way are ignored — a spoofed ``X-Remote-User`` on a plain TLS
   connection authenticates nobody.
2. **Client certificate** issued by ``--client-ca-file``: user = CN, groups = O.
3. **Bearer token** → TokenReview (cached for ``token_ttl`` seconds).

No identity → 401. Authorisation: SubjectAccessReview per (user, groups, attributes), allowed and
denied answers cached for ``ttl`` seconds; ``none`` allows everything (local use only).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID

from adapter import nowait
from adapter.api import RequestInfo
from adapter.errors import ConfigError, Forbidden, Unauthorized
from adapter.kube import KubeClient, ReviewedUser


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] | None = None
    uid: str = ""
    via: str = ""
    """How the identity was established: requestheader, x509, token, or anonymous."""


@dataclass(frozen=True)
class RequestHeaderSettings:
    ca_certs: tuple[x509.Certificate, ...]
    allowed_names: frozenset[str]
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)


def load_pem_certs(pem: bytes, *, source: str) -> tuple[x509.Certificate, ...]:
    try:
        certs = tuple(x509.load_pem_x509_certificates(pem))
    except ValueError as exc:
        raise ConfigError(f"{source}: not a PEM certificate bundle ({exc})") from exc
    if not certs:
        raise ConfigError(f"{source}: holds no certificate")
    return certs


@functools.lru_cache(maxsize=1024)
def _issued_by(cert: x509.Certificate, cas: tuple[x509.Certificate, ...]) -> bool:
    """Whether a CA in ``cas`` signed ``cert`` (memoised: a proxy reuses one certificate).

    Keyed by the certificates themselves: ``x509.Certificate`` hashes and compares by its DER bytes,
    so a different certificate is a different key. (A SHA-256 fingerprint as the key cost 7 µs in a
    tight loop and 80 µs per request when paced, OpenSSL's digest fetch included, for nothing.)"""
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, InvalidSignature):
            continue
        return True
    return False


def _common_name(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else ""


def _header_values(headers: Mapping[str, list[str]], names: Iterable[str]) -> list[str]:
    lowered = {k.lower(): v for k, v in headers.items()}
    out: list[str] = []
    for name in names:
        out += [v for v in lowered.get(name.lower(), []) if v]
    return out


class Authenticator:
    def __init__(
        self,
        *,
        requestheader: RequestHeaderSettings | None,
        client_cas: tuple[x509.Certificate, ...] = (),
        kube: KubeClient | None = None,
        token_ttl: float = 10.0,
        allow_anonymous: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._rh = requestheader
        self._client_cas = client_cas
        self._kube = kube
        self._token_ttl = token_ttl
        self._anonymous = allow_anonymous
        self._clock = clock
        self._tokens: dict[str, tuple[float, ReviewedUser | None]] = {}
        self._lock = threading.Lock()

    def authenticate(self, *, peer_cert: x509.Certificate | None, headers: Mapping[str, list[str]]) -> User:
        """The requester, or ``Unauthorized`` naming why (never trusting unverified headers)."""
        reasons: list[str] = []
        if peer_cert is not None and self._rh is not None and _issued_by(peer_cert, self._rh.ca_certs):
            cn = _common_name(peer_cert)
            if self._rh.allowed_names and cn not in self._rh.allowed_names:
                raise Unauthorized(
                    f"client certificate CN {cn!r} is not in --requestheader-allowed-names; "
                    "request headers from it are not trusted"
                )
            users = _header_values(headers, self._rh.username_headers)
            if users:
                groups = tuple(_header_values(headers, self._rh.group_headers))
                return User(users[0], groups, self._extra(headers), via="requestheader")
            reasons.append("the front-proxy certificate sent no X-Remote-User")
        if peer_cert is not None and self._client_cas and _issued_by(peer_cert, self._client_cas):
            orgs = peer_cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
            return User(_common_name(peer_cert), tuple(str(o.value) for o in orgs), via="x509")
        auth = _header_values(headers, ["Authorization"])
        if auth and auth[0].lower().startswith("bearer "):
            reviewed = self._review(auth[0][7:].strip())
            if reviewed is not None:
                return User(reviewed.name, reviewed.groups, dict(reviewed.extra), reviewed.uid, via="token")
            reasons.append("the bearer token was not accepted by TokenReview")
        if self._anonymous:
            return User("system:anonymous", ("system:unauthenticated",), via="anonymous")
        if not reasons:
            reasons.append("no client certificate or bearer token")
        raise Unauthorized(f"Unauthorized: {'; '.join(reasons)}")

    def _extra(self, headers: Mapping[str, list[str]]) -> dict[str, tuple[str, ...]]:
        assert self._rh is not None
        extra: dict[str, list[str]] = {}
        for key, values in headers.items():
            for prefix in self._rh.extra_prefixes:
                if key.lower().startswith(prefix.lower()):
                    name = key[len(prefix) :].lower()
                    extra.setdefault(name, []).extend(values)
        return {k: tuple(v) for k, v in extra.items()}

    def _review(self, token: str) -> ReviewedUser | None:
        if self._kube is None:
            return None
        now = self._clock()
        with self._lock:
            hit = self._tokens.get(token)
        if hit is not None and now - hit[0] < self._token_ttl:
            return hit[1]
        nowait.check()  # a TokenReview call
        reviewed = self._kube.token_review(token)
        with self._lock:
            if len(self._tokens) > 10_000:
                self._tokens.clear()
            self._tokens[token] = (now, reviewed)
        return reviewed


class Authorizer:
    """SubjectAccessReview with a short cache; ``mode='none'`` allows everything."""

    def __init__(
        self,
        *,
        mode: str,
        kube: KubeClient | None,
        ttl: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in ("none", "subjectaccessreview"):
            raise ValueError(f"unknown authorization mode {mode!r}")
        if mode == "subjectaccessreview" and kube is None:
            raise ValueError("subjectaccessreview authorization needs a Kubernetes client")
        self.mode = mode
        self._kube = kube
        self._ttl = ttl
        self._clock = clock
        self._cache: dict[tuple[object, ...], tuple[float, bool, str]] = {}
        self._lock = threading.Lock()

    def authorize(self, user: User, info: RequestInfo) -> None:
        """Return if allowed; raise ``Forbidden`` with the reviewer's reason otherwise."""
        if self.mode == "none":
            return
        assert self._kube is not None
        resource = info.resource_attributes() if info.is_resource else None
        non_resource = None if info.is_resource else {"path": info.path, "verb": "get"}
        key = (
            user.name,
            user.groups,
            tuple(sorted((user.extra or {}).items())),
            tuple(sorted((resource or non_resource or {}).items())),
        )
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            allowed, reason = hit[1], hit[2]
        else:
            nowait.check()  # a SubjectAccessReview call
            allowed, reason = self._kube.subject_access_review(
                user=user.name,
                groups=user.groups,
                extra=user.extra or {},
                uid=user.uid,
                resource=resource,
                non_resource=non_resource,
            )
            with self._lock:
                if len(self._cache) > 10_000:
                    self._cache.clear()
                self._cache[key] = (now, allowed, reason)
        if not allowed:
            what = (
                f"get {info.resource}{'/' + info.subresource if info.subresource else ''} "
                f"in API group {info.group!r}"
                + (f" in namespace {info.namespace!r}" if info.namespace else "")
                if info.is_resource
                else f"get path {info.path!r}"
            )
            raise Forbidden(f'user "{user.name}" cannot {what}' + (f": {reason}" if reason else ""))
