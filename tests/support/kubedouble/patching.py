"""The three patch formats the API server accepts, applied to plain JSON objects.

- ``application/strategic-merge-patch+json`` (what the official client sends for a dict body on built-in
  kinds): maps merge recursively, ``null`` deletes a key, lists are replaced. The real server merges some
  lists by key (containers, taints); nothing the rightsizer or the adapter touches needs that.
- ``application/merge-patch+json`` (RFC 7386): the same rules for maps and lists.
- ``application/json-patch+json`` (RFC 6902): a list of ``add``/``remove``/``replace``/``test``/``copy``/
  ``move`` operations on JSON pointers.
"""

from __future__ import annotations

import copy
from typing import Any

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"


class PatchError(ValueError):
    """A patch that cannot be applied (→ 422 Invalid, or 415 for an unsupported type)."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 merge patch (strategic merge without list keys is the same thing)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$"):  # strategic-merge directives ($patch, $retainKeys): not modelled
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return node, parts[-1]


def _get(doc: Any, path: str) -> Any:
    node = doc
    for part in _pointer(path):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return node


def _add(doc: Any, path: str, value: Any, *, replace: bool) -> Any:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise PatchError(f"replace: path {path!r} does not exist")
        parent[last] = copy.deepcopy(value)
    elif isinstance(parent, list):
        if last == "-":
            parent.append(copy.deepcopy(value))
        elif last.isdigit() and int(last) <= len(parent):
            if replace:
                if int(last) >= len(parent):
                    raise PatchError(f"replace: index {path!r} out of range")
                parent[int(last)] = copy.deepcopy(value)
            else:
                parent.insert(int(last), copy.deepcopy(value))
        else:
            raise PatchError(f"bad array index in {path!r}")
    else:
        raise PatchError(f"path {path!r} does not exist")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent, last = _parent(doc, parts, path)
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise PatchError(f"remove: path {path!r} does not exist")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch."""
    if not isinstance(ops, list):
        raise PatchError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"bad JSON patch operation {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, op.get("value"), replace=False)
        elif kind == "replace":
            doc = _add(doc, path, op.get("value"), replace=True)
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise PatchError(f"test failed at {path!r}")
        elif kind in ("copy", "move"):
            value = copy.deepcopy(_get(doc, op["from"]))
            if kind == "move":
                doc = _remove(doc, op["from"])
            doc = _add(doc, path, value, replace=False)
        else:
            raise PatchError(f"unknown JSON patch op {kind!r}")
    return doc


def apply_patch(target: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    ctype = content_type.split(";", maxsplit=1)[0].strip()
    if ctype in (STRATEGIC, MERGE):
        if not isinstance(patch, dict):
            raise PatchError(f"a {ctype} body must be a JSON object")
        out = merge_patch(target, patch)
    elif ctype == JSON_PATCH:
        out = json_patch(target, patch)
    else:
        raise PatchError(f"unsupported patch content type {content_type!r}")
    if not isinstance(out, dict):
        raise PatchError("the patched object is not a JSON object")
    return out
