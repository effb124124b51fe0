"""URLs with credentials in them (``http://user:secret@host``): split them, never show them.

A base URL given on the command line may carry user-info for HTTP basic auth. Clients send it as
an ``Authorization`` header (requests' ``auth=``) and keep the URL without it, so every message,
log line, 503 body, report and plan that names the URL shows only ``scheme://host[:port]/path``;
wherever a URL is shown as given, :func:`redact` replaces the user-info with ``***``.
"""

from __future__ import annotations

import argparse
import urllib.parse


def split_userinfo(url: str) -> tuple[str, tuple[str, str] | None]:
    """``(url without user-info, (user, password) or None)``; percent-escapes in them decoded."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url, None  # not a URL anyone can connect to; the client reports it, redacted
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    clean = urllib.parse.urlunsplit(parts._replace(netloc=hostport))
    return clean, (urllib.parse.unquote(user), urllib.parse.unquote(password))


def redact(text: str) -> str:
    """``text`` with the user-info of a URL in it replaced by ``***``; other text unchanged."""
    scheme_end = text.find("://")
    if scheme_end < 0:
        return text
    start = scheme_end + 3
    end = len(text)
    for stop in "/?# ":
        i = text.find(stop, start)
        if i >= 0:
            end = min(end, i)
    at = text.rfind("@", start, end)
    if at < 0:
        return text
    return text[:start] + "***" + text[at:]


def base_url(text: str) -> str:
    """``argparse`` type for a server's base URL: http(s), a host, a valid port; shown redacted."""
    try:
        parts = urllib.parse.urlsplit(text.strip())
        port = parts.port  # raises ValueError for a port out of range or not a number
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{redact(text)!r} is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"{redact(text)!r}: expected http(s)://HOST[:PORT][/PATH], e.g. http://prometheus:9090"
        )
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(
            f"{redact(text)!r}: no ?query or #fragment; a path prefix goes in the path "
            "(http://mimir:8080/prometheus)"
        )
    del port
    return text.strip()
