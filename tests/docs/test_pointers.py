"""Every place the commands send a user exists: ``docs/x.md#anchor`` and ``README, 'Section'`` in help
texts and messages, and the reference page's ``-o json`` schema that the ``-o`` help promises; the plan's
schema table lists every key a plan holds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from devkit.clidocs import __main__ as clidocs
from devkit.clidocs import pointers, schemas
from rightsizer.plan.model import Plan

ROOT = Path(__file__).resolve().parents[2]


def test_every_docs_pointer_in_help_texts_and_messages_resolves() -> None:
    assert pointers.broken_links(pointers.source_files()) == []


def test_a_pointer_to_a_missing_page_or_heading_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# A page\n\n## The `--state` file\n\n```\n# not a heading\n```\n"
    )
    (tmp_path / "README.md").write_text("# gpupilot\n\n## Quick start\n")
    src = tmp_path / "cli.py"
    src.write_text(
        'HELP = "see docs/a.md#the-state-file, docs/a.md#not-a-heading, docs/b.md"\n'
        "MSG = \"README: 'Quick start'; README, 'Deploy'\"\n"
    )
    assert pointers.broken_links([src], root=tmp_path) == [
        "cli.py: docs/a.md#not-a-heading",
        "cli.py: docs/b.md",
        "cli.py: README, 'Deploy'",
    ]


@pytest.mark.slow  # imports every command (scipy, pandas, matplotlib): seconds
def test_every_promised_output_schema_is_on_the_reference_page() -> None:
    assert pointers.broken_promises() == []
    pages = clidocs.wanted()
    for name in ("adapter-explain-hpa", "adapter-replay-hpa", "rightsizer-plan", "rightsizer-validate"):
        assert pointers.SCHEMA_HEADING in pages[f"gpupilot-{name}.md"], name


def test_the_plan_schema_lists_every_field_of_the_plan() -> None:
    page = (ROOT / "docs" / "reference" / "gpupilot-rightsizer-plan.md").read_text(encoding="utf-8")
    section = page[page.index(pointers.SCHEMA_HEADING) :]  # the page is current: test_clidocs
    assert schemas.table(Plan).rstrip() in section
    assert pointers.schema_keys(section) == [f.name for f in dataclasses.fields(Plan)]
    assert "| `totals` | object (`nodes`, `nodes_changed`," in section


@dataclasses.dataclass
class Inner:
    a: int
    b: str


@dataclasses.dataclass
class Outer:
    items: tuple[Inner, ...]
    """The items."""
    names: tuple[str, ...]
    ratio: float | None


def test_json_types_read_from_annotations() -> None:
    assert schemas.table(Outer).splitlines()[2:] == [
        "| `items` | list of objects (`a`, `b`) | The items. |",
        "| `names` | list of strings |  |",
        "| `ratio` | number |  |",
    ]
