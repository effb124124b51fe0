"""Answering on the event loop: a request whose answer is already in memory (credentials and
authorisation cached, values refreshed, answer encoded) is answered in the loop's own thread,
without the hop to a worker thread. Code that would wait on the network (a TokenReview, a
SubjectAccessReview, a Prometheus query, a first evaluation) or spend milliseconds encoding calls
:func:`check` first; inside :func:`inline` that raises :class:`WouldBlock`, and the server hands the
request to a worker thread, which answers it the ordinary way."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("adapter_inline", default=False)


class WouldBlock(Exception):
    """Not an error: this request needs a worker thread (never reaches a client)."""


def check() -> None:
    """Raise :class:`WouldBlock` when called on the event loop (inside :func:`inline`)."""
    if _INLINE.get():
        raise WouldBlock


def active() -> bool:
    return _INLINE.get()


@contextlib.contextmanager
def inline() -> Iterator[None]:
    token = _INLINE.set(True)
    try:
        yield
    finally:
        _INLINE.reset(token)
