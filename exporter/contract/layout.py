"""How device series are laid out: which fields (the counters file), MIG series, the host label.

Parsed once at the command line into a frozen :class:`SeriesLayout`; the exposition reads it. The
default is gpupilot's own layout (dcgm-exporter's default fields plus a few, GPU-level fields once
per physical GPU, label ``Hostname``), which is what dashboards and rules in this repository use.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal

from exporter.contract import counters

MigSeries = Literal["per-gpu", "per-instance"]
MIG_SERIES: tuple[MigSeries, ...] = ("per-gpu", "per-instance")
HostnameLabel = Literal["Hostname", "hostname", "none"]
HOSTNAME_LABELS: tuple[HostnameLabel, ...] = ("Hostname", "hostname", "none")


@functools.cache
def _default_selection() -> counters.Selection:
    return counters.gpupilot_default()


@dataclass(frozen=True)
class SeriesLayout:
    selection: counters.Selection = field(default_factory=_default_selection)
    """Fields to publish, with their Prometheus type and help (``-f``/``--collectors``)."""
    mig_series: MigSeries = "per-gpu"
    """``per-gpu``: GPU-level fields once per physical GPU, so sums are right. ``per-instance``:
    dcgm-exporter's layout, every field once per MIG instance with that instance's pods."""
    hostname_label: HostnameLabel = "Hostname"
    """dcgm-exporter 4.x's ``Hostname``; ``hostname`` as its next release; ``none`` drops it."""
    xid_window_s: float = 300.0
    """Window of ``DCGM_EXP_XID_ERRORS_COUNT`` (dcgm-exporter's ``--xid-count-window-size``, 5 min)."""
    clock_events_window_s: float = 300.0
    """Window of ``DCGM_EXP_CLOCK_EVENTS_COUNT`` (``--clock-events-count-window-size``, 5 min)."""
    virtual_gpus: bool = False
    """dcgm-exporter 4.5.3's ``KUBERNETES_VIRTUAL_GPUS``: a shared (time-sliced, MPS) GPU keeps its series
    without pod labels, and each pod holding a replica gets its own series with ``pod``, ``namespace``,
    ``container``, ``pod_uid`` and ``vgpu``: its own ``DCGM_FI_DEV_GPU_UTIL``/``DCGM_FI_DEV_FB_USED``
    (0 when idle), every other field the device's value."""

    @property
    def host_label(self) -> str | None:
        return None if self.hostname_label == "none" else self.hostname_label
