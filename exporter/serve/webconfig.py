"""``--web-config``: TLS and basic auth in the Prometheus exporter-toolkit file format.

Supported keys (anything else is rejected, as exporter-toolkit's strict parser does)::

    tls_server_config:
      cert_file: server.crt          # PEM certificate (chain)
      key_file: server.key           # PEM private key
      client_auth_type: RequireAndVerifyClientCert   # NoClientCert | VerifyClientCertIfGiven | …
      client_ca_file: ca.crt         # CAs that sign client certificates
      min_version: TLS12             # TLS12 (default) | TLS13
      max_version: TLS13
    http_server_config:
      headers: {X-Frame-Options: deny}
    basic_auth_users:
      prometheus: $2y$10$…           # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

Every problem is a :class:`~exporter.errors.ConfigError` whose text is one line naming the file,
the field and what to do. Relative paths are resolved against the file's folder.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt

from exporter.errors import ConfigError
from gpupilot_common import checked, loops, yamlsafe
from gpupilot_common.paths import file_problem, is_file

_TOP = {"tls_server_config", "http_server_config", "basic_auth_users"}
_TLS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version"}
_TLS_UNSUPPORTED = {
    "cert",
    "key",
    "cipher_suites",
    "curve_preferences",
    "prefer_server_cipher_suites",
    "client_allowed_sans",
}
_HTTP = {"headers", "http2"}
_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_AUTH_UNSUPPORTED = {"RequestClientCert", "RequireAnyClientCert"}
_RESERVED_HEADERS = {"content-type", "content-length", "content-encoding", "connection", "www-authenticate"}
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}")
"""An HTTP header name (RFC 9110 token): no CR, LF, colon or space can reach a response."""
_BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
log = logging.getLogger(__name__)
_CACHE_LIMIT = 1024
# bcrypt of a random password: unknown users pay the same cost as known ones (no user enumeration).
_DUMMY_HASH = b"$2b$10$5Pd8i3Tawd4pRVGDqu6gpervhZ49vVW4Ohry42WyydgFINEJwBheS"


@dataclass(frozen=True)
class TlsSettings:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str | None = None


@dataclass(frozen=True)
class WebConfig:
    path: Path
    tls: TlsSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    """User name → bcrypt hash."""
    headers: Mapping[str, str] = field(default_factory=dict)

    def ssl_context(self) -> ssl.SSLContext | None:
        """A server context, or ``None`` for plain HTTP. Raises ConfigError on unreadable material."""
        if self.tls is None:
            return None
        tls = self.tls
        for where, file in (
            ("cert_file", tls.cert_file),
            ("key_file", tls.key_file),
            ("client_ca_file", tls.client_ca_file),
        ):
            if file is not None and (problem := file_problem(file)):  # OpenSSL would block on a pipe
                raise ConfigError(
                    f"{self.path}: tls_server_config.{where}: {file} is {problem}; give a PEM file"
                )
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _VERSIONS[tls.min_version]
        if tls.max_version:
            ctx.maximum_version = _VERSIONS[tls.max_version]
        try:
            ctx.load_cert_chain(tls.cert_file, tls.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"{self.path}: tls_server_config.cert_file/key_file: cannot load {tls.cert_file} with "
                f"{tls.key_file} ({_reason(exc)}); give a PEM certificate and its matching private key"
            ) from None
        if tls.client_ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=str(tls.client_ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"{self.path}: tls_server_config.client_ca_file: cannot load {tls.client_ca_file} "
                    f"({_reason(exc)}); give a PEM file of CA certificates"
                ) from None
        ctx.verify_mode = _AUTH_TYPES[tls.client_auth_type]
        return ctx

    def authenticator(self) -> BasicAuth | None:
        return BasicAuth(self.users) if self.users else None


Stamp = tuple[tuple[float, int, int] | None, ...]


def _stamp(paths: tuple[Path, ...]) -> Stamp:
    out: list[tuple[float, int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)  # follows links: a Secret volume swaps its files through ..data
        except OSError:
            out.append(None)
        else:
            out.append((st.st_mtime, st.st_size, st.st_ino))
    return tuple(out)


class ServingTls:
    """The server's TLS context, re-read when its files change, checked at every handshake (as
    exporter-toolkit reads its certificate per connection): a renewed certificate is served to the
    next connection. The context handed to the server picks the current one for each handshake (its
    SNI callback, called for every ClientHello). Files that cannot be used are one line and a count
    (``failures``, loop ``tls-reload``), and the last good context stays; each later change is tried
    again."""

    def __init__(self, config: WebConfig, *, failures: loops.LoopFailures | None = None) -> None:
        self.config = config
        first = config.ssl_context()
        if first is None:
            raise ValueError("ServingTls needs a tls_server_config")
        tls = config.tls
        assert tls is not None
        self.paths = tuple(p for p in (tls.cert_file, tls.key_file, tls.client_ca_file) if p is not None)
        self._stamp = _stamp(self.paths)
        self._current = first
        self.reloads = 0
        self.failures = failures or loops.LoopFailures()
        self.failures.register("tls-reload")
        self.context = first
        """What the server is given: its SNI callback switches each connection to the current one."""
        first.sni_callback = self._on_hello

    def _on_hello(self, conn: ssl.SSLObject, _server_name: str | None, _ctx: ssl.SSLContext) -> None:
        self.check()
        conn.context = self._current

    def check(self) -> None:
        """Rebuild the context when a file changed; never raises (a handshake must not fail on it)."""
        stamp = _stamp(self.paths)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        loops.guarded(
            "--web-config TLS reload",
            self._reload,
            logger=log,
            on_failure=self.failures.counter("tls-reload"),
        )

    def _reload(self) -> None:
        fresh = self.config.ssl_context()
        assert fresh is not None
        self._current = fresh
        self.reloads += 1
        log.info(
            "--web-config %s: TLS certificate reloaded from %s",
            self.config.path,
            self.config.tls.cert_file if self.config.tls else "",
        )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class BasicAuth:
    """Checks ``Authorization: Basic …`` against bcrypt hashes; results are cached so only the first
    request with given credentials pays bcrypt (tens of milliseconds), later scrapes a hash lookup."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._cache: dict[bytes, bool] = {}

    def cached(self, header: str | None) -> bool | None:
        """The cached verdict for this header, ``False`` for a malformed one, ``None`` if unknown."""
        if not header:
            return False
        return self._cache.get(self._key(header))

    def check(self, header: str | None) -> bool:
        """Verify (bcrypt on a cache miss) and remember the verdict."""
        verdict = self.cached(header)
        if verdict is not None:
            return verdict
        assert header is not None
        verdict = self._verify(header)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[self._key(header)] = verdict
        return verdict

    @staticmethod
    def _key(header: str) -> bytes:
        return hashlib.sha256(header.encode("utf-8", "surrogateescape")).digest()

    def _verify(self, header: str) -> bool:
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        known = None
        for name, hashed in self._users.items():  # no early exit: same work for every user name
            if hmac.compare_digest(name.encode(), user.encode()):
                known = hashed
        try:
            ok = bcrypt.checkpw(password.encode(), known or _DUMMY_HASH)
        except ValueError:
            return False
        return ok and known is not None


