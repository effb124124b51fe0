"""Terminal output for the demo: numbered steps with timings, sections, and one-line failures."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO


class StepFailed(Exception):
    """A demo step could not run; the message is one line saying why and what to do."""


class Console:
    def __init__(self, *, total_steps: int, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.total = total_steps
        self.number = 0
        self.started = time.monotonic()
        self.degraded: list[str] = []

    def line(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def note(self, text: str) -> None:
        self.line(f"      {text}")

    @contextmanager
    def step(self, title: str) -> Iterator[None]:
        """``==> [n/N] title … ok (1.2s)``; a :class:`StepFailed` is printed and swallowed."""
        self.number += 1
        begun = time.monotonic()
        self.line(f"==> [{self.number}/{self.total}] {title}")
        try:
            yield
        except StepFailed as err:
            self.degraded.append(f"{title}: {err}")
            self.line(f"      ✗ skipped: {err}")
            return
        self.line(f"      ok ({time.monotonic() - begun:.1f}s)")

    def section(self, title: str) -> None:
        self.line("")
        self.line(f"━━ {title} " + "━" * max(3, 96 - len(title)))

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns, numbers right-aligned, two spaces apart."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def fmt(row: Sequence[str]) -> str:
        cells = []
        for i, cell in enumerate(row):
            numeric = cell.replace(".", "", 1).replace("%", "").strip().isdigit()
            cells.append(cell.rjust(widths[i]) if numeric else cell.ljust(widths[i]))
        return "  ".join(cells).rstrip()

    return [fmt(headers), fmt(["─" * w for w in widths]), *(fmt(r) for r in rows)]
