"""A real Prometheus serving a backfilled history, as the rightsizer's tests see it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class History:
    url: str
    """Where the Prometheus answers."""
    start: float
    """First sample of the history (Unix seconds)."""
    end: float
    """Last sample of the history (Unix seconds): tests plan and analyse at this time."""