class _FieldProblem(ConfigError):
    """A problem at a field; :func:`load` re-raises it as ``file:line: field: problem``."""

    def __init__(self, path: Path, where: str, problem: str) -> None:
        super().__init__(f"{path}: {where}: {problem}")
        self.where, self.problem = where, problem


def _bcrypt_decodes(hashed: str) -> bool:
    """Whether bcrypt can read the salt and digest, at cost 4 (~1 ms) whatever the hash's cost:
    a hash bcrypt cannot read makes every login fail, so it is refused at start instead."""
    try:
        bcrypt.checkpw(b"", f"{hashed[:4]}04{hashed[6:]}".encode())
    except ValueError:
        return False
    return True


def _fail(path: Path, where: str, problem: str) -> ConfigError:
    return _FieldProblem(path, where, problem)


def _mapping(path: Path, where: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _fail(path, where, f"expected a mapping, got {type(value).__name__}")
    return value


def _unknown(path: Path, where: str, data: Mapping[str, Any], known: set[str]) -> None:
    for key in data:
        if key not in known:
            prefix = f"{where}." if where else ""
            allowed = ", ".join(sorted(known))
            raise _fail(path, f"{prefix}{key}", f"unknown field; allowed here: {allowed}")


def _file(path: Path, where: str, value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise _fail(path, where, "expected a file path")
    p = Path(value)
    if not p.is_absolute():
        p = path.parent / p
    if not is_file(p):
        raise _fail(path, where, f"{p} does not exist or is not a file; fix the path")
    return p


def _tls(path: Path, raw: Any) -> TlsSettings | None:
    data = _mapping(path, "tls_server_config", raw)
    if not data:
        return None
    for key in data:
        if key in _TLS_UNSUPPORTED:
            raise _fail(path, f"tls_server_config.{key}", "not supported by gpupilot-exporter; remove it")
    _unknown(path, "tls_server_config", data, _TLS)
    for key in ("cert_file", "key_file"):
        if key not in data:
            raise _fail(path, f"tls_server_config.{key}", "missing; TLS needs both cert_file and key_file")
    auth = data.get("client_auth_type") or "NoClientCert"
    if auth in _AUTH_UNSUPPORTED:
        raise _fail(
            path,
            "tls_server_config.client_auth_type",
            f"{auth} accepts unverified certificates and is not supported; "
            "use VerifyClientCertIfGiven or RequireAndVerifyClientCert",
        )
    if auth not in _AUTH_TYPES:
        raise _fail(
            path,
            "tls_server_config.client_auth_type",
            f"{auth!r} is not one of {', '.join(_AUTH_TYPES)}",
        )
    ca = data.get("client_ca_file")
    if auth != "NoClientCert" and not ca:
        raise _fail(path, "tls_server_config.client_ca_file", f"required with client_auth_type {auth}")
    if auth == "NoClientCert" and ca:
        raise _fail(
            path,
            "tls_server_config.client_auth_type",
            "client_ca_file is set but client_auth_type is NoClientCert; "
            "set RequireAndVerifyClientCert or VerifyClientCertIfGiven",
        )
    versions: dict[str, str | None] = {}
    for key, default in (("min_version", "TLS12"), ("max_version", None)):
        v = data.get(key, default)
        if v is not None and v not in _VERSIONS:
            raise _fail(path, f"tls_server_config.{key}", f"{v!r} is not one of {', '.join(_VERSIONS)}")
        versions[key] = v
    low, high = versions["min_version"] or "TLS12", versions["max_version"]
    if high is not None and _VERSIONS[low] > _VERSIONS[high]:
        raise _fail(
            path,
            "tls_server_config.min_version",
            f"{low} is above max_version {high}: every handshake would fail; lower min_version "
            "or raise max_version",
        )
    return TlsSettings(
        cert_file=_file(path, "tls_server_config.cert_file", data["cert_file"]),
        key_file=_file(path, "tls_server_config.key_file", data["key_file"]),
        client_auth_type=auth,
        client_ca_file=_file(path, "tls_server_config.client_ca_file", ca) if ca else None,
        min_version=versions["min_version"] or "TLS12",
        max_version=versions["max_version"],
    )


def _users(path: Path, raw: Any) -> dict[str, bytes]:
    data = _mapping(path, "basic_auth_users", raw)
    users: dict[str, bytes] = {}
    for name, hashed in data.items():
        where = f"basic_auth_users.{name}"
        if not isinstance(name, str) or not name or ":" in name:
            raise _fail(path, where, "user names must be non-empty text without ':'")
        if not isinstance(hashed, str) or not _BCRYPT.fullmatch(hashed) or not _bcrypt_decodes(hashed):
            raise _fail(
                path,
                where,
                "expected a bcrypt hash ($2y$…, 60 characters), e.g. from htpasswd -nBC 10 USER",
            )
        users[name] = hashed.encode()
    return users


def _headers(path: Path, raw: Any) -> dict[str, str]:
    data = _mapping(path, "http_server_config", raw)
    _unknown(path, "http_server_config", data, _HTTP)
    headers = _mapping(path, "http_server_config.headers", data.get("headers"))
    out: dict[str, str] = {}
    for name, value in headers.items():
        where = f"http_server_config.headers.{name!r}"
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise _fail(path, where, "not a header name (letters, digits and !#$%&'*+-.^_`|~ only)")
        where = f"http_server_config.headers.{name}"
        if name.lower() in _RESERVED_HEADERS:
            raise _fail(path, where, "this header is set by the exporter and cannot be configured")
        if not isinstance(value, str) or "\n" in value or "\r" in value or not value.isascii():
            raise _fail(path, where, "expected a one-line ASCII text value")
        out[name] = value
    return out


def load(path: Path) -> WebConfig:
    """Parse and check a web config file completely (TLS material included)."""
    try:
        text = yamlsafe.read_text(path)  # UTF-8 or one line naming the byte; at most 16 MiB
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read web config ({exc.strerror}); check --web-config") from None
    doc = checked.parse_yaml(text, source=str(path), error=ConfigError)
    try:
        return _checked(path, doc.data)
    except _FieldProblem as exc:
        raise doc.fail(tuple(exc.where.split(".")), exc.problem, field=exc.where) from None


def _checked(path: Path, raw: Any) -> WebConfig:
    data = _mapping(path, "top level", raw)
    _unknown(path, "", data, _TOP)
    config = WebConfig(
        path=path,
        tls=_tls(path, data.get("tls_server_config")),
        users=_users(path, data.get("basic_auth_users")),
        headers=_headers(path, data.get("http_server_config")),
    )
    config.ssl_context()  # load the certificates now: a bad file fails at start, not on first scrape
    return config
