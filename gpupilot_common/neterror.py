"""A transport failure in a few words (``connection refused``), not urllib3's whole chain.

``HTTPSConnectionPool(host='…', port=…): Max retries exceeded with url: … (Caused by
NewConnectionError(…: [Errno 111] Connection refused))`` is one line, but the words that say what
to check are at its end; the commands' one-line errors carry these instead.
"""

from __future__ import annotations

KNOWN = (
    ("Connection refused", "connection refused"),
    ("Name or service not known", "the host name is not known (DNS)"),
    ("Temporary failure in name resolution", "the host name could not be resolved (DNS)"),
    ("No route to host", "no route to host"),
    ("Connection reset", "the connection was reset"),
    ("CERTIFICATE_VERIFY_FAILED", "its TLS certificate is not trusted"),
    ("timed out", "timed out"),
)


def known_cause(exc: BaseException) -> str:
    """The root cause in a few words when it is a common one, else ""."""
    text = str(exc)
    return next((words for needle, words in KNOWN if needle in text), "")


def cause(exc: BaseException) -> str:
    """The root cause in a few words, else the first line of the error (at most 300 characters)."""
    if words := known_cause(exc):
        return words
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:300]
