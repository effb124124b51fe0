"""Text cells beginning with a formula character get OWASP's leading single quote; others, and the
rest of the text, stay as they are."""

from __future__ import annotations

import pytest

from gpupilot_common import csvsafe


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_formula_starts_are_quoted(start: str) -> None:
    assert csvsafe.cell(f'{start}HYPERLINK("http://x")') == f'\'{start}HYPERLINK("http://x")'


@pytest.mark.parametrize("text", ["ml", "team-a", "a=b", "", "'quoted"])
def test_other_text_is_unchanged(text: str) -> None:
    assert csvsafe.cell(text) == text
