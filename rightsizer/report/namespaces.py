"""GPU use per namespace (the chargeback view): GPU-hours allocated and idle, and their cost, from the
plan's per-device evidence, folded with pandas and written beside the report as ``namespaces.csv``.

A device's GPU-hours are its share of a GPU (``3g`` of 7 compute slices: 3/7; a whole GPU: 1) times
the hours with data; its idle GPU-hours are that share times the hours whose activity stayed under the
plan's idle threshold. A device shared by several pods is split evenly among their namespaces.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from gpupilot_common import csvsafe

COLUMNS = ("namespace", "devices", "gpu_hours_allocated", "gpu_hours_idle", "idle_share", "cost", "idle_cost")
"""The CSV's columns, in order (``cost`` and ``idle_cost`` empty without a price)."""


@dataclass(frozen=True)
class DeviceUse:
    """One allocated device's use over the window."""

    pods: tuple[str, ...]
    """``namespace/name`` of each pod holding it."""
    gpu_share: float
    hours: float
    idle_hours: float


@dataclass(frozen=True)
class NamespaceUse:
    namespace: str
    devices: float
    gpu_hours_allocated: float
    gpu_hours_idle: float
    idle_share: float
    cost: float | None
    idle_cost: float | None


def frame(devices: Iterable[DeviceUse], *, price: float | None) -> pd.DataFrame:
    """One row per namespace, most idle GPU-hours first (then by name); columns :data:`COLUMNS`."""
    rows = []
    for d in devices:
        owners = [p.split("/", 1)[0] if "/" in p else "-" for p in d.pods] or ["-"]
        weight = 1.0 / len(owners)
        for ns in owners:
            rows.append(
                {
                    "namespace": ns,
                    "devices": weight,
                    "gpu_hours_allocated": d.gpu_share * d.hours * weight,
                    "gpu_hours_idle": d.gpu_share * d.idle_hours * weight,
                }
            )
    if not rows:
        return pd.DataFrame(columns=list(COLUMNS))
    table = pd.DataFrame(rows).groupby("namespace", as_index=False).sum()
    allocated = table["gpu_hours_allocated"]
    table["idle_share"] = (table["gpu_hours_idle"] / allocated.where(allocated > 0)).fillna(0.0)
    table["cost"] = allocated * price if price is not None else None
    table["idle_cost"] = table["gpu_hours_idle"] * price if price is not None else None
    table = table.sort_values(["gpu_hours_idle", "namespace"], ascending=[False, True], kind="stable")
    return table[list(COLUMNS)].reset_index(drop=True)


def lines(table: pd.DataFrame) -> tuple[NamespaceUse, ...]:
    """The frame as plain records (what the renderers show)."""

    def money(v: object) -> float | None:
        return float(v) if isinstance(v, int | float) and not math.isnan(v) else None  # NaN: no price

    return tuple(
        NamespaceUse(
            namespace=str(r["namespace"]),
            devices=float(r["devices"]),
            gpu_hours_allocated=float(r["gpu_hours_allocated"]),
            gpu_hours_idle=float(r["gpu_hours_idle"]),
            idle_share=float(r["idle_share"]),
            cost=money(r["cost"]),
            idle_cost=money(r["idle_cost"]),
        )
        for r in table.to_dict("records")
    )


def csv_text(table: pd.DataFrame) -> str:
    """The CSV written beside the report: numbers rounded to 0.01, no index column, RFC 4180 lines,
    text cells safe
    for spreadsheets (:mod:`gpupilot_common.csvsafe`: a namespace ``=cmd()`` is written ``'=cmd()``)."""
    out = table.round(2)
    for column in out.columns:
        if not pd.api.types.is_numeric_dtype(out[column]):
            out[column] = out[column].map(lambda v: csvsafe.cell(v) if isinstance(v, str) else v)
    buf = io.StringIO()
    # RFC 4180's CRLF: a cell holding a carriage return or a line break is then quoted, never split
    out.to_csv(buf, index=False, lineterminator="\r\n")
    return buf.getvalue()
