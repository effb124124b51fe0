"""The one table writer: natural width when it fits, wrapping then dropping columns to fit the
width, ``wide`` keeping every column, numbers aligned right, multi-line cells."""

from __future__ import annotations

from gpupilot_common.table import Column, render

COLUMNS = (
    Column("node"),
    Column("count", right=True),
    Column("evidence", wrap=True, drop=1),
    Column("detail", wrap=True),
)
ROWS = [
    ("gpu-a", "3", "peak 15-min mean 85 % on 11-29 03:00, idle 12/168 h " * 2, "moved to all-1g.10gb"),
    ("gpu-bb", "12", "activity unknown", "a long explanation of why nothing changes " * 2),
]


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_fits_when_it_can_and_aligns_numbers_right():
    text = render(COLUMNS[:2], [r[:2] for r in ROWS], width=100)
    lines = text.splitlines()
    assert lines[0] == "node    count" and lines[1] == "------  -----"
    assert lines[2] == "gpu-a       3" and lines[3] == "gpu-bb     12"


def test_too_wide_wraps_the_wrappable_columns_within_the_width():
    text = render(COLUMNS, ROWS, width=160)
    assert widest(text) <= 160
    assert "left out" not in text
    assert sum(1 for line in text.splitlines() if line.startswith("gpu-")) == 2
    assert len(text.splitlines()) > 4  # wrapped rows spill onto continuation lines


def test_narrow_drops_low_priority_columns_and_says_so():
    text = render(COLUMNS, ROWS, width=45)
    assert widest(text.rsplit("\n", 1)[0]) <= 45
    assert "evidence" not in text.splitlines()[0]
    assert text.splitlines()[-1].startswith(
        "(evidence left out to fit 45 columns; -o wide shows every column)"
    )


def test_wide_keeps_every_column_unwrapped():
    text = render(COLUMNS, ROWS, width=60, wide=True)
    assert "evidence" in text.splitlines()[0] and "left out" not in text
    assert len(text.splitlines()) == 4
    assert widest(text) > 100


def test_multi_line_cells_spill_onto_continuation_lines():
    text = render((Column("a"), Column("b")), [("x\ny", "1")], width=80)
    assert text.splitlines()[2:] == ["x  1", "y"]


def test_width_comes_from_columns_env_when_not_given(monkeypatch):
    monkeypatch.setenv("COLUMNS", "45")
    text = render(COLUMNS, ROWS)
    assert "45 columns" in text
    monkeypatch.delenv("COLUMNS")
    assert widest(render(COLUMNS, ROWS)) <= 100  # a pipe: 100 columns


def test_wrapping_breaks_at_separators_never_inside_a_word():
    """Pod names in a narrow column break after ``/`` or ``-``; a word longer than the column is cut
    with an ellipsis, never split over two lines."""
    pods = "ml/llm-inference-7f9c4d-abcde\nresearch/averyveryverylongpodnamewithoutanyseparator\nml/a b"
    text = render((Column("node"), Column("disrupted", wrap=True)), [("gpu-a", pods)], width=30)
    assert widest(text) <= 30
    assert text.splitlines()[2:] == [
        "gpu-a  ml/llm-inference-",
        "         7f9c4d-abcde",
        "       research/",
        "         averyveryverylongpod…",
        "       ml/a b",
    ]


def test_names_are_never_split_their_column_widens_or_leaves() -> None:
    """A column of names (pods, nodes) breaks at spaces only: every name stays whole on one line, the
    column is as wide as the longest name, and when that cannot fit the column is left out (``-o
    wide`` shows it) instead of a name being cut or broken."""
    pods = "ml/llm-inference-7f9c4d-abcde\nresearch/notebook-0\nml/a b"
    columns = (Column("node"), Column("disrupted", wrap=True, breaks=" "))
    text = render(columns, [("gpu-a", pods)], width=40)
    assert text.splitlines()[2:] == [
        "gpu-a  ml/llm-inference-7f9c4d-abcde",
        "       research/notebook-0",
        "       ml/a b",
    ]
    narrow = render(
        (Column("node"), Column("disrupted", wrap=True, breaks=" ", drop=1)), [("gpu-a", pods)], width=25
    )
    assert "llm-inference" not in narrow and "disrupted left out to fit 25 columns" in narrow
