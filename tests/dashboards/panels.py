"""Reading the committed dashboards: panels, their queries and their template variables."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_FILES = sorted((REPO / "dashboards").glob("*.json"))
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>\w+)\)$", re.S)


@dataclass(frozen=True)
class Query:
    file: str
    panel: str
    ref: str
    expr: str
    instant: bool

    @property
    def id(self) -> str:
        return f"{self.file}:{self.panel}:{self.ref}"


def load(path: Path) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return dashboard


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


SELF_HEALTH = "gpupilot-health.json"
"""Reads the services' own series, which the simulated fleet's history lacks: test_health.py runs it
over the real services' exposition instead."""


def queries(files: list[Path] | None = None) -> list[Query]:
    out = []
    for path in DASHBOARD_FILES if files is None else files:
        for panel in panels(load(path)):
            for target in panel.get("targets", []):
                out.append(
                    Query(
                        path.name,
                        panel["title"],
                        target["refId"],
                        target["expr"],
                        bool(target.get("instant")),
                    )
                )
    return out


def variables(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in dashboard["templating"]["list"] if v["type"] == "query"]


def substitute(expr: str, values: dict[str, str], *, range_s: int, interval_s: int) -> str:
    """Replace Grafana's built-in and the dashboard's variables the way Grafana would."""
    builtins = {
        "__rate_interval": f"{max(4 * 60, interval_s + 60)}s",
        "__interval": f"{interval_s}s",
        "__range": f"{range_s}s",
    }
    merged = {**builtins, **values}
    for name in sorted(merged, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", merged[name]).replace("$" + name, merged[name])
    return expr
