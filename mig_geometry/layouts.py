"""Enumeration of every valid MIG layout of a model (profile multisets with a placement)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

from mig_geometry.catalogue import GpuModel, Profile
from mig_geometry.placement import fits

Layout = tuple[tuple[str, int], ...]
"""A layout as a sorted tuple of (profile name, count), hashable and stable."""


def as_layout(counts: dict[str, int]) -> Layout:
    return tuple(sorted((n, c) for n, c in counts.items() if c))


def _profiles(model: GpuModel, media_extensions: bool) -> list[Profile]:
    return [p for p in model.profiles if media_extensions or not p.media_extensions]


@cache
def valid_layouts(model: GpuModel, *, media_extensions: bool = False) -> tuple[Layout, ...]:
    """All non-empty layouts of ``model`` that have a placement, smallest first."""
    profs = _profiles(model, media_extensions)
    out: list[Layout] = []

    def rec(i: int, counts: dict[str, int]) -> Iterator[None]:
        if i == len(profs):
            if any(counts.values()) and fits(model, counts):
                out.append(as_layout(counts))
            yield None
            return
        p = profs[i]
        for c in range(p.max_count + 1):
            counts[p.name] = c
            # Prune: if this prefix cannot be placed, more instances will not help.
            if c and not fits(model, counts):
                break
            yield from rec(i + 1, counts)
        counts[p.name] = 0

    for _ in rec(0, {}):
        pass
    out.sort(key=lambda lay: (sum(c for _, c in lay), lay))
    return tuple(out)


@cache
def maximal_layouts(model: GpuModel, *, media_extensions: bool = False) -> tuple[Layout, ...]:
    """Valid layouts to which no further instance of any profile can be added."""
    profs = _profiles(model, media_extensions)
    result = []
    for lay in valid_layouts(model, media_extensions=media_extensions):
        counts = dict(lay)
        if all(not fits(model, {**counts, p.name: counts.get(p.name, 0) + 1}) for p in profs):
            result.append(lay)
    return tuple(result)


def compute_slices(model: GpuModel, layout: Layout) -> int:
    total = 0
    for name, count in layout:
        prof = model.profile(name)
        if prof is not None:
            total += prof.compute_slices * count
    return total
