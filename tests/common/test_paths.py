"""A path a user typed is checked without an exception, whatever the text: a name too long for the
system to look up is no file, as a missing one is."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpupilot_common.cli import existing_file
from gpupilot_common.paths import exists, is_file

TOO_LONG = "E" * 300  # over NAME_MAX (255): the lookup itself fails with ENAMETOOLONG


def test_is_file_answers_for_any_text(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="too long"):
        Path(TOO_LONG).is_file()  # what the helper exists for
    assert is_file(Path(TOO_LONG)) is False and is_file(tmp_path / TOO_LONG / "x") is False
    assert is_file(tmp_path) is False and is_file(tmp_path / "missing") is False
    (tmp_path / "f").write_text("x")
    assert is_file(tmp_path / "f") is True
    assert exists(Path(TOO_LONG)) is False and exists(tmp_path) is True


def test_a_flag_naming_a_too_long_file_is_a_usage_error() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="no such file"):
        existing_file(TOO_LONG)
