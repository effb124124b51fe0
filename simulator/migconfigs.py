"""The GPU Operator's built-in mig-parted config names, resolved per GPU model.

``all-disabled`` (no MIG), ``all-enabled`` (MIG on, no instances), ``all-<profile>`` (as many of
that profile as fit) and ``all-balanced`` (2×1g + 1×2g + 1×3g on 7-slice parts, 2×1g + 1×2g on A30),
as in shared/reference/mig-geometry.md.
"""

from __future__ import annotations

from mig_geometry.catalogue import GpuModel


def resolve_builtin(model: GpuModel, name: str) -> dict[str, int] | None:
    """Counts for a built-in name (``None`` = MIG disabled); ``KeyError`` if the name is unknown here."""
    if name == "all-disabled":
        return None
    if not model.mig_capable:
        raise KeyError(f"{name} needs MIG, which {model.key} does not support")
    if name == "all-enabled":
        return {}
    if name == "all-balanced":
        singles = [p for p in model.profiles if p.compute_slices == 1 and not p.media_extensions]
        small = min(singles, key=lambda p: p.memory_slices)
        counts = {small.name: 2}
        for compute in (2, 3) if model.compute_slices == 7 else (2,):
            prof = next(p for p in model.profiles if p.compute_slices == compute)
            counts[prof.name] = 1
        return counts
    if name.startswith("all-"):
        named = model.profile(name.removeprefix("all-"))
        if named is not None:
            return {named.name: named.max_count}
    known = ", ".join(f"all-{p.name}" for p in model.profiles)
    raise KeyError(
        f"unknown MIG config {name!r} for {model.key} (built-in: all-disabled, all-enabled, all-balanced, {known})"
    )
