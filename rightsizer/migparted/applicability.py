"""Which devices can each mig-parted entry be applied to? One verdict per config × device.

An entry with a ``device-filter`` is checked against each device its filter names (with
``--device-id``: only that one, the others are skipped). An entry without one is checked against
``--device-id`` when given, else against every catalogued MIG model. Profile names are matched
exactly, as mig-parted does; an unfiltered entry whose names belong to other GPUs is "not for this
device" (NVIDIA's default ConfigMap is full of those), and it is an error only when it fits none
of the devices it could target. Compute-instance names (``1c.3g.40gb``) are packed into GPU
instances the way mig-parted creates them (a CI joins a GPU instance of its profile while one has
room), then the GPU instances must have a placement (:func:`mig_geometry.placement.place`).

A node's own profile list (its MIG Manager's per-node ConfigMap, :class:`NodeProfiles`) overrides
the catalogue for that node's devices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from mig_geometry.catalogue import (
    GpuModel,
    by_device_id,
    mig_models,
    models_with_name,
    near_misses,
    parse_name,
)
from mig_geometry.placement import describe, place
from rightsizer.migparted.config import Issue, MigEntry, MigPartedConfig, shown

VALID = "valid"
INVALID = "invalid"
NOT_FOR = "not for this device"
SKIPPED = "skipped"
UNKNOWN = "unknown"
UNCATALOGUED = "uncatalogued GPU"


@dataclass(frozen=True)
class NodeProfiles:
    """What a node's MIG Manager says its GPU offers: profile name → most instances per GPU."""

    node: str
    device_id: int | None
    max_counts: Mapping[str, int]


@dataclass(frozen=True)
class Verdict:
    """One row of the applicability table."""

    source: str
    config: str
    entry: int
    device_id: int | None
    device: str
    verdict: str
    reason: str
    error: bool = False
    named: bool = False
    """The device-filter or ``--device-id`` names this device (it was not just swept)."""

    def issue(self) -> Issue:
        return Issue(self.source, self.config, self.entry, self.reason, self.device_id, self.device)


@dataclass(frozen=True)
class ValidationResult:
    verdicts: tuple[Verdict, ...]
    structural: tuple[Issue, ...]
    configs: int
    notes: tuple[str, ...] = field(default=())

    @property
    def issues(self) -> tuple[Issue, ...]:
        return self.structural + tuple(v.issue() for v in self.verdicts if v.error)

    @property
    def ok(self) -> bool:
        return not self.issues

    @property
    def entries_checked(self) -> int:
        return len({(v.source, v.config, v.entry) for v in self.verdicts if v.verdict != SKIPPED})

    @property
    def entries_skipped(self) -> int:
        checked = {(v.source, v.config, v.entry) for v in self.verdicts if v.verdict != SKIPPED}
        return len({(v.source, v.config, v.entry) for v in self.verdicts} - checked)


def gpu_instances(model: GpuModel, counts: Mapping[str, int]) -> tuple[dict[str, int], str | None]:
    """GPU-instance counts for ``counts`` (GI and ``Nc.`` CI names), or the reason there are none.

    Compute instances of one GI profile share GPU instances: first-fit decreasing into instances of
    the profile's compute size, which is what mig-parted's reuse of the last GPU instance achieves
    over the orderings it tries.
    """
    per_gi: dict[str, list[int]] = {}
    for name, count in counts.items():
        found = model.compute_profile(name)
        if found is None:
            return {}, f"profile {name} does not exist on {model.key}"
        gi, size = found
        per_gi.setdefault(gi.name, []).extend([size] * count)
    out: dict[str, int] = {}
    for gi_name, sizes in per_gi.items():
        prof = model.profile(gi_name)
        assert prof is not None
        bins: list[int] = []
        for size in sorted(sizes, reverse=True):
            for i, used in enumerate(bins):
                if used + size <= prof.compute_slices:
                    bins[i] += size
                    break
            else:
                bins.append(size)
        if bins:
            out[gi_name] = len(bins)
    return out, None


def check_model(model: GpuModel, entry: MigEntry) -> str | None:
    """Why ``entry`` cannot be applied to a GPU of ``model``, or ``None`` if it can."""
    if not entry.mig_enabled:
        return None
    if not model.mig_capable:
        return f"{model.key} does not support MIG; use mig-enabled: false"
    return _check_counts(model.key, tuple(entry.mig_devices.items()))


@lru_cache(maxsize=4096)
def _check_counts(model_key: str, items: tuple[tuple[str, int], ...]) -> str | None:
    """Memoised: a file repeats the same layouts (one per config), each checked on every model."""
    model = next(m for m in mig_models() if m.key == model_key)
    counts = dict(items)
    gis, why = gpu_instances(model, counts)
    if why:
        return why
    result = place(model, gis)
    if result.ok:
        return None
    if set(gis) != {n for n, c in counts.items() if c}:
        return f"{describe(counts)} needs GPU instances {describe(gis)}: {result.reason}"
    return result.reason


