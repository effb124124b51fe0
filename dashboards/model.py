"""A small typed model of the Grafana dashboard JSON we ship, and its serialisation.

Only what our dashboards use: Prometheus targets, a handful of panel types, query variables and a
datasource variable. Panels are placed left to right in rows of the 24-column grid by
:class:`Dashboard`, so no two panels can overlap and nobody edits ``gridPos`` by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

from dashboards import filters

JSON = dict[str, Any]
PanelType = Literal["timeseries", "stat", "table", "status-history", "bargauge", "gauge"]
DATASOURCE: JSON = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False
    table: bool = False
    """Format the result as a table (one row per series, labels as columns)."""


@dataclass(frozen=True)
class Panel:
    title: str
    targets: tuple[Target, ...]
    unit: str
    """A Grafana unit id: ``percent``, ``percentunit``, ``watt``, ``celsius``, ``short``, ``none``…"""
    kind: PanelType = "timeseries"
    width: int = 12
    height: int = 8
    description: str = ""
    decimals: int | None = None
    min: float | None = None
    max: float | None = None
    stack: bool = False
    thresholds: tuple[tuple[float, str], ...] = ()
    """``(value, colour)`` steps above the base green."""
    mappings: tuple[tuple[str, str], ...] = ()
    """Value → text mappings (``("1", "AT MAX")``)."""
    colour_scheme: str = ""
    """A continuous colour scheme (``continuous-RdYlGr``) instead of the palette."""


@dataclass(frozen=True)
class Row:
    """A full-width row header; the panels after it belong to it."""

    title: str


@dataclass(frozen=True)
class QueryVariable:
    """A variable filled from ``label_values(...)``; ``all_value`` makes it multi-valued with All."""

    name: str
    label: str
    query: str
    all_value: str | None = None


FILTER_VARIABLES = (
    QueryVariable("cluster", "Cluster", "label_values(gpupilot_gpu_info, cluster)", all_value=".*"),
    QueryVariable(
        "job", "Exporter job", 'label_values(DCGM_FI_DEV_GPU_TEMP{cluster=~"$cluster"}, job)', all_value=".*"
    ),
)
"""On every dashboard, after the data source: the cluster (the series' ``cluster`` label, as
``--cluster-label`` reads it; All also matches series without one) and the exporter's scrape job
(dcgm-exporter beside gpupilot during a migration); :mod:`dashboards.filters` puts them in each query."""


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    tags: tuple[str, ...] = ("gpupilot", "gpu")
    variables: tuple[QueryVariable, ...] = ()
    time_from: str = "now-24h"
    items: list[Panel | Row] = field(default_factory=list)

    def add(self, *items: Panel | Row) -> Dashboard:
        self.items.extend(items)
        return self

    def to_json(self) -> JSON:
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": list(self.tags),
            "editable": True,
            "graphTooltip": 1,
            "schemaVersion": 39,
            "version": 1,
            "time": {"from": self.time_from, "to": "now"},
            "refresh": "1m",
            "timezone": "",
            "annotations": {"list": []},
            "links": [
                {
                    "title": "gpupilot dashboards",
                    "type": "dashboards",
                    "tags": ["gpupilot"],
                    "asDropdown": True,
                    "includeVars": False,
                    "keepTime": True,
                }
            ],
            "templating": {
                "list": [
                    _datasource_variable(),
                    *(_variable(v) for v in FILTER_VARIABLES),
                    *(_variable(replace(v, query=filters.variable_query(v.query))) for v in self.variables),
                ]
            },
            "panels": _layout(self.items),
        }


def _datasource_variable() -> JSON:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "includeAll": False,
        "multi": False,
    }


def _variable(v: QueryVariable) -> JSON:
    out: JSON = {
        "name": v.name,
        "label": v.label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": v.query, "refId": f"{v.name}-values"},
        "definition": v.query,
        "refresh": 2,
        "sort": 3,
        "current": {},
        "hide": 0,
        "regex": "",
        "includeAll": v.all_value is not None,
        "multi": v.all_value is not None,
    }
    if v.all_value is not None:
        out["allValue"] = v.all_value
    return out


def _target(t: Target, ref: str) -> JSON:
    return {
        "datasource": DATASOURCE,
        "refId": ref,
        "expr": filters.add_filters(t.expr.strip()),
        "legendFormat": t.legend or "__auto",
        "instant": t.instant,
        "range": not t.instant,
        "format": "table" if t.table else "time_series",
    }


def _field_config(p: Panel) -> JSON:
    defaults: JSON = {"unit": p.unit}
    if p.decimals is not None:
        defaults["decimals"] = p.decimals
    if p.min is not None:
        defaults["min"] = p.min
    if p.max is not None:
        defaults["max"] = p.max
    steps: list[JSON] = [{"color": "green", "value": None}]
    steps += [{"color": colour, "value": value} for value, colour in p.thresholds]
    defaults["thresholds"] = {"mode": "absolute", "steps": steps}
    if p.colour_scheme:
        defaults["color"] = {"mode": p.colour_scheme}
    if p.mappings:
        defaults["mappings"] = [
            {"type": "value", "options": {value: {"text": text, "index": i}}}
            for i, (value, text) in enumerate(p.mappings)
        ]
    if p.kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"mode": "normal" if p.stack else "none", "group": "A"},
        }
    return {"defaults": defaults, "overrides": []}


def _options(p: Panel) -> JSON:
    if p.kind == "timeseries":
        return {
            "legend": {
                "displayMode": "table",
                "placement": "bottom",
                "calcs": ["mean", "max", "lastNotNull"],
            },
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    if p.kind in ("stat", "gauge", "bargauge"):
        return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    if p.kind == "status-history":
        return {"showValue": "never", "rowHeight": 0.9, "legend": {"showLegend": True}}
    return {"showHeader": True, "cellHeight": "sm"}


def _panel(p: Panel, pid: int, grid: JSON) -> JSON:
    out: JSON = {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DATASOURCE,
        "gridPos": grid,
        "targets": [_target(t, chr(ord("A") + i)) for i, t in enumerate(p.targets)],
        "fieldConfig": _field_config(p),
        "options": _options(p),
    }
    if p.kind == "table":
        out["transformations"] = [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}}},
        ]
    return out


def _layout(items: list[Panel | Row]) -> list[JSON]:
    """Left to right, wrapping at 24 columns; a row header starts a new line."""
    out: list[JSON] = []
    x = y = line_height = 0
    for pid, item in enumerate(items, start=1):
        if isinstance(item, Row):
            if x:
                y += line_height
            x, line_height = 0, 0
            out.append(
                {
                    "id": pid,
                    "type": "row",
                    "title": item.title,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                    "panels": [],
                }
            )
            y += 1
            continue
        if not 0 < item.width <= GRID_WIDTH:
            raise ValueError(f"panel {item.title!r}: width {item.width} is outside 1..{GRID_WIDTH}")
        if x + item.width > GRID_WIDTH:
            y += line_height
            x, line_height = 0, 0
        out.append(_panel(item, pid, {"h": item.height, "w": item.width, "x": x, "y": y}))
        x += item.width
        line_height = max(line_height, item.height)
    return out


def stat(
    title: str,
    expr: str,
    unit: str,
    *,
    width: int = 4,
    decimals: int | None = None,
    thresholds: tuple[tuple[float, str], ...] = (),
    mappings: tuple[tuple[str, str], ...] = (),
    description: str = "",
) -> Panel:
    """A single-number panel (last value) of height 4."""
    return Panel(
        title,
        (Target(expr),),
        unit,
        kind="stat",
        width=width,
        height=4,
        decimals=decimals,
        thresholds=thresholds,
        mappings=mappings,
        description=description,
    )
