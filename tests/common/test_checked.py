"""gpupilot_common.checked: every problem is one line, ``file:line: field.path: problem``, with the
line of the key (or of its section when the key is missing), raised as the caller's error class."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpupilot_common import checked, fieldpath, section, yamlsafe


class MyError(ValueError):
    pass


DOC = """\
listen: ":9500"
plan:
  every: 6h
  max_nodes: 3
report:
  # a comment line
  price: .nan
  window: 1h30m
items: [1, 2]
"""


def _root(text: str = DOC) -> section.Section:
    return checked.parse_yaml(text, source="cfg.yaml", error=MyError).root()


def _fails(call, message: str) -> None:
    with pytest.raises(MyError) as err:
        call()
    assert str(err.value) == message


def test_values_are_read_and_typed() -> None:
    root = _root()
    plan = root.section("plan")
    report = root.section("report")
    assert plan is not None and report is not None
    assert plan.duration("every", 0) == 6 * 3600 and plan.integer("max_nodes", None, minimum=1) == 3
    assert report.duration("window", 0) == 5400 and root.section("absent") is None
    assert root.text("listen") == ":9500" and root.boolean("enabled", False) is False


def test_each_problem_names_file_line_and_field() -> None:
    root = _root()
    plan, report = root.section("plan"), root.section("report")
    assert plan is not None and report is not None
    _fails(
        lambda: plan.integer("max_nodes", None, minimum=5),
        "cfg.yaml:4: plan.max_nodes: must be a whole number >= 5, got 3",
    )
    _fails(lambda: report.number("price", None), "cfg.yaml:7: report.price: must be a number >= 0, got nan")
    _fails(
        lambda: report.duration("window", 0, minimum=7200),
        "cfg.yaml:8: report.window: must be at least 7200s, got 1h30m",
    )
    _fails(
        lambda: root.keys(("listen", "plan", "report")),
        "cfg.yaml:9: items: unknown field (known: listen, plan, report)",
    )
    _fails(lambda: root.section("items"), "cfg.yaml:9: items: must be a mapping of fields, got [1, 2]")
    # a missing key: the line of its section
    _fails(lambda: plan.text("window"), "cfg.yaml:2: plan.window: required, a non-empty string")


def test_syntax_errors_and_wrong_documents_are_one_line(tmp_path: Path) -> None:
    _fails(
        lambda: checked.parse_yaml("a: [1,\n", source="x.yaml", error=MyError),
        "x.yaml:2: expected the node content, but found '<stream end>' (YAML syntax)",
    )
    _fails(lambda: _root("- 1\n- 2\n"), "cfg.yaml:1: the file must be a mapping of fields, got list")
    missing = tmp_path / "missing.yaml"
    _fails(
        lambda: checked.load_yaml(missing, error=MyError),
        f"{missing}: cannot read the file (No such file or directory)",
    )
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    _fails(
        lambda: checked.load_yaml(binary, error=MyError, what="config"),
        f"{binary}: cannot read the config (not UTF-8 text (byte 0xff on line 1); save the file as UTF-8)",
    )


def test_data_without_a_file_has_no_line() -> None:
    doc = checked.Document({"n": "x"}, source="test", error=MyError)
    _fails(lambda: doc.root().integer("n", None), "test: n: must be a whole number >= 0, got 'x'")


def test_lists_of_sections_name_items_by_index() -> None:
    text = "rules:\n  - name: a\n  - name: 3\n  - oops\n"
    good = text.replace("  - oops\n", "")
    items = checked.parse_yaml(good, source="r.yaml", error=MyError).root().sections("rules")
    assert items[0].text("name") == "a"
    _fails(lambda: items[1].text("name"), "r.yaml:3: rules[1].name: must be a string, got 3")
    _fails(
        lambda: (
            checked.parse_yaml(text, source="r.yaml", error=MyError).root().sections("rules", what="a rule")
        ),
        "r.yaml:4: rules[2]: must be a rule, got 'oops'",
    )
    _fails(
        lambda: _root().sequence("plan"),
        "cfg.yaml:2: plan: must be a list, got {'every': '6h', 'max_nodes': 3}",
    )
    assert fieldpath.dotted(("a", 0, "b", 12)) == "a[0].b[12]"


def test_json_errors_name_the_line_of_the_key() -> None:
    text = '{\n  "a": [1, {"b": "x\\\\n}"},\n    3],\n  "c" : {}, "d": "no"\n}'
    doc = checked.parse_json(text, source="p.json", error=MyError)
    assert doc.data["a"][1] == {"b": "x\\n}"}
    assert checked.json_key_lines(text) == {
        (): 1,
        ("a",): 2,
        ("a", 0): 2,
        ("a", 1): 2,
        ("a", 1, "b"): 2,
        ("a", 2): 3,
        ("c",): 4,
        ("d",): 4,
    }
    _fails(lambda: doc.root().boolean("d", False), "p.json:4: d: must be true or false, got 'no'")
    _fails(lambda: doc.root().section("c").text("e"), "p.json:4: c.e: required, a non-empty string")  # type: ignore[union-attr]
    _fails(
        lambda: checked.parse_json('{\n"a": 1,\n}', source="p.json", error=MyError),
        "p.json:3: Expecting property name enclosed in double quotes at column 1 (JSON syntax)",
    )
    _fails(
        lambda: checked.parse_json("[" * 100_000, source="p.json", error=MyError),
        "p.json: nested too deeply to be a document this program reads",
    )


def test_aliases_are_walked_once() -> None:
    """Nine levels of ten aliases stand for 10**9 values: lines are found from the ~100 nodes."""
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)
    ]
    text = "\n".join(levels) + "\nself: &s [*s]\nlast: 1\n"
    lines = checked.key_lines(yaml.compose(text, Loader=yaml.SafeLoader))
    assert lines[("a9",)] == 10
    assert lines[("self",)] == 11
    assert lines[("last",)] == 12
    assert len(lines) < 150


def test_deep_nesting_is_one_line() -> None:
    _fails(
        lambda: checked.parse_yaml("[" * 1500 + "]" * 1500, source="deep.yaml", error=MyError),
        f"deep.yaml:1: nested more than {yamlsafe.MAX_DEPTH} levels deep (YAML syntax)",
    )


def test_messages_stay_one_short_line() -> None:
    """A key or value holding line breaks, or a huge one, cannot split or flood the message."""
    doc = checked.Document({"a\nb": 1}, source="x.yaml", error=MyError)
    _fails(lambda: doc.root().keys(()), "x.yaml: a\\nb: unknown field (known: )")
    with pytest.raises(MyError) as err:
        raise doc.fail(("items", 0), "got " + "y" * 10_000)
    assert str(err.value).startswith("x.yaml: items[0]: got yyy")
    assert len(str(err.value)) < 2 * checked.MAX_PART


def test_required_fields_and_open_bounds() -> None:
    """A getter without a default names what to give; a bound of None leaves that side open."""
    top = checked.parse_yaml(
        "a: -3\nb: ''\nc: 2.5\nwhen: 2026-01-01\n", source="r.yaml", error=MyError
    ).root()
    assert top.integer("a", minimum=None) == -3 and top.number("c", maximum=None, minimum=None) == 2.5
    assert top.time("when", 0.0, now=0.0) == 1767225600.0 and top.time("absent", 7.0, now=0.0) == 7.0
    _fails(lambda: top.integer("n", minimum=1), "r.yaml:1: n: required, a whole number >= 1")
    _fails(lambda: top.number("x", minimum=None), "r.yaml:1: x: required, a number")
    _fails(
        lambda: top.integer("a", maximum=-4, minimum=None),
        "r.yaml:1: a: must be a whole number <= -4, got -3",
    )
    _fails(lambda: top.text("b"), "r.yaml:2: b: must not be empty")
    _fails(lambda: top.sequence("items", required=True), "r.yaml:1: items: required, give a list")
    _fails(
        lambda: top.time("b", 0.0, now=0.0),
        "r.yaml:2: b: '' is not a time (use RFC 3339 like 2026-11-01T00:00:00Z, Unix seconds, now or now-7d)",
    )


def test_coerce_reads_scalars_as_the_type_asked_for() -> None:
    text = 'driver: 535\ncount: "2"\nsup: "²"\nlabels: {8: 9, app: x}\nitems: []\n'
    plain = checked.parse_yaml(text, source="r.yaml", error=MyError).root()
    _fails(lambda: plain.text("driver"), "r.yaml:1: driver: must be a string, got 535")
    _fails(lambda: plain.integer("count"), "r.yaml:2: count: must be a whole number >= 0, got '2'")
    top = checked.parse_yaml(text, source="r.yaml", error=MyError).root(coerce=True)
    assert top.text("driver") == "535" and top.integer("count") == 2
    assert top.text_map("labels") == {"8": "9", "app": "x"} and top.text_map("absent") == {}
    _fails(lambda: top.integer("sup"), "r.yaml:3: sup: must be a whole number >= 0, got '²'")  # not int('²')
    _fails(lambda: top.sequence("items", required=True), "r.yaml:5: items: must not be empty")
    child = top.at({"n": "7"}, "items", 0)  # a short form written out as fields inherits coerce
    assert child.integer("n") == 7 and child.path == ("items", 0)
    _fails(lambda: top.at("x", "items", 0, what="a rule"), "r.yaml:5: items[0]: must be a rule, got 'x'")