def check_entry(model: GpuModel, entry: MigEntry) -> str | None:
    """Like :func:`check_model`, with a near-miss hint for names of other GPUs."""
    for name in entry.mig_devices:
        if model.mig_capable and model.compute_profile(name) is None:
            return missing_reason(model, name)
    return check_model(model, entry)


def missing_reason(model: GpuModel, name: str) -> str:
    """``profile 7g.94gb does not exist on H100 96GB (did you mean 7g.96gb?)``."""
    hint = near_misses(model, name)
    if hint:
        return f"profile {name} does not exist on {model.key} (did you mean {hint[0]}?)"
    owners = [m.key for m in models_with_name(name)]
    if owners:
        return f"profile {name} does not exist on {model.key} (it is {', '.join(owners[:3])}'s)"
    names = ", ".join(p.name for p in model.profiles if not p.media_extensions)
    return f"profile {name} does not exist on {model.key} (its profiles: {names})"


def _device_label(model: GpuModel | None, device_id: int) -> str:
    return model.product(device_id) if model is not None else UNCATALOGUED


def _check_node(node: NodeProfiles, entry: MigEntry) -> str | None:
    for name, count in entry.mig_devices.items():
        if name not in node.max_counts:
            offered = ", ".join(sorted(node.max_counts)) or "none"
            return f"profile {name} is not offered on node {node.node} (its MIG Manager lists: {offered})"
        if count > node.max_counts[name]:
            return f"{name}×{count} exceeds the {node.max_counts[name]} node {node.node}'s MIG Manager allows"
    return None


def _one(
    source: str,
    config: str,
    index: int,
    entry: MigEntry,
    *,
    device_id: int,
    subsystem: int | None,
    named: bool,
    node: NodeProfiles | None,
) -> Verdict:
    """The verdict of ``entry`` on one device; ``named``: the filter or --device-id names it."""
    model = by_device_id(device_id, subsystem)
    label = _device_label(model, device_id)

    def row(verdict: str, reason: str, error: bool = False) -> Verdict:
        return Verdict(source, config, index, device_id, label, verdict, reason, error, named)

    if not entry.mig_enabled:
        return row(VALID, "MIG disabled")
    if entry.devices == ():
        return row(VALID, "devices: [] selects no GPU")
    if node is not None and (node.device_id is None or node.device_id == device_id):
        return row(*_against_node(node, entry, model))
    if model is None:
        return row(
            UNKNOWN,
            f"0x{device_id:04x} is not in the geometry catalogue; check with --node NAME against the "
            "profiles the node's MIG Manager lists",
        )
    return row(*_against_model(model, entry, named=named))


def _against_node(node: NodeProfiles, entry: MigEntry, model: GpuModel | None) -> tuple[str, str, bool]:
    """(verdict, reason, error) of ``entry`` against the node's MIG Manager profile list (and the
    catalogue's placement rules where the catalogue knows the model)."""
    why = _check_node(node, entry)
    if why is None and model is not None and model.mig_capable:
        why = check_model(model, entry) if all(model.compute_profile(n) for n in entry.mig_devices) else None
    if why is None:
        return VALID, f"offered by node {node.node}'s MIG Manager", False
    return INVALID, why, True


def _against_model(model: GpuModel, entry: MigEntry, *, named: bool) -> tuple[str, str, bool]:
    """(verdict, reason, error) of a MIG-enabled ``entry`` on a GPU the catalogue knows."""
    if not model.mig_capable:
        if entry.devices == "all":
            return SKIPPED, f"{model.key} has no MIG; mig-parted skips it under devices: all", False
        return INVALID, f"{model.key} does not support MIG; use mig-enabled: false", True
    if not entry.mig_devices:
        return VALID, "MIG on, no instances", False
    missing = [n for n in entry.mig_devices if model.compute_profile(n) is None]
    if missing:
        if named:
            return INVALID, missing_reason(model, missing[0]), True
        return NOT_FOR, f"{model.key} lacks {missing[0]}", False
    why = check_model(model, entry)
    if why is None:
        gis, _ = gpu_instances(model, entry.mig_devices)
        said = describe(entry.mig_devices)
        plain = all(model.profile(n) is not None for n in entry.mig_devices)
        return VALID, said if plain else f"{said} in GPU instances {describe(gis)}", False
    return INVALID, why, named


def validate(
    parsed: Iterable[MigPartedConfig],
    *,
    device_id: int | None = None,
    node: NodeProfiles | None = None,
) -> ValidationResult:
    """Verdicts for every entry × device it could target (see the module doc)."""
    verdicts: list[Verdict] = []
    structural: list[Issue] = []
    configs = 0
    if node is not None and device_id is None:
        device_id = node.device_id
    for doc in parsed:
        structural.extend(doc.issues)
        configs += len(doc.configs)
        for name, entries in doc.configs.items():
            for index, entry in enumerate(entries):
                verdicts.extend(_entry(doc.source, name, index, entry, device_id=device_id, node=node))
    return ValidationResult(tuple(verdicts), tuple(structural), configs)


