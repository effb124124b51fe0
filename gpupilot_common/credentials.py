"""The request side of :class:`~gpupilot_common.promauth.PrometheusAuth`: secret files re-read when
they change, the tenant and Authorization headers for each request, and the client TLS context.
Every file is read when :class:`Credentials` is built, so a bad one stops a program at start with
one line naming the flag (or config field) and the file."""

from __future__ import annotations

import base64
import logging
import os
import ssl
import threading
from pathlib import Path

from gpupilot_common import yamlsafe
from gpupilot_common.paths import file_problem
from gpupilot_common.promauth import FLAGS, CredentialError, PrometheusAuth, setting_name

log = logging.getLogger(__name__)

MAX_SECRET_BYTES = 64 * 1024
"""A token or password file larger than this is a wrong path (a log, a binary), not a secret."""


class SecretFile:
    """A token or password in a file, read at once (errors name ``flag`` and the path) and again
    whenever the file's identity, size or mtime changes. Thread-safe. A failed re-read keeps the
    previous secret (the server's 401 then says what is wrong) and logs one warning."""

    def __init__(self, path: Path, *, flag: str) -> None:
        self.path = path
        self.flag = flag
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._value = ""
        self._failing = False
        self._value = self._load()

    def _load(self) -> str:
        try:
            st = os.stat(self.path)  # follows the kubelet's ..data symlink: a swap changes st_ino
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
            if stamp == self._stamp:
                return self._value
            if st.st_size > MAX_SECRET_BYTES:
                raise CredentialError(
                    f"{self.flag} {self.path}: {st.st_size} bytes, not a secret (at most {MAX_SECRET_BYTES}); "
                    "check the path"
                )
            # only a regular file (a named pipe would block every request), bounded
            text = yamlsafe.read_bytes(self.path, max_bytes=MAX_SECRET_BYTES).decode("utf-8").strip()
        except OSError as exc:
            raise CredentialError(f"{self.flag} {self.path}: cannot read: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise CredentialError(f"{self.flag} {self.path}: not UTF-8 text; check the path") from None
        if not text:
            raise CredentialError(f"{self.flag} {self.path}: the file is empty")
        if any(c in text for c in "\r\n\0"):
            raise CredentialError(
                f"{self.flag} {self.path}: holds more than one line; put only the secret in it"
            )
        if self._stamp is not None:
            log.info("%s %s changed; sending the new one", self.flag, self.path)
        self._stamp = stamp
        return text

    def read(self) -> str:
        with self._lock:
            try:
                self._value = self._load()
                self._failing = False
            except CredentialError as exc:
                if not self._failing:  # once per failure, not once per request
                    log.warning("%s; still sending the previous one", exc)
                self._failing = True
            return self._value


class Credentials:
    """The request side of :class:`PrometheusAuth`: headers for each request (secret files re-read
    when changed) and the TLS context. Constructing it reads every file once, so a missing token,
    an unreadable CA or a key that does not match its certificate stops the program at start
    with one line (:class:`CredentialError`)."""

    def __init__(
        self, auth: PrometheusAuth, *, userinfo: tuple[str, str] | None = None, field: str = FLAGS
    ) -> None:
        if userinfo is not None and (auth.username or auth.bearer_token_file is not None):
            raise CredentialError(
                f"{setting_name(field, 'url')} carries user:password@ and {setting_name(field, 'username')} "
                f"or {setting_name(field, 'bearer-token-file')} is given too; give the credentials once"
            )
        self.auth = auth
        self._static: dict[str, str] = {auth.tenant_header: auth.tenant} if auth.tenant else {}
        self._user = userinfo[0] if userinfo else auth.username
        self._fixed_password = userinfo[1] if userinfo else None
        self._password = (
            SecretFile(auth.password_file, flag=setting_name(field, "password-file"))
            if auth.password_file
            else None
        )
        self._token = (
            SecretFile(auth.bearer_token_file, flag=setting_name(field, "bearer-token-file"))
            if auth.bearer_token_file
            else None
        )
        self.ssl_context = tls_context(auth, field=field)
        """None: the HTTP library's defaults (system trust store, no client certificate)."""

    def headers(self) -> dict[str, str]:
        """The tenant and Authorization headers to send now."""
        out = dict(self._static)
        if self._token is not None:
            out["Authorization"] = f"Bearer {self._token.read()}"
        elif self._user or self._fixed_password:
            password = self._password.read() if self._password is not None else (self._fixed_password or "")
            pair = f"{self._user}:{password}".encode()
            out["Authorization"] = f"Basic {base64.b64encode(pair).decode()}"
        return out

    def _secrets(self) -> list[str]:
        found = [self._fixed_password or ""]
        found += [f.read() for f in (self._password, self._token) if f is not None]
        auth = self.headers().get("Authorization", "")
        found.append(auth.partition(" ")[2])
        return [s for s in found if len(s) >= 4]

    def scrub(self, text: str) -> str:
        """``text`` (a server's error body, an exception) with every secret in it replaced by ***."""
        for secret in self._secrets():
            text = text.replace(secret, "***")
        return text


def tls_context(auth: PrometheusAuth, *, field: str = FLAGS) -> ssl.SSLContext | None:
    """A client TLS context with the CA bundle and client certificate, or None when neither is set.
    Unreadable or malformed files raise :class:`CredentialError` naming the flag and file."""
    if auth.ca_file is None and auth.cert_file is None:
        return None
    ca_name, cert_name, key_name = (setting_name(field, s) for s in ("ca-file", "cert-file", "key-file"))
    ctx = ssl.create_default_context()
    for name, path in ((ca_name, auth.ca_file), (cert_name, auth.cert_file), (key_name, auth.key_file)):
        if path is not None and (problem := file_problem(path)):  # a named pipe would block OpenSSL
            raise CredentialError(f"{name} {path}: cannot read: {problem}; give the PEM file")
    if auth.ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=str(auth.ca_file))
        except ssl.SSLError:  # an OSError too: caught first
            raise CredentialError(
                f"{ca_name} {auth.ca_file}: no PEM certificate in it; give the CA bundle (PEM)"
            ) from None
        except OSError as exc:
            raise CredentialError(f"{ca_name} {auth.ca_file}: cannot read: {exc.strerror or exc}") from None
    if auth.cert_file is not None:
        key = str(auth.key_file) if auth.key_file is not None else None
        try:
            ctx.load_cert_chain(str(auth.cert_file), key)
        except OSError as exc:
            if isinstance(exc, ssl.SSLError):
                raise CredentialError(
                    f"{cert_name} {auth.cert_file}"
                    + (f" / {key_name} {auth.key_file}" if auth.key_file else "")
                    + ": not a PEM certificate and its matching private key"
                    + ("" if auth.key_file else f" (give the key with {key_name})")
                ) from None
            raise CredentialError(
                f"{cert_name} {auth.cert_file}: cannot read: {exc.strerror or exc}"
            ) from None
    return ctx
