"""Where the commands send users, and whether it is there: ``docs/x.md`` and ``docs/x.md#anchor`` in
help texts and messages, ``README, 'Section'``, and the ``-o`` help's "schema on the command's reference
page" (the page then holds an ``## Output with `-o json` / `-o yaml``` section whose keys
:func:`schema_keys` reads, for tests to compare with the documents the commands print)."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from pathlib import Path

from devkit.clidocs import commands

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "adapter",
    "exporter",
    "rightsizer",
    "simulator",
    "gpupilot_common",
    "mig_geometry",
    "hpa_controller",
)
DOC_LINK = re.compile(r"docs/([A-Za-z0-9_/-]+\.md)(?:#([A-Za-z0-9_-]+))?")
README_SECTION = re.compile(r"README(?:\.md)?[,:] '([^']+)'")
PROMISE = "schema on the command's reference page"
SCHEMA_HEADING = "## Output with `-o json` / `-o yaml`"


def slugify(text: str, separator: str = "-") -> str:
    """A heading's anchor as the site's table of contents (Python-Markdown's toc) makes it."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", separator, re.sub(r"[^\w\s-]", "", text).strip().lower())


def anchors(page: Path) -> set[str]:
    """The anchors of a Markdown page's headings, as the site's table of contents makes them."""
    found = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", line.lstrip("#").strip()).replace("`", "")
        found.add(slugify(text, "-"))
    return found


def broken_links(files: Iterable[Path], *, root: Path = ROOT) -> list[str]:
    """``file: docs/x.md#anchor`` for each pointer in ``files`` whose page or heading does not exist."""
    broken = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(root) if path.is_relative_to(root) else path
        for page, anchor in DOC_LINK.findall(text):
            target = root / "docs" / page
            if not target.is_file() or (anchor and anchor not in anchors(target)):
                broken.append(f"{where}: docs/{page}{'#' + anchor if anchor else ''}")
        for section in README_SECTION.findall(text):
            if slugify(section, "-") not in anchors(root / "README.md"):
                broken.append(f"{where}: README, {section!r}")
    return broken


def source_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for package in PACKAGES for p in (root / package).rglob("*.py"))


def broken_promises() -> list[str]:
    """Commands whose ``-o`` help promises a schema their reference page does not hold."""
    broken = []
    for c in commands.all_commands():
        promised = any(PROMISE in (a.help or "") for a in c.parser._actions)
        if promised and SCHEMA_HEADING not in commands.render(c):
            broken.append(c.title)
    return broken


def schema_keys(schema: str) -> list[str]:
    """The top-level keys a schema section's table lists, in order (a row may list several)."""
    keys: list[str] = []
    for line in schema.splitlines():
        if line.startswith("| `"):
            keys += re.findall(r"`([^`]+)`", line.split("|")[1])
    return keys
