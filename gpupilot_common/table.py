"""The one writer of plain-text column tables for every command (no terminal library: safe to pipe
or log). Tables fit the terminal: too wide, the columns marked ``wrap`` are wrapped first, then the
columns with the highest ``drop`` rank are left out (a last line says which, and that ``-o wide``
shows them); ``wide`` keeps every column at its natural width.

The width is the terminal's, ``$COLUMNS`` when set, else :data:`DEFAULT_WIDTH` (a pipe, a log)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_WIDTH = 100
GAP = "  "
MIN_WRAP = 20
"""A wrapped column keeps at least this many characters (or its header's length)."""


@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False
    """Numbers: aligned right."""
    wrap: bool = False
    """May be wrapped onto several lines when the table is too wide."""
    drop: int = 0
    """0: always shown; higher ranks are left out first when wrapping is not enough."""


def terminal_width() -> int:
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def _lines(cell: str) -> list[str]:
    return str(cell).split("\n")


def _natural(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[int]:
    widths = [len(c.header) for c in columns]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], *(len(line) for line in _lines(cell)))
    return widths


def _fit(columns: Sequence[Column], widths: list[int], width: int) -> list[int]:
    """Shrink the wrappable columns, widest first, until the table fits or none can shrink."""
    out = list(widths)

    def total() -> int:
        return sum(out) + len(GAP) * (len(out) - 1)

    while total() > width:
        shrinkable = [i for i, c in enumerate(columns) if c.wrap and out[i] > max(MIN_WRAP, len(c.header))]
        if not shrinkable:
            break
        i = max(shrinkable, key=lambda k: out[k])
        out[i] = max(MIN_WRAP, len(columns[i].header), out[i] - (total() - width))
    return out


PIECE = re.compile(r"[^\s/._-]*(?:[\s/._-]+|$)")
"""A word and the separators after it (space, ``/``, ``.``, ``_``, ``-``): where a line may break."""


def _wrapped(cell: str, width: int) -> list[str]:
    """Each line of ``cell`` wrapped after a separator, never inside a word (``ml/llm-inference-7f9c``
    breaks after ``/`` or ``-``); continuation lines are indented by two; a word longer than the
    column is cut with an ellipsis."""
    out: list[str] = []
    for line in _lines(cell):
        rows: list[str] = []
        current = ""
        for piece in filter(None, PIECE.findall(line)):
            room = width - (2 if rows else 0)
            if current.strip() and len((current + piece).rstrip()) > room:
                rows.append(current.rstrip())
                current = piece.lstrip()
            else:
                current += piece
        rows.append(current.rstrip())
        for k, row in enumerate(rows):
            text = ("  " if k else "") + row
            out.append(text if len(text) <= width else text[: width - 1] + "…")
    return out


def render(
    columns: Sequence[Column], rows: Sequence[Sequence[str]], *, width: int | None = None, wide: bool = False
) -> str:
    """Header, a rule, then the rows; multi-line cells spill onto continuation lines."""
    limit = terminal_width() if width is None else width
    keep = list(range(len(columns)))
    widths = _natural(columns, rows)
    if not wide:
        while True:
            fitted = _fit([columns[i] for i in keep], [widths[i] for i in keep], limit)
            too_wide = sum(fitted) + len(GAP) * (len(fitted) - 1) > limit
            droppable = [i for i in keep if columns[i].drop > 0]
            if not too_wide or not droppable:
                break
            keep.remove(max(droppable, key=lambda i: (columns[i].drop, i)))
        shown = [columns[i] for i in keep]
        sizes = fitted
    else:
        shown, sizes = list(columns), widths
    body = [
        [
            _wrapped(row[i], w) if c.wrap else _lines(row[i])
            for i, c, w in zip(keep, shown, sizes, strict=True)
        ]
        for row in rows
    ]

    def line(cells: Sequence[str]) -> str:
        return GAP.join(
            (v.rjust(w) if c.right else v.ljust(w)) for v, c, w in zip(cells, shown, sizes, strict=True)
        ).rstrip()

    out = [line([c.header for c in shown]), GAP.join("-" * w for w in sizes)]
    for cells in body:
        for k in range(max(len(c) for c in cells)):
            out.append(line([c[k] if k < len(c) else "" for c in cells]))
    hidden = [c.header for i, c in enumerate(columns) if i not in keep]
    if hidden:
        out.append(f"({', '.join(hidden)} left out to fit {limit} columns; -o wide shows every column)")
    return "\n".join(out)
