"""The protocol every device backend (NVML, simulator) implements.

A DCGM-hostengine backend (Ampere's DCP profiling counters, which NVML does not expose) would be one
more implementation returning the same :class:`~exporter.snapshot.NodeSnapshot`, chosen in
:func:`exporter.commands.cli.build_backend`. It is not built: DCGM cannot be installed or tested here.
"""

from __future__ import annotations

from typing import Protocol

from exporter.snapshot import NodeSnapshot


class Backend(Protocol):
    name: str
    """``nvml`` or ``sim``; the ``backend`` label of the exporter's self-metrics."""

    def open(self) -> None:
        """Initialise; raise :class:`exporter.errors.BackendUnavailable` if the device layer is absent."""

    def read(self) -> NodeSnapshot:
        """One collection. Per-field failures are counted in ``field_errors``, not raised; raise
        :class:`exporter.errors.BackendError` only when nothing usable could be read."""

    def close(self) -> None:
        """Release handles; ``open`` may be called again after it (re-initialisation after a fault)."""
