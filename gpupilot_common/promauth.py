"""Tenants, credentials and TLS for Prometheus-compatible backends, shared by the adapter and the
rightsizer so both take the same flags with the same help (Mimir, Cortex, Thanos, VictoriaMetrics'
vmauth, or any proxy in front of Prometheus).

- ``--prometheus-tenant`` → ``X-Scope-OrgID`` (Mimir, Cortex, Loki-style; ``A|B`` queries several
  tenants where federation is on); ``--prometheus-tenant-header THANOS-TENANT`` for Thanos' own.
- basic auth: ``--prometheus-username`` with ``--prometheus-password-file`` (or ``user:pass@`` in the
  URL); a bearer token from ``--prometheus-bearer-token-file``. Both files are re-read when they
  change (inode, size or mtime), as the kubelet rotates projected service-account tokens by
  swapping a symlink: a long-running adapter keeps working past the token's expiry.
- TLS: ``--prometheus-ca-file`` (CA bundle), ``--prometheus-cert-file`` + ``--prometheus-key-file``
  (client certificate); checked at start, not at the first query.
- A path prefix is part of ``--prometheus-url`` (``https://mimir.example/prometheus``): every API
  path is appended to it.

Secrets come from files only: a command line is visible in ``ps`` and in the pod spec. No message
carries a secret: :meth:`gpupilot_common.credentials.Credentials.scrub` replaces any that a
server echoes back. The request side (secret files, headers, TLS context) is in
:mod:`gpupilot_common.credentials`.
"""

from __future__ import annotations

import argparse
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

from gpupilot_common.cli import existing_file

DEFAULT_TENANT_HEADER = "X-Scope-OrgID"
_TENANT = re.compile(r"^[A-Za-z0-9!\-_.*'()]{1,150}$")
"""Mimir's and Cortex's tenant-ID rule: at most 150 of these characters, not ``.`` or ``..``."""
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]{1,100}$")
"""An HTTP field name (RFC 9110 token)."""


FLAGS = "--prometheus-"
"""Prefix of the names in messages for command-line settings; ``prometheus_`` for a config file."""


def setting_name(field: str, stem: str) -> str:
    """``--prometheus-ca-file`` for flags, ``prometheus_ca_file`` for config files."""
    return field + (stem if field.startswith("-") else stem.replace("-", "_"))


class CredentialError(ValueError):
    """One line naming the flag (or config field) and the file, and what to do."""


