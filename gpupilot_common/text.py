"""Messages that stay one line of bounded length, whatever a file put into them."""

from __future__ import annotations

MAX_MESSAGE = 500
"""Longest error message shown; a value quoted from a file can be megabytes."""

_CONTROL = (
    {i: f"\\x{i:02x}" for i in [*range(32), *range(0x7F, 0xA0)]}
    | {0x2028: "\\u2028", 0x2029: "\\u2029"}
    | {10: "\\n", 13: "\\r", 9: "\\t"}
)
"""C0 and C1 controls, DEL and the Unicode line and paragraph separators: every character that
``str.splitlines`` (and a terminal or a log shipper) may take for a line break."""


def one_line(text: str, *, limit: int = MAX_MESSAGE) -> str:
    """``text`` with control characters escaped (``\\n`` …) and cut to ``limit`` characters."""
    flat = text.translate(_CONTROL)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


class OneLineMessage(Exception):
    """Mixin for a service's root error: ``str(err)`` is always :func:`one_line`."""

    def __str__(self) -> str:
        return one_line(super().__str__())


def plural(count: float, noun: str, many: str = "") -> str:
    """``1 GPU``, ``3 GPUs``, ``1.5 GPUs``: the count and the noun in the right number (``many``
    for an irregular plural)."""
    shown = f"{count:,}" if isinstance(count, int) else f"{count:,.1f}".removesuffix(".0")
    return f"{shown} {noun if count == 1 else many or noun + 's'}"
