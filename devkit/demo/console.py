"""Terminal output for the demo: numbered steps with timings, sections, and one-line failures."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

from gpupilot_common.table import Column, render


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
    """The shared table writer (:mod:`gpupilot_common.table`): numbers right-aligned, the last column
    wrapped to fit the terminal."""

    def numeric(i: int) -> bool:
        cells = [r[i] for r in rows if r[i].strip()]
        return bool(cells) and all(c.replace(".", "", 1).replace("%", "").strip().isdigit() for c in cells)

    columns = [
        Column(h, right=numeric(i), wrap=i == len(headers) - 1 and len(headers) > 1)
        for i, h in enumerate(headers)
    ]
    return render(columns, rows).split("\n")
