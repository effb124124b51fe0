"""Text cells of the CSV files the project writes, safe to open in a spreadsheet.

A cell whose text begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is read by
spreadsheet programs as a formula (a namespace or label value called ``=HYPERLINK(…)`` would run as
one). As OWASP's CSV injection guidance recommends, such a cell gets a leading single quote, which
the spreadsheet shows as text and does not evaluate; quoting of commas, quotes and line breaks stays
the CSV writer's. Number columns are left alone (a negative number is a number).
"""

from __future__ import annotations

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def cell(text: str) -> str:
    """``text`` as a CSV cell a spreadsheet shows as text."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text
