"""The simulator's allocations on a device-plugin node, typed as such (a DRA node's claims are not)."""

from __future__ import annotations

from exporter.attribute.podresources import dra
from exporter.snapshot import Allocations
from simulator.backend import SimBackend


def plugin_allocations(backend: SimBackend, t: float | None = None) -> Allocations:
    """``backend.allocations(t)``, which on a device-plugin node is device UUID → containers."""
    found = backend.allocations(t)
    assert not isinstance(found, dra.Attribution), "a DRA node: resolve its claims first"
    return found
