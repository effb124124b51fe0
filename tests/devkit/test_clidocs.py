"""The generated reference pages: checked in and current (a flag or a Helm value changed without
``python -m devkit.clidocs`` fails here), each in the site's navigation, and the Helm values
generator robust to a schema and a values file that do not match key for key."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from devkit.clidocs import __main__ as clidocs
from devkit.clidocs import helmvalues, parsers

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_pages_are_current():
    assert clidocs.stale() == [], "run: python -m devkit.clidocs"


def test_a_changed_flag_makes_its_page_stale(tmp_path):
    clidocs.write(tmp_path)
    page = tmp_path / "gpupilot-rightsizer-plan.md"
    page.write_text(page.read_text().replace("--all-nodes", "--every-node"))
    assert clidocs.stale(tmp_path) == ["gpupilot-rightsizer-plan.md"]


def test_every_page_is_in_the_navigation():
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    listed = json.dumps(nav)
    assert all(f"reference/{name}" in listed for name in clidocs.wanted())


def test_a_command_page_lists_flags_defaults_and_the_output_schema():
    page = clidocs.wanted()["gpupilot-rightsizer-plan.md"]
    assert "| `--window DUR` | `7d` |" in page  # the default as written, not 604800 seconds
    assert "`-o {table,wide,json,yaml}`" in page and "## Output with `-o json` / `-o yaml`" in page
    assert "| `--version` |" in page


def test_parser_page_marks_required_flags_and_links_subcommands():
    top = argparse.ArgumentParser(prog="tool", description="Does things.")
    sub = top.add_subparsers()
    run = sub.add_parser("run", help="run it")
    run.add_argument("--url", required=True, help="where")
    text = parsers.page(top, title="tool", see="tool-")
    assert "[`run`](tool-run.md) | run it |" in text
    assert "where (required)" in parsers.page(run, title="tool run")


def test_helm_values_follow_schema_and_defaults_even_when_they_disagree(tmp_path):
    chart = tmp_path / "chart"
    chart.mkdir()
    (chart / "values.schema.json").write_text(
        json.dumps(
            {
                "type": "object",
                "properties": {
                    "port": {"type": "integer", "minimum": 1, "maximum": 65535, "description": "listen port"},
                    "mode": {"enum": ["a", "b"]},
                    "onlyInSchema": {"type": "string"},
                    "nested": {"type": "object", "properties": {"x": {"type": "boolean"}}},
                },
            }
        )
    )
    (chart / "values.yaml").write_text(
        "port: 9400\nmode: a\n# Which things to do.\nnested:\n  # Turns x on.\n  x: true  \n"
        "onlyInValues:\n  deeper: 3 # three of them\n"
    )
    text = helmvalues.page(chart)
    assert "| `port` | integer (≥ 1, ≤ 65535) | `9400` | listen port |" in text
    assert '| `mode` | `"a"` \\| `"b"` | `"a"` |  |' in text
    assert "| `onlyInSchema` | string | — |  |" in text
    assert "| `nested.x` | boolean | `true` | Turns x on. |" in text
    assert "| `onlyInValues.deeper` | any | `3` | three of them |" in text
