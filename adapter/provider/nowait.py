"""Answering on the event loop: a request whose answer is already in memory (credentials and
authorisation cached, values refreshed, answer encoded) is answered in the loop's own thread,
without the hop to a worker thread. Code that would wait on the network (a TokenReview, a
SubjectAccessReview, a Prometheus query, a first evaluation) or spend milliseconds encoding calls
:func:`check` first; between :func:`enter` and :func:`leave` that raises :class:`WouldBlock`, and the server hands the
request to a worker thread, which answers it the ordinary way."""

from __future__ import annotations

import contextvars

_INLINE: contextvars.ContextVar[bool] = contextvars.ContextVar("adapter_inline", default=False)


class WouldBlock(Exception):
    """Not an error: this request needs a worker thread (never reaches a client)."""


def check() -> None:
    """Raise :class:`WouldBlock` when called on the event loop (between :func:`enter` and :func:`leave`)."""
    if _INLINE.get():
        raise WouldBlock


def active() -> bool:
    return _INLINE.get()


def enter() -> contextvars.Token[bool]:
    """Mark this context as the event loop's, until :func:`leave` (the server, around answering a
    request inline; a plain call pair, as a generator-based context manager cost every request)."""
    return _INLINE.set(True)


def leave(token: contextvars.Token[bool]) -> None:
    _INLINE.reset(token)
