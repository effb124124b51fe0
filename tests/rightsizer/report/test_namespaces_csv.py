"""namespaces.csv is safe for spreadsheets: a namespace (or any text cell) beginning with =, +, -,
@, a tab or a carriage return is written with OWASP's leading single quote, read back as that text;
numbers, negative ones included, stay numbers."""

from __future__ import annotations

import csv
import io

import pandas as pd

from rightsizer.report.namespaces import csv_text

HOSTILE = ['=HYPERLINK("http://evil","x")', "+1+2", "-2+3", "@SUM(A1)", "\tcmd", "\rcmd", "ml"]


def test_text_cells_that_look_like_formulas_are_written_as_text() -> None:
    table = pd.DataFrame(
        {
            "namespace": HOSTILE,
            "devices": [1.0] * len(HOSTILE),
            "gpu_hours_allocated": [2.0] * len(HOSTILE),
            "gpu_hours_idle": [1.0] * len(HOSTILE),
            "idle_share": [0.5] * len(HOSTILE),
            "cost": [-1.25] * len(HOSTILE),
            "idle_cost": [float("nan")] * len(HOSTILE),
        }
    )
    rows = list(csv.DictReader(io.StringIO(csv_text(table), newline="")))
    assert [r["namespace"] for r in rows] == ["'" + n if n != "ml" else n for n in HOSTILE]
    assert all(r["cost"] == "-1.25" for r in rows)  # numbers are left alone
    for r in rows:
        assert not r["namespace"].startswith(("=", "+", "-", "@", "\t", "\r"))