@dataclass(frozen=True)
class PrometheusAuth:
    """How to reach a Prometheus-compatible API besides its URL; all optional."""

    tenant: str = ""
    """Sent as ``tenant_header``; ``A|B`` asks for several tenants (Mimir tenant federation)."""
    tenant_header: str = DEFAULT_TENANT_HEADER
    username: str = ""
    password_file: Path | None = None
    bearer_token_file: Path | None = None
    ca_file: Path | None = None
    """PEM CA bundle for an https URL; default: the system's trust store."""
    cert_file: Path | None = None
    key_file: Path | None = None
    """PEM client key; default: in ``cert_file`` (a combined PEM)."""

    def check(self, *, field: str = FLAGS) -> None:
        """Raise :class:`CredentialError` for settings that cannot work together. ``field`` is the
        prefix of the names shown (``--prometheus-`` for flags, ``prometheus_`` in a config file)."""

        def name(stem: str) -> str:
            return setting_name(field, stem)

        if self.tenant:
            for part in self.tenant.split("|"):
                if not _TENANT.match(part) or part in (".", ".."):
                    raise CredentialError(
                        f"{name('tenant')} {self.tenant!r}: a tenant ID is 1-150 of A-Z a-z 0-9 ! - _ . * ' ( ), "
                        "not '.' or '..'; join several with '|'"
                    )
        if not _HEADER_NAME.match(self.tenant_header):
            raise CredentialError(
                f"{name('tenant-header')} {self.tenant_header!r} is not an HTTP header name"
            )
        if self.username and self.password_file is None:
            raise CredentialError(
                f"{name('username')} needs {name('password-file')} (a file holding the password)"
            )
        if self.password_file is not None and not self.username:
            raise CredentialError(f"{name('password-file')} needs {name('username')}")
        if ":" in self.username:
            raise CredentialError(f"{name('username')}: a basic-auth user name cannot contain ':'")
        if self.username and self.bearer_token_file is not None:
            raise CredentialError(
                f"{name('username')} and {name('bearer-token-file')} both set the Authorization header; give one"
            )
        if self.key_file is not None and self.cert_file is None:
            raise CredentialError(
                f"{name('key-file')} {self.key_file} needs {name('cert-file')} (the client certificate it belongs to)"
            )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags above, in their own ``--help`` section."""
    g = parser.add_argument_group(
        "Prometheus tenant, credentials and TLS",
        "For Mimir, Cortex, Thanos or a proxy in front of Prometheus. A path prefix goes in "
        "--prometheus-url (https://mimir.example/prometheus). Secrets are read from files only, "
        "re-read when they change.",
    )
    g.add_argument(
        "--prometheus-tenant",
        default="",
        metavar="ID",
        help="tenant ID sent as X-Scope-OrgID (Mimir, Cortex); A|B for several where federation is on",
    )
    g.add_argument(
        "--prometheus-tenant-header",
        default=DEFAULT_TENANT_HEADER,
        metavar="NAME",
        help=f"header carrying --prometheus-tenant (default {DEFAULT_TENANT_HEADER}; THANOS-TENANT for Thanos)",
    )
    g.add_argument("--prometheus-username", default="", metavar="USER", help="basic-auth user name")
    g.add_argument(
        "--prometheus-password-file",
        type=existing_file,
        metavar="FILE",
        help="file holding the basic-auth password (with --prometheus-username)",
    )
    g.add_argument(
        "--prometheus-bearer-token-file",
        type=existing_file,
        metavar="FILE",
        help="file holding a bearer token (e.g. a projected service-account token); re-read when it changes",
    )
    g.add_argument(
        "--prometheus-ca-file",
        type=existing_file,
        metavar="FILE",
        help="CA bundle (PEM) for an https URL (default: the system's trust store)",
    )
    g.add_argument(
        "--prometheus-cert-file",
        type=existing_file,
        metavar="FILE",
        help="client certificate (PEM) for servers that require one",
    )
    g.add_argument(
        "--prometheus-key-file",
        type=existing_file,
        metavar="FILE",
        help="key of --prometheus-cert-file (PEM; default: inside the certificate file)",
    )


def from_args(args: argparse.Namespace) -> PrometheusAuth:
    """The settings from the flags of :func:`add_arguments`, checked (:class:`CredentialError`)."""
    auth = PrometheusAuth(
        tenant=args.prometheus_tenant,
        tenant_header=args.prometheus_tenant_header,
        username=args.prometheus_username,
        password_file=args.prometheus_password_file,
        bearer_token_file=args.prometheus_bearer_token_file,
        ca_file=args.prometheus_ca_file,
        cert_file=args.prometheus_cert_file,
        key_file=args.prometheus_key_file,
    )
    auth.check()
    return auth


_SSL_REASON = re.compile(r"\[SSL: [A-Z0-9_]+\] ([A-Za-z0-9 ]+)")


def is_tls_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (an HTTP library's wrapper) came from TLS: a handshake or a peer's alert."""
    return isinstance(exc, ssl.SSLError) or "[SSL: " in str(exc)


def tls_failure(exc: BaseException) -> str:
    """A failed TLS handshake in a few words, with the flags to check."""
    found = _SSL_REASON.search(str(exc))
    reason = found.group(1).strip() if found else type(exc).__name__
    return (
        f"TLS handshake failed ({reason}); check --prometheus-ca-file (the server's CA) and "
        "--prometheus-cert-file/--prometheus-key-file (a client certificate the server trusts)"
    )


def disconnected(url: str) -> str:
    """A connection closed before any answer. Over https this is how a server that requires a client
    certificate refuses one it does not accept (TLS 1.3 sends its alert after the handshake)."""
    if url.startswith("https://"):
        return (
            "the server closed the connection without an answer; if it requires a client certificate, "
            "check --prometheus-cert-file/--prometheus-key-file (issued by a CA it trusts)"
        )
    return "the server closed the connection without an answer"


def status_hint(status: int) -> str:
    """What to check after a 401 or 403 from the backend ('' for other statuses)."""
    if status == 401:
        return (
            "not authenticated: check --prometheus-username/--prometheus-password-file, "
            "--prometheus-bearer-token-file or --prometheus-cert-file, and --prometheus-tenant "
            "(Mimir answers 401 'no org id' without one)"
        )
    if status == 403:
        return (
            "forbidden: the credentials are valid but may not read this tenant or path; "
            "check --prometheus-tenant and the permissions of the user or token"
        )
    return ""
