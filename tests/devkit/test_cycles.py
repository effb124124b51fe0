"""devkit.cycles: an import cycle among the scanned packages fails the check, whether its imports
stand at the top, inside a function or under ``if TYPE_CHECKING:``, absolute or relative; a tree
without one passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit import cycles


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


ACYCLIC = {
    "pkg/__init__.py": "",
    "pkg/types.py": "class Shared: ...\n",
    "pkg/a.py": "from pkg.types import Shared\nimport json\n",
    "pkg/b.py": "from . import types\nfrom .a import Shared\n",
    "pkg/sub/__init__.py": "",
    "pkg/sub/c.py": "from ..b import types\nfrom pkg import a\n",
}


def test_a_tree_without_cycles_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _tree(tmp_path, ACYCLIC)
    graph = cycles.build(root, ["pkg"])
    assert set(graph.imports["pkg.sub.c"]) == {"pkg.b", "pkg.a"}
    assert set(graph.imports["pkg.b"]) == {"pkg.types", "pkg.a"}
    assert cycles.main(["--root", str(root), "pkg"]) == 0
    assert "no import cycle among 6 modules (5 imports)" in capsys.readouterr().out


def test_a_lazy_import_inside_a_function_closes_a_cycle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tree(
        tmp_path,
        {
            **ACYCLIC,
            "pkg/types.py": "class Shared:\n    def root(self):\n        from pkg.sub import c\n        return c\n",
        },
    )
    assert cycles.main(["--root", str(root), "pkg"]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == 1
    # The shortest way round, each step with where its import stands (types.py's is on line 3).
    # The shortest way round, each step with where its import stands (types.py's on line 3); b is
    # in the knot too (b imports types, c imports b).
    assert lines[0] == (
        "import cycle: pkg.a (pkg/a.py:1) -> pkg.types (pkg/types.py:3) -> pkg.sub.c (pkg/sub/c.py:2)"
        " -> pkg.a; 1 more module(s) in the same knot: pkg.b"
    )
    assert "1 import cycle(s) among 6 modules" in err


def test_a_type_only_relative_import_closes_a_cycle(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/report.py": "from pkg.render import page\nclass Report: ...\n",
            "pkg/render.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .report import Report\n"
                "def page(report: 'Report') -> str: ...\n"
            ),
        },
    )
    assert cycles.main(["--root", str(root), "pkg"]) == 1
    assert capsys.readouterr().out.splitlines() == [
        "import cycle: pkg.render (pkg/render.py:3) -> pkg.report (pkg/report.py:1) -> pkg.render"
    ]


def test_each_cycle_is_one_line_and_a_knot_names_every_module(tmp_path: Path) -> None:
    """Two separate cycles, one of them a knot of four modules (a 2-cycle inside a 3-cycle)."""
    root = _tree(
        tmp_path,
        {
            "one/__init__.py": "",
            "one/x.py": "import one.y\n",
            "one/y.py": "from one import x\n",
            "two/__init__.py": "",
            "two/p.py": "from two.q import f\n",
            "two/q.py": "from two import r\n",
            "two/r.py": "def g():\n    import two.p\n    import two.s\n",
            "two/s.py": "from . import r\n",
        },
    )
    graph = cycles.build(root, ["one", "two"])
    knots = cycles.components(graph)
    assert knots == [["one.x", "one.y"], ["two.p", "two.q", "two.r", "two.s"]]
    lines = [cycles.describe(graph, members, root) for members in knots]
    assert lines[0] == "import cycle: one.x (one/x.py:1) -> one.y (one/y.py:1) -> one.x"
    assert lines[1] == (
        "import cycle: two.p (two/p.py:1) -> two.q (two/q.py:1) -> two.r (two/r.py:2) -> two.p;"
        " 1 more module(s) in the same knot: two.s"
    )


def test_a_missing_package_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cycles.main(["--root", str(tmp_path), "nowhere"]) == 2
    assert (
        capsys.readouterr().err
        == f"error: {tmp_path / 'nowhere'}: no such package folder (run from the repository root)\n"
    )


def test_the_packages_are_import_linters_root_packages() -> None:
    """The entry points' list of the project's own packages (what the cycle check scans) is
    pyproject.toml's [tool.importlinter] root_packages."""
    import tomllib  # noqa: PLC0415

    doc = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert set(cycles.PACKAGES) == set(doc["tool"]["importlinter"]["root_packages"])
