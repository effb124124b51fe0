"""A JSON document's key table from the dataclass it is encoded from: one row per field, its JSON type
from the annotation (a nested dataclass lists its keys) and its attribute docstring, so the reference
page changes when the code does. A command module names the class in ``OUTPUT_DATACLASS``."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import re
import textwrap
import types
import typing
from collections.abc import Mapping


def docstrings(cls: type) -> dict[str, str]:
    """Field → the string literal written right after it in the class body."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    found = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            text = " ".join(after.value.value.split())
            text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
            found[node.target.id] = text.replace("``", "`")
    return found


def _keys(cls: type) -> str:
    return ", ".join(f"`{f.name}`" for f in dataclasses.fields(cls))


def json_type(hint: object) -> str:
    """How an annotation reads as JSON: ``string``, ``number``, ``object (`a`, `b`)``, ``list of …``."""
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None) and a is not Ellipsis]
    if origin in (typing.Union, types.UnionType):
        return " or ".join(json_type(a) for a in args)
    if origin in (tuple, list) or hint in (tuple, list):
        if not args:
            return "list"
        item = json_type(args[0])
        return f"list of {item.replace('object', 'objects', 1) if item.startswith('object') else item + 's'}"
    if origin in (dict, Mapping) or hint in (dict, Mapping) or origin is typing.get_origin(Mapping[str, str]):
        return "object"
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return f"object ({_keys(hint)})"
    names: dict[object, str] = {str: "string", bool: "boolean", int: "integer", float: "number"}
    return names.get(hint, "any")


def table(cls: type) -> str:
    """The key table of ``cls``'s JSON form, fields in order."""
    hints = typing.get_type_hints(cls)
    said = docstrings(cls)
    rows = ["| key | type | what |", "|---|---|---|"]
    for f in dataclasses.fields(cls):
        what = said.get(f.name, "").replace("|", "\\|")
        if f.metadata.get("omit_empty"):
            what = f"{what} (left out when empty)".strip()
        kind = json_type(hints[f.name]).replace("|", "\\|")
        rows.append(f"| `{f.name}` | {kind} | {what} |")
    return "\n".join(rows) + "\n"
