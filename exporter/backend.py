"""The protocol every device backend (NVML, simulator) implements."""

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
