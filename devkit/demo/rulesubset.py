"""The recording rules the rightsizer's plan and report read, split into dependency levels.

promtool backfills recording rules by range-querying a running Prometheus, which costs minutes
for all of ``rules/`` over two weeks. The demo backfills only what ``plan`` and ``report`` read
(and the fleet-waste series the demo prints), plus the rules those depend on, one file per level
so that every rule is evaluated after the ones it uses.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

NEEDED = (
    "gpupilot:slice_activity:avg5m",
    "gpupilot:node_slices:total",
    "gpupilot:node_slices:allocated",
    "gpupilot:node_slices:idle",
    "gpupilot:fleet_waste:gpu_equivalents",
)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def recording_rules(files: Iterable[Path]) -> dict[str, dict[str, Any]]:
    rules: dict[str, dict[str, Any]] = {}
    for path in files:
        doc = yaml.safe_load(path.read_text()) or {}
        for group in doc.get("groups", []):
            for rule in group.get("rules", []):
                if "record" in rule:
                    rules[str(rule["record"])] = rule
    return rules


def levels(rules: dict[str, dict[str, Any]], needed: Sequence[str] = NEEDED) -> list[list[dict[str, Any]]]:
    """Rules for ``needed`` and their dependencies; level n uses only levels below n."""
    deps = {
        name: {t for t in _NAME.findall(str(r["expr"])) if t in rules and t != name}
        for name, r in rules.items()
    }
    wanted: set[str] = set()
    todo = [n for n in needed if n in rules]
    while todo:
        name = todo.pop()
        if name not in wanted:
            wanted.add(name)
            todo.extend(deps[name])
    out: list[list[dict[str, Any]]] = []
    placed: set[str] = set()
    while len(placed) < len(wanted):
        ready = sorted(n for n in wanted - placed if deps[n] <= placed)
        if not ready:
            raise ValueError(f"recording rules depend on each other in a cycle: {sorted(wanted - placed)}")
        out.append([rules[n] for n in ready])
        placed.update(ready)
    return out


def write_levels(files: Iterable[Path], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for i, level in enumerate(levels(recording_rules(files))):
        path = directory / f"level-{i}.rules.yaml"
        path.write_text(
            yaml.safe_dump({"groups": [{"name": f"demo-backfill-{i}", "rules": level}]}, sort_keys=False)
        )
        written.append(path)
    return written
