"""Does a MIG layout fit a GPU, and where? The rule that decides which layouts exist.

A layout (profile name → count) is valid iff every profile belongs to the model, counts are within
each profile's maximum, the compute slices add up to at most the part's, and some choice of allowed
starts makes the instances' memory ranges disjoint. mig-parted has no placement field: the driver
places, so "a disjoint placement exists" is exactly "the MIG Manager can apply it".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mig_geometry.catalogue import GpuModel, Profile


@dataclass(frozen=True)
class Placed:
    profile: Profile
    start: int

    @property
    def size(self) -> int:
        return self.profile.memory_slices


@dataclass(frozen=True)
class PlacementResult:
    """Either a concrete placement (``placed``) or the reason none exists (``reason``)."""

    placed: tuple[Placed, ...] | None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.placed is not None


def describe(counts: Mapping[str, int]) -> str:
    """``3g.40gb×2 + 1g.10gb×1`` — the layout as users read it in errors and tables."""
    items = [(n, c) for n, c in counts.items() if c]
    if not items:
        return "(no instances)"
    return " + ".join(f"{n}×{c}" for n, c in items)


def place(model: GpuModel, counts: Mapping[str, int]) -> PlacementResult:
    """Find a placement for ``counts`` on ``model`` or explain why there is none."""
    if not model.mig_capable:
        return PlacementResult(None, f"{model.key} does not support MIG")
    wanted: list[Profile] = []
    for name, count in counts.items():
        if count < 0:
            return PlacementResult(None, f"{name}: count {count} is negative")
        if count == 0:
            continue
        prof = model.profile(name)
        if prof is None:
            known = ", ".join(p.name for p in model.profiles)
            return PlacementResult(None, f"profile {name} does not exist on {model.key} (known: {known})")
        if count > prof.max_count:
            return PlacementResult(
                None, f"{name}×{count} exceeds the maximum of {prof.max_count} per GPU on {model.key}"
            )
        wanted.extend([prof] * count)
    compute = sum(p.compute_slices for p in wanted)
    if compute > model.compute_slices:
        return PlacementResult(
            None,
            f"{describe(counts)} needs {compute} compute slices; {model.key} has {model.compute_slices}",
        )
    memory = sum(p.memory_slices for p in wanted)
    if memory > model.memory_slices:
        return PlacementResult(
            None,
            f"{describe(counts)} has no valid placement on {model.key}: needs {memory} memory slices "
            f"of {model.memory_slices}",
        )
    # Largest first, fewest starts first: the search space is tiny (≤ 7 instances, ≤ 8 slices).
    wanted.sort(key=lambda p: (-p.memory_slices, len(p.starts), p.name))
    found = _search(wanted, 0, 0, [], model.memory_slices)
    if found is None:
        return PlacementResult(None, f"{describe(counts)} has no valid placement on {model.key}")
    ordered = tuple(sorted(found, key=lambda pl: pl.start))
    return PlacementResult(ordered)


def _search(wanted: list[Profile], i: int, used: int, acc: list[Placed], slices: int) -> list[Placed] | None:
    if i == len(wanted):
        return list(acc)
    prof = wanted[i]
    # Identical profiles are placed in increasing start order to avoid permuted duplicates.
    min_start = acc[-1].start + 1 if acc and acc[-1].profile is prof else 0
    for start in prof.starts:
        if start < min_start or start + prof.memory_slices > slices:
            continue
        mask = ((1 << prof.memory_slices) - 1) << start
        if used & mask:
            continue
        acc.append(Placed(prof, start))
        got = _search(wanted, i + 1, used | mask, acc, slices)
        if got is not None:
            return got
        acc.pop()
    return None


def fits(model: GpuModel, counts: Mapping[str, int]) -> bool:
    return place(model, counts).ok