def _entry(
    source: str, config: str, index: int, entry: MigEntry, *, device_id: int | None, node: NodeProfiles | None
) -> list[Verdict]:
    def one(did: int, sub: int | None, named: bool) -> Verdict:
        return _one(source, config, index, entry, device_id=did, subsystem=sub, named=named, node=node)

    if entry.device_filter:
        targets = entry.filters()
        if device_id is not None:
            mine = [(d, s) for d, s in targets if d == device_id]
            if not mine:
                listed = ", ".join(f"0x{d:04x}" for d, _ in targets)
                model = by_device_id(device_id)
                return [
                    Verdict(
                        source,
                        config,
                        index,
                        device_id,
                        _device_label(model, device_id),
                        SKIPPED,
                        f"device-filter names {listed}",
                    )
                ]
            targets = mine
        return [one(d, s, True) for d, s in targets]
    if device_id is not None:
        got = one(device_id, None, True)
        owner = _owner(entry)
        if got.verdict == INVALID and got.reason.startswith("profile ") and owner is not None:
            # Another GPU's config in a shared file: not an error for this device.
            reason = (
                got.reason if node is not None else f"{', '.join(entry.mig_devices)}: {owner.key} profile(s)"
            )
            return [Verdict(source, config, index, device_id, got.device, NOT_FOR, reason, named=True)]
        return [got]
    if not entry.mig_enabled or entry.devices == ():
        reason = "MIG disabled" if not entry.mig_enabled else "devices: [] selects no GPU"
        return [Verdict(source, config, index, None, "any GPU", VALID, reason)]
    rows = [one(m.device_id, None, False) for m in mig_models()]
    if any(r.verdict == VALID for r in rows):
        return [r if r.verdict != INVALID else _demote(r) for r in rows]
    fitting = [r for r in rows if r.verdict == INVALID]
    if fitting:
        return [r if r.verdict != INVALID else _promote(r) for r in rows]
    best = _best_guess(entry)
    reason = (
        missing_reason(best, next(n for n in entry.mig_devices if best.compute_profile(n) is None))
        if best is not None
        else "no catalogued GPU has these profiles"
    )
    return [
        Verdict(source, config, index, None, "any catalogued GPU", INVALID, f"fits no GPU: {reason}", True)
    ]


def _demote(r: Verdict) -> Verdict:
    return Verdict(r.source, r.config, r.entry, r.device_id, r.device, NOT_FOR, r.reason, False, r.named)


def _promote(r: Verdict) -> Verdict:
    return Verdict(r.source, r.config, r.entry, r.device_id, r.device, r.verdict, r.reason, True, r.named)


def _owner(entry: MigEntry) -> GpuModel | None:
    """A catalogued GPU holding every one of the entry's names: one it fits first, else the first."""
    names = list(entry.mig_devices)
    owners = [m for m in mig_models() if all(m.compute_profile(n) for n in names)]
    return next((m for m in owners if check_model(m, entry) is None), owners[0] if owners else None)


def _best_guess(entry: MigEntry) -> GpuModel | None:
    """The model holding the most of the entry's names, then the one with the nearest near miss."""

    def distance(m: GpuModel) -> int:
        total = 0
        for name in entry.mig_devices:
            if m.compute_profile(name) is None:
                hint = near_misses(m, name)
                want, got = parse_name(name), parse_name(hint[0]) if hint else None
                total += abs(want.memory_gb - got.memory_gb) if want and got else 10_000
        return total

    scored = [
        (-sum(1 for n in entry.mig_devices if m.compute_profile(n)), distance(m), i, m)
        for i, m in enumerate(mig_models())
    ]
    scored.sort(key=lambda t: t[:3])
    return scored[0][3] if scored else None


def summarise(verdicts: Sequence[Verdict], *, limit: int = 3) -> list[tuple[str, str, str, str]]:
    """Table rows (config, devices, verdict, reason): one per entry × verdict, devices joined.

    Devices an unfiltered entry was only swept over and that lack its profiles are left out: a
    shared file is mostly other GPUs' configs, and listing them says nothing.
    """
    verdicts = [v for v in verdicts if v.named or v.verdict != NOT_FOR or " lacks " not in v.reason]
    groups: dict[tuple[str, str, int, str, bool], list[Verdict]] = {}
    for v in verdicts:
        groups.setdefault((v.source, v.config, v.entry, v.verdict, v.error), []).append(v)
    several = {(k[0], k[1]) for k in groups if k[2] != 0}
    rows = []
    for (_src, config, entry, verdict, error), vs in groups.items():
        names = list(
            dict.fromkeys(
                f"0x{v.device_id:04x} {v.device}" if v.device == UNCATALOGUED else v.device for v in vs
            )
        )
        if len(names) > limit:
            devices = f"{len(names)} MIG GPUs"
            reasons = list(dict.fromkeys(v.reason for v in vs))
            reason = reasons[0] if len(reasons) == 1 else "; ".join(reasons[:2])
        else:
            devices = ", ".join(names)
            reasons = list(dict.fromkeys(v.reason for v in vs))
            reason = reasons[0] if len(reasons) == 1 else "; ".join(reasons[:2])
        label = f"{shown(config)}[{entry}]" if (_src, config) in several else shown(config)
        rows.append((label, devices, verdict.upper() if error else verdict, reason))
    return rows
