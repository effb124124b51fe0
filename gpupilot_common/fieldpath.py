"""Where a field is in a document and how a message shows it: the field path (``metrics[0].name``)
and a value quoted in a message. Shared by the document reader (``gpupilot_common.checked``) and the
typed getters over its sections (``gpupilot_common.section``)."""

from __future__ import annotations

FieldPath = tuple[str | int, ...]
"""Mapping keys by name, sequence items by index."""


def dotted(path: FieldPath) -> str:
    """``metrics[0].name``: keys joined by dots, sequence indices in brackets."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def short_value(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut at ``limit`` characters: a value quoted in a message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
