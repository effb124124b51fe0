"""``-o json|yaml``: the same document in both, parseable, keys in order; and ``--version``
from the package's metadata on every command line."""

from __future__ import annotations

import argparse
import io
import json
from importlib import metadata

import pytest
import yaml

from gpupilot_common import output
from gpupilot_common.cli import add_version


def test_json_and_yaml_print_the_same_document():
    doc = {"b": 1, "a": [{"x": "é", "y": 0.5}], "ok": True}
    js, ya = io.StringIO(), io.StringIO()
    output.emit(doc, "json", js)
    output.emit(doc, "yaml", ya)
    assert json.loads(js.getvalue()) == doc == yaml.safe_load(ya.getvalue())
    assert list(json.loads(js.getvalue())) == ["b", "a", "ok"]


def test_the_flag_offers_four_formats():
    parser = argparse.ArgumentParser()
    output.add_argument(parser)
    assert parser.parse_args([]).output == "table"
    assert output.structured(parser.parse_args(["-o", "yaml"]))
    with pytest.raises(SystemExit):
        parser.parse_args(["-o", "xml"])


@pytest.mark.parametrize(
    "argv",
    [
        ["gpupilot-exporter", "--version"],
        ["gpupilot-exporter", "backfill", "--version"],
        ["gpupilot-exporter", "cluster", "--version"],
        ["gpupilot-adapter", "--version"],
        ["gpupilot-adapter", "explain-hpa", "--version"],
        ["gpupilot-adapter", "replay-hpa", "--version"],
        ["gpupilot-rightsizer", "--version"],
        ["gpupilot-rightsizer", "plan", "--version"],
        ["gpupilot-rightsizer", "validate", "--version"],
    ],
)
def test_every_command_line_prints_its_version(argv, capsys):
    from exporter.commands.cli import main as exporter_main  # noqa: PLC0415
    from rightsizer.cli import main as rightsizer_main  # noqa: PLC0415

    mains = {"gpupilot-exporter": exporter_main, "gpupilot-rightsizer": rightsizer_main}
    if argv[0] == "gpupilot-adapter":
        from adapter.cli import main as adapter_main  # noqa: PLC0415

        mains["gpupilot-adapter"] = adapter_main
    with pytest.raises(SystemExit) as done:
        mains[argv[0]](argv[1:])
    assert done.value.code == 0
    version = metadata.version("gpupilot")
    assert capsys.readouterr().out.strip() == f"{' '.join(argv[:-1])} {version}"


def test_version_helper_names_the_program(capsys):
    parser = argparse.ArgumentParser(prog="tool sub")
    add_version(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert capsys.readouterr().out.startswith("tool sub ")
