"""Quality values of ``Accept``-style headers (RFC 9110 §12.4.2), read one way by every server."""

from __future__ import annotations


def q_values(header: str) -> dict[str, float]:
    """``Accept``/``Accept-Encoding`` header → lower-cased token → its highest q (1 when absent, 0
    when unreadable)."""
    out: dict[str, float] = {}
    for part in header.split(","):
        token, *params = (p.strip() for p in part.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        token = token.lower()
        if token:
            out[token] = max(q, out.get(token, 0.0))
    return out
