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
    breaks: str = " /._-"
    """Where a wrapped line may break (after these characters). Names (pods, nodes) break at spaces
    only, ``" "``: a name is never split; the column is then never narrower than its longest name."""


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


def _pieces(line: str, breaks: str) -> list[str]:
    """A word and the separators after it, in order: where a line may break."""
    sep = re.escape(breaks.replace(" ", "")) + r"\s"
    return [p for p in re.findall(rf"[^{sep}]*(?:[{sep}]+|$)", line) if p]


def _longest_word(column: Column, rows: Sequence[Sequence[str]], index: int) -> int:
    """The widest piece a wrapped cell of this column cannot break (a continuation adds two)."""
    if column.breaks == " /._-":
        return 0  # any word may be cut with an ellipsis: no floor
    return max(
        (
            len(p.rstrip()) + 2
            for row in rows
            for line in _lines(row[index])
            for p in _pieces(line, column.breaks)
        ),
        default=0,
    )


def _fit(columns: Sequence[Column], widths: list[int], width: int, floors: Sequence[int] = ()) -> list[int]:
    """Shrink the wrappable columns, widest first, until the table fits or none can shrink (never
    below a column's floor: its longest unbreakable name)."""
    out = list(widths)
    least = [max(MIN_WRAP, len(c.header), floors[i] if i < len(floors) else 0) for i, c in enumerate(columns)]

    def total() -> int:
        return sum(out) + len(GAP) * (len(out) - 1)

    while total() > width:
        shrinkable = [i for i, c in enumerate(columns) if c.wrap and out[i] > least[i]]
        if not shrinkable:
            break
        i = max(shrinkable, key=lambda k: out[k])
        out[i] = max(least[i], out[i] - (total() - width))
    return out


def _wrapped(cell: str, width: int, breaks: str = " /._-") -> list[str]:
    """Each line of ``cell`` wrapped after one of ``breaks``, never inside a word (``ml/llm-inference-7f9c``
    breaks after ``/`` or ``-`` by default, only at spaces for names); continuation lines are indented
    by two; a word longer than the column is cut with an ellipsis (never a name: its column is wide
    enough, see :func:`_fit`)."""
    out: list[str] = []
    for line in _lines(cell):
        rows: list[str] = []
        current = ""
        for piece in _pieces(line, breaks):
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
        floors = [_longest_word(c, rows, i) for i, c in enumerate(columns)]
        while True:
            fitted = _fit(
                [columns[i] for i in keep], [widths[i] for i in keep], limit, [floors[i] for i in keep]
            )
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
            _wrapped(row[i], w, c.breaks) if c.wrap else _lines(row[i])
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
