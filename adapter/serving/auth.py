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
from typing import Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID

from adapter.clients.kube import KubeClient, ReviewedUser
from adapter.errors import ConfigError, Forbidden, Unauthorized
from adapter.provider import nowait
from adapter.serving.api import RequestInfo


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] | None = None
    uid: str = ""
    via: str = ""
    """How the identity was established: requestheader, x509, token, or anonymous."""

    @functools.cached_property
    def review_key(self) -> tuple[object, ...]:
        """What a SubjectAccessReview is asked about this user (the authorisation cache's key)."""
        extra = tuple(sorted(self.extra.items())) if self.extra else ()
        return (self.name, self.groups, extra)


@dataclass(frozen=True, slots=True)
class _CertificateFacts:
    front_proxy: bool
    """Issued by a CA in ``--requestheader-client-ca-file`` (its headers may carry the user)."""
    common_name: str
    client_user: User | None
    """The user it names when issued by a CA in ``--client-ca-file``."""


@dataclass(frozen=True)
class RequestHeaderSettings:
    ca_certs: tuple[x509.Certificate, ...]
    allowed_names: frozenset[str]
    username_headers: tuple[str, ...] = ("X-Remote-User",)
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)

    @functools.cached_property
    def lowered(self) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """(user headers, group headers, extra prefixes), lower case (header names are not)."""
        return (
            tuple(h.lower() for h in self.username_headers),
            tuple(h.lower() for h in self.group_headers),
            tuple(p.lower() for p in self.extra_prefixes),
        )


_HEX = frozenset("0123456789abcdefABCDEF")


def extra_key(encoded: str) -> str:
    """An ``X-Remote-Extra-`` header's key as kube-apiserver reads it (``headerrequest``'s
    ``unescapeExtraKey``): lower-cased, then percent-decoded as Go's ``url.PathUnescape`` decodes
    (``+`` stays ``+``); a key with a malformed escape is kept as it came. The front proxy encodes
    keys that a header name cannot hold: ``authentication.kubernetes.io%2fpod-name`` is the key
    ``authentication.kubernetes.io/pod-name``, which the SubjectAccessReview must carry."""
    low = encoded.lower()
    if "%" not in low:
        return low
    out = bytearray()
    i = 0
    while i < len(low):
        c = low[i]
        if c == "%":
            pair = low[i + 1 : i + 3]
            if len(pair) != 2 or not set(pair) <= _HEX:
                return low  # Go's PathUnescape fails: the key stays as it came
            out.append(int(pair, 16))
            i += 3
            continue
        out.extend(c.encode())
        i += 1
    return out.decode("utf-8", errors="replace")


def load_pem_certs(pem: bytes, *, source: str) -> tuple[x509.Certificate, ...]:
    try:
        certs = tuple(x509.load_pem_x509_certificates(pem))
    except ValueError as exc:
        raise ConfigError(f"{source}: not a PEM certificate bundle ({exc})") from exc
    if not certs:
        raise ConfigError(f"{source}: holds no certificate")
    return certs


def _issued_by(cert: x509.Certificate, cas: tuple[x509.Certificate, ...]) -> bool:
    """Whether a CA in ``cas`` signed ``cert`` (once per certificate: see
    :meth:`Authenticator._certificate_facts`)."""
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


class Headers(Protocol):
    """A request's headers: a name with its value, or with its values (a ``dict[str, list[str]]``),
    a pair per name or per header line; names in any case. The server passes aiohttp's
    case-insensitive multidict as it is: copying it into a dict cost every request."""

    def items(self) -> Iterable[tuple[str, str | list[str]]]: ...


def _header_values(headers: Headers, names: Iterable[str]) -> list[str]:
    wanted = {name.lower() for name in names}
    out: list[str] = []
    for key, value in headers.items():
        if key.lower() in wanted:
            out += [v for v in ((value,) if isinstance(value, str) else value) if v]
    return out


