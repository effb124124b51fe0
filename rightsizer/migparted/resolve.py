"""What a named mig-parted config does to one node, and which existing config equals a layout.

mig-parted applies every entry of the chosen config whose ``device-filter`` matches a GPU and whose
``devices`` name it (``all``: every GPU); a later entry overrides an earlier one for the same GPU.
A plan that would write a new ``gpupilot-…`` config for a layout the cluster's ConfigMap already
has (NVIDIA's ``all-1g.10gb``, ``all-balanced``, …) names that config instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from mig_geometry.catalogue import by_device_id
from rightsizer.migparted.config import MigEntry, MigPartedConfig

GpuState = tuple[bool, tuple[tuple[str, int], ...]]
"""(MIG enabled, sorted non-zero profile counts) of one GPU."""


def _state(enabled: bool, counts: Mapping[str, int], device_id: int | None) -> GpuState:
    model = by_device_id(device_id) if device_id is not None else None
    out: dict[str, int] = {}
    for name, count in counts.items():
        if not count:
            continue
        prof = model.profile(name) if model is not None else None
        key = prof.name if prof is not None else name  # published aliases mean the same profile
        out[key] = out.get(key, 0) + count
    return (enabled, tuple(sorted(out.items())) if enabled else ())


def node_layout(
    entries: Iterable[MigEntry], *, device_id: int | None, gpus: Sequence[int]
) -> dict[int, GpuState]:
    """GPU index → state after applying ``entries`` to a node of ``gpus`` (untouched GPUs absent)."""
    out: dict[int, GpuState] = {}
    for entry in entries:
        if entry.device_filter and device_id not in entry.device_filter:
            continue
        targets = gpus if entry.devices == "all" else [i for i in entry.devices if i in gpus]
        for index in targets:
            out[index] = _state(entry.mig_enabled, entry.mig_devices, device_id)
    return out


def matching_config(
    docs: Iterable[MigPartedConfig],
    *,
    device_id: int | None,
    layouts: Sequence[tuple[int, bool, Mapping[str, int]]],
) -> tuple[str, list[object]] | None:
    """The existing config (name, entries as written) giving every GPU exactly ``layouts``.

    NVIDIA's and other people's names are preferred to ``gpupilot-…`` ones; ties go alphabetically.
    """
    want = {index: _state(enabled, counts, device_id) for index, enabled, counts in layouts}
    gpus = sorted(want)
    found: list[tuple[bool, str, list[object]]] = []
    for doc in docs:
        if doc.issues:
            continue
        for name, entries in doc.configs.items():
            if node_layout(entries, device_id=device_id, gpus=gpus) == want:
                raw = doc.raw.get(name)
                found.append((name.startswith("gpupilot-"), name, list(raw) if isinstance(raw, list) else []))
    if not found:
        return None
    _, name, raw_entries = min(found, key=lambda t: (t[0], t[1]))
    return name, raw_entries
