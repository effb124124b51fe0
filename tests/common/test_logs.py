"""gpupilot_common.logs: --log-format text|json and --log-level on every service, fields not reprs."""

from __future__ import annotations

import argparse
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gpupilot_common import logs


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_json_lines_carry_fields_and_errors(restore_root: None) -> None:
    out = io.StringIO()
    logs.configure(service="rightsizer", log_format="json", level="info", stream=out, force=True)
    log = logging.getLogger("rightsizer.test")
    log.debug("not shown")
    log.info("report written to %s", "/r", extra=logs.fields(path="/r", nodes=("a", "b"), count=3))
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        log.exception("failed")
    first, second = (json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{"))
    assert first["level"] == "info" and first["service"] == "rightsizer"
    assert first["logger"] == "rightsizer.test" and first["msg"] == "report written to /r"
    assert (first["path"], first["nodes"], first["count"]) == ("/r", "a,b", 3)
    assert first["time"].endswith("Z")
    assert second["error"] == "ValueError: bad value" and "Traceback" in second["traceback"]
    assert len(out.getvalue().splitlines()) == 2  # the traceback is inside the second object


def test_text_lines_add_fields_as_pairs(restore_root: None) -> None:
    out = io.StringIO()
    logs.configure(service="adapter", log_format="text", level="debug", stream=out, force=True)
    logging.getLogger("adapter.x").debug("hello", extra=logs.fields(peer="1.2.3.4:5", why="two words"))
    (line,) = out.getvalue().splitlines()
    assert line.endswith('DEBUG adapter.x: hello peer=1.2.3.4:5 why="two words"')


def test_level_filters(restore_root: None) -> None:
    out = io.StringIO()
    logs.configure(service="exporter", log_format="text", level="warning", stream=out, force=True)
    logging.getLogger("x").info("quiet")
    logging.getLogger("x").warning("loud")
    assert "quiet" not in out.getvalue() and "loud" in out.getvalue()


def test_a_host_that_configured_logging_keeps_it(restore_root: None) -> None:
    """As logging.basicConfig: a process whose root logger has handlers (a test runner calling a
    command in its own process) keeps them."""
    root = logging.getLogger()
    mine = logging.StreamHandler(io.StringIO())
    root.addHandler(mine)
    logs.configure(service="adapter", log_format="json")
    assert mine in root.handlers


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="log format 'xml'"):
        logs.configure(service="x", log_format="xml")
    with pytest.raises(ValueError, match="log level 'loud'"):
        logs.configure(service="x", level="loud")


def test_flags_on_the_top_level_and_the_subcommand() -> None:
    parser = argparse.ArgumentParser()
    logs.add_flags(parser)
    sub = parser.add_subparsers(dest="command")
    logs.add_flags(sub.add_parser("serve"), top_level=False)
    top = parser.parse_args(["--log-format", "json", "--log-level", "error", "serve"])
    assert (top.log_format, logs.level_of(top)) == ("json", "error")
    inner = parser.parse_args(["serve", "--log-level", "debug", "--log-format", "json"])
    assert (inner.log_format, logs.level_of(inner)) == ("json", "debug")
    plain = parser.parse_args(["serve"])
    assert (plain.log_format, logs.level_of(plain)) == ("text", "info")
    assert logs.level_of(parser.parse_args(["serve", "-v"])) == "debug"


def test_peer_is_host_and_port() -> None:
    assert logs.peer(("10.0.0.1", 443)) == "10.0.0.1:443"
    assert logs.peer(("::1", 443, 0, 0)) == "[::1]:443"
    assert logs.peer(None) == "-"


@pytest.mark.parametrize(
    ("program", "args"),
    [
        (
            "adapter",
            ["convert-config", "/nonexistent-config.yaml", "--log-format", "json", "--log-level", "debug"],
        ),
        (
            "rightsizer",
            ["validate", "/nonexistent-config.yaml", "--log-format", "json", "--log-level", "debug"],
        ),
    ],
)
def test_every_command_takes_the_flags_after_its_name(program: str, args: list[str]) -> None:
    """What the chart's args list gives (the flags after the subcommand) parses: no 'unrecognized
    arguments'; the command then fails on its missing file with its own one line."""
    res = subprocess.run(
        [sys.executable, "-m", program, *args], capture_output=True, text=True, check=False, timeout=60
    )
    assert "unrecognized arguments" not in res.stderr, res.stderr
    assert "nonexistent-config.yaml" in res.stderr
