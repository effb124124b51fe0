"""Profile names as drivers print them, mapped to the catalogue's names.

Drivers 535/545 print ``3g.39gb`` and ``7g.79gb`` on A100-80GB; the memory-slice count, derived from
the profile's memory as a fraction of the GPU's, identifies the profile whatever the driver calls it.
"""

from __future__ import annotations

import math
import re

from mig_geometry.catalogue import GpuModel, Profile

_NAME = re.compile(r"^(?P<g>\d+)g\.(?P<mem>\d+)gb(?P<me>\+me)?$")


def memory_slices_for(profile_memory_mib: float, total_memory_mib: float, *, slices: int = 8) -> int:
    """``ceil(slices × profile memory / total memory)``, at least 1."""
    if total_memory_mib <= 0:
        raise ValueError("total memory must be positive")
    return max(1, math.ceil(round(slices * profile_memory_mib / total_memory_mib, 6)))


def canonical_profile(model: GpuModel, name: str, *, memory_mib: float | None = None) -> Profile | None:
    """The catalogue profile for a driver-printed name (``3g.39gb`` → ``3g.40gb``)."""
    exact = model.profile(name)
    if exact is not None:
        return exact
    m = _NAME.match(name.strip())
    if not m:
        return None
    compute = int(m.group("g"))
    media = bool(m.group("me"))
    mem_mib = memory_mib if memory_mib is not None else int(m.group("mem")) * 1024
    # A name rounded up past the GPU's total (7g.143gb on 142.6 GiB) still means all slices.
    mem_slices = min(
        model.memory_slices, memory_slices_for(mem_mib, model.memory_mib, slices=model.memory_slices)
    )
    candidates = [
        p
        for p in model.profiles
        if p.compute_slices == compute and p.media_extensions == media and p.memory_slices == mem_slices
    ]
    if len(candidates) != 1:
        return None
    found = candidates[0]
    if memory_mib is None and not _close(mem_mib, found.memory_mib):
        # ``1g.5gb`` on an 80GB part is another GPU's profile, not a driver's spelling of 1g.10gb.
        return None
    return found


def _close(named_mib: float, profile_mib: float) -> bool:
    """A printed size within rounding of the profile's (drivers print 39 for 39.5 GiB)."""
    return abs(named_mib - profile_mib) <= max(1.5 * 1024, 0.05 * profile_mib)
