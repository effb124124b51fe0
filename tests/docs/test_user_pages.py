"""The user pages of docs/ state what is, for users: no paths into the test tree, no development log,
no issue numbers as sources, no history of how a figure changed (development.md, the contributors'
page, is left out); and the home page's component table is the README's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONTRIBUTORS = {DOCS / "development.md"}

PATTERNS = {
    "a path into tests/": r"(?<![\w./-])tests/\w",
    "a test module": r"\btest_\w+\.py\b",
    "development log": r"\b(?:this round|turn \d+)\b",
    "an issue number as a source": r"\bSources?: [^\n]*#\d+|\b[\w.-]+/[\w.-]+#\d+\b",
    "history or a development-machine remark": r"\b(?:after the move to|before the greedy|the previous "
    r"rule|not built here|development machine|not installable here|rules had changed|from a later "
    r"run|import-linter)\b",
}


def findings(text: str) -> list[str]:
    """``line: what: matched text`` for each pattern found."""
    found = []
    for what, pattern in PATTERNS.items():
        for m in re.finditer(pattern, text, re.IGNORECASE):
            found.append(f"{text.count(chr(10), 0, m.start()) + 1}: {what}: {m.group(0)!r}")
    return found


def test_user_pages_hold_no_development_history() -> None:
    pages = sorted(set(DOCS.rglob("*.md")) - CONTRIBUTORS)
    assert len(pages) > 30
    problems = [f"{p.relative_to(ROOT)}:{f}" for p in pages for f in findings(p.read_text(encoding="utf-8"))]
    assert problems == []


@pytest.mark.parametrize(
    "text",
    [
        "Verified in `tests/rightsizer/test_dra.py` on a real Prometheus.",
        "`test_chunking.py` checks that peaks equal the 60-second ones.",
        "Latest runs (after the move to httptools) on the 2-CPU development machine.",
        "Sources: NVIDIA/gpu-operator#2607 and NVIDIA/mig-parted#426.",
        "Measured this round, in turn 12.",
    ],
)
def test_each_pattern_fires_on_what_it_is_for(text: str) -> None:
    assert findings(text)


@pytest.mark.parametrize(
    "text",
    [
        "promtool test rules rules/tests/*.test.yaml",  # shipped rule tests, a user's command
        "`make test` runs the checks; tests/ examples/ docs/",
        "a 503 (prometheus-adapter #668) and keda#470",
        "the previous plan is kept; turn on `--dry-run`",
    ],
)
def test_legitimate_text_passes(text: str) -> None:
    assert findings(text) == []


def _components(text: str) -> str:
    start = text.index("| component | what it does | guide |")
    return text[start : text.index("\n\n", start)]


def test_the_home_page_lists_the_readme_components() -> None:
    readme = _components((ROOT / "README.md").read_text(encoding="utf-8")).replace("](docs/", "](")
    assert _components((DOCS / "index.md").read_text(encoding="utf-8")) == readme
