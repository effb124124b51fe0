"""``one_line``: whatever a file or a server put into a message, it prints as one line."""

from __future__ import annotations

import pytest

from gpupilot_common.text import MAX_MESSAGE, OneLineMessage, one_line


def test_no_character_breaks_a_message() -> None:
    """Every character ``str.splitlines`` takes for a line break (C0 and C1 controls, DEL, U+2028 and
    U+2029: a mapping key '\\x85' once split a plan file's error in two) is escaped."""
    breaking = [c for c in map(chr, range(0x3000)) if len(f"a{c}b".splitlines()) != 1]
    assert {"\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"} <= set(breaking)
    for c in breaking:
        assert len(f"a{one_line(c)}b".splitlines()) == 1, repr(c)
    assert one_line("key \x85 and \u2028 and \n") == "key \\x85 and \\u2028 and \\n"


@pytest.mark.parametrize("text", ["x" * (MAX_MESSAGE * 3), "é" * MAX_MESSAGE + "\n" * MAX_MESSAGE])
def test_a_message_is_cut_to_its_limit(text: str) -> None:
    assert len(one_line(text)) == MAX_MESSAGE and one_line(text).endswith("…")


def test_an_errors_text_is_one_line() -> None:
    class Failed(OneLineMessage):
        pass

    assert (
        str(Failed("plan.json: mig-configs.\x85: must be a list"))
        == "plan.json: mig-configs.\\x85: must be a list"
    )