HEADER_MEMO_LINES = 16
HEADER_MEMO_ENTRIES = 64
"""Requests' header lines → identity, memoised for requests of at most 16 lines, 64 of them: at
most 8 MiB even with every header at the server's 8 KiB limit."""
_MISSING = object()


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
        self._facts: dict[int, tuple[x509.Certificate, _CertificateFacts]] = {}
        self._users: dict[tuple[object, ...], User] = {}
        self._by_lines: dict[tuple[object, ...], User | None] = {}
        self._lock = threading.Lock()

    def authenticate(self, *, peer_cert: x509.Certificate | None, headers: Headers) -> User:
        """The requester, or ``Unauthorized`` naming why (never trusting unverified headers)."""
        reasons: list[str] = []
        facts = self._certificate_facts(peer_cert) if peer_cert is not None else None
        if facts is not None and facts.front_proxy:
            assert self._rh is not None
            if self._rh.allowed_names and facts.common_name not in self._rh.allowed_names:
                raise Unauthorized(
                    f"client certificate CN {facts.common_name!r} is not in --requestheader-allowed-names; "
                    "request headers from it are not trusted"
                )
            user = self._from_headers(headers)
            if user is not None:
                return user
            reasons.append("the front-proxy certificate sent no X-Remote-User")
        if facts is not None and facts.client_user is not None:
            return facts.client_user
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

    def _certificate_facts(self, cert: x509.Certificate) -> _CertificateFacts:
        """What this authenticator concludes from a client certificate, worked out once per
        certificate (the aggregation layer and an HPA controller reuse one for every request):
        checking the issuers and reading the subject on every request showed in the adapter's
        benchmark (docs/benchmarks.md). A reloaded CA makes a new
        :class:`Authenticator`, and with it a new memo."""
        # keyed by identity (the server hands the same parsed object for the same DER): hashing a
        # Certificate hashes its DER in the extension, which costs more than the lookup it serves
        hit = self._facts.get(id(cert))
        if hit is not None and hit[0] is cert:
            return hit[1]
        front_proxy = self._rh is not None and _issued_by(cert, self._rh.ca_certs)
        client_user = None
        if self._client_cas and _issued_by(cert, self._client_cas):
            orgs = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
            client_user = User(_common_name(cert), tuple(str(o.value) for o in orgs), via="x509")
        facts = _CertificateFacts(front_proxy, _common_name(cert), client_user)
        with self._lock:
            if len(self._facts) >= 256:
                self._facts.clear()
            self._facts[id(cert)] = (cert, facts)  # the entry holds the cert: its id stays its own
        return facts

    def _from_headers(self, headers: Headers) -> User | None:
        """The user the front proxy names in its headers (None without a user header), read in
        one pass over the headers; the same identity gives the same :class:`User` object, so its
        authorisation key is built once, not per request. A request whose header lines are all
        those of a recent one (an HPA's, through the same proxy) is a dictionary lookup."""
        lines = tuple(headers.items())
        memo = len(lines) <= HEADER_MEMO_LINES and all(isinstance(value, str) for _, value in lines)
        if memo and (hit := self._by_lines.get(lines, _MISSING)) is not _MISSING:
            return hit  # type: ignore[return-value]
        user = self._read_identity(headers)
        if memo:
            with self._lock:
                if len(self._by_lines) >= HEADER_MEMO_ENTRIES:
                    self._by_lines.clear()
                self._by_lines[lines] = user
        return user

    def _read_identity(self, headers: Headers) -> User | None:
        assert self._rh is not None
        user_names, group_names, prefixes = self._rh.lowered
        found: dict[str, list[str]] = {}
        extra: dict[str, list[str]] = {}
        for key, value in headers.items():
            low = key.lower()
            values = (value,) if isinstance(value, str) else value
            if low in user_names or low in group_names:
                found.setdefault(low, []).extend(v for v in values if v)
                continue
            if low.startswith(prefixes):  # one C call rejects the other headers
                for prefix in prefixes:
                    if low.startswith(prefix):
                        extra.setdefault(extra_key(low[len(prefix) :]), []).extend(values)
        users = [v for name in user_names for v in found.get(name, ())]
        if not users:
            return None
        groups = tuple(v for name in group_names for v in found.get(name, ()))
        extras = {k: tuple(v) for k, v in extra.items()}
        identity = (users[0], groups, tuple(sorted(extras.items())))
        user = self._users.get(identity)
        if user is None:
            user = User(users[0], groups, extras, via="requestheader")
            with self._lock:
                if len(self._users) >= 1024:
                    self._users.clear()
                self._users[identity] = user
        return user

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
        # the key holds the request's RequestInfo (one object per path, its hash kept), not the
        # review's attributes: those are built only when a review is sent
        key = (user.review_key, info)
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            allowed, reason = hit[1], hit[2]
        else:
            nowait.check()  # a SubjectAccessReview call
            resource = info.resource_attributes() if info.is_resource else None
            non_resource = None if info.is_resource else {"path": info.path, "verb": "get"}
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
