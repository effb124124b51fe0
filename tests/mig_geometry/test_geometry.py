"""MIG geometry: placement rules, enumeration counts, the reference's named consequences, name derivation,
and every catalogue model by PCI device id; property tests against a brute-force placement search."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mig_geometry.catalogue import (
    MODELS,
    GpuModel,
    ProfileName,
    by_device_id,
    find_model,
    models_with_name,
    name_gb,
    near_misses,
    parse_name,
)
from mig_geometry.layouts import as_layout, compute_slices, maximal_layouts, valid_layouts
from mig_geometry.names import canonical_profile, memory_slices_for
from mig_geometry.placement import describe, fits, place

MIG_MODELS = [m for m in MODELS if m.mig_capable]
SEVEN = [m for m in MIG_MODELS if m.compute_slices == 7]


def model(key: str) -> GpuModel:
    m = find_model(key)
    assert m is not None, key
    return m


def brute_force(m: GpuModel, counts: Mapping[str, int]) -> bool:
    """Try every combination of allowed starts; independent of placement.py's search."""
    wanted = []
    for name, n in counts.items():
        p = m.profile(name)
        if p is None or n > p.max_count:
            return False
        wanted += [p] * n
    if sum(p.compute_slices for p in wanted) > m.compute_slices:
        return False
    if sum(p.memory_slices for p in wanted) > m.memory_slices:
        return False
    for starts in itertools.product(*(p.starts for p in wanted)):
        used: set[int] = set()
        ok = True
        for p, s in zip(wanted, starts, strict=True):
            rng = set(range(s, s + p.memory_slices))
            if s + p.memory_slices > m.memory_slices or rng & used:
                ok = False
                break
            used |= rng
        if ok:
            return True
    return False


def check_placement(m: GpuModel, counts: Mapping[str, int]) -> None:
    res = place(m, counts)
    assert res.placed is not None, res.reason
    used: set[int] = set()
    for pl in res.placed:
        assert pl.start in pl.profile.starts
        rng = set(range(pl.start, pl.start + pl.size))
        assert not rng & used and max(rng) < m.memory_slices
        used |= rng
    got: dict[str, int] = {}
    for pl in res.placed:
        got[pl.profile.name] = got.get(pl.profile.name, 0) + 1
    assert got == {k: v for k, v in counts.items() if v}


@pytest.mark.parametrize("m", SEVEN, ids=lambda m: m.key)
def test_counts_match_reference(m: GpuModel) -> None:
    assert len(valid_layouts(m)) == 77
    assert len(maximal_layouts(m)) == 28


def test_a30_is_a_four_slice_part() -> None:
    a30 = model("A30")
    assert [p.name for p in a30.profiles] == ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]
    assert fits(a30, {"1g.6gb": 4}) and fits(a30, {"2g.12gb": 2}) and fits(a30, {"2g.12gb": 1, "1g.6gb": 2})
    assert not fits(a30, {"4g.24gb": 1, "1g.6gb": 1})
    assert not fits(a30, {"1g.6gb": 5})


@pytest.mark.parametrize("m", MIG_MODELS, ids=lambda m: m.key)
def test_every_enumerated_layout_has_a_placement(m: GpuModel) -> None:
    for lay in valid_layouts(m):
        check_placement(m, dict(lay))
        assert compute_slices(m, lay) <= m.compute_slices


@pytest.mark.parametrize("m", MIG_MODELS, ids=lambda m: m.key)
def test_adding_any_profile_to_a_maximal_layout_fails(m: GpuModel) -> None:
    for lay in maximal_layouts(m):
        counts = dict(lay)
        for p in m.profiles:
            if p.media_extensions:
                continue
            bigger = {**counts, p.name: counts.get(p.name, 0) + 1}
            assert not fits(m, bigger), (lay, p.name)
            assert not brute_force(m, bigger)


@pytest.mark.parametrize("m", [model("H100 80GB"), model("A30")], ids=lambda m: m.key)
def test_enumeration_is_exactly_the_brute_force_set(m: GpuModel) -> None:
    profs = [p for p in m.profiles if not p.media_extensions]
    expected = set()
    for combo in itertools.product(*(range(p.max_count + 1) for p in profs)):
        counts = {p.name: c for p, c in zip(profs, combo, strict=True) if c}
        if counts and brute_force(m, counts):
            expected.add(as_layout(counts))
    assert set(valid_layouts(m)) == expected


@st.composite
def random_layout(draw: st.DrawFn) -> tuple[GpuModel, dict[str, int]]:
    m = draw(st.sampled_from(MIG_MODELS))
    counts = {p.name: draw(st.integers(0, min(p.max_count, 3))) for p in m.profiles}
    return m, {k: v for k, v in counts.items() if v}


@pytest.mark.slow
@settings(max_examples=400, deadline=None)
@given(random_layout())
def test_place_succeeds_iff_brute_force_finds_one(case: tuple[GpuModel, dict[str, int]]) -> None:
    m, counts = case
    res = place(m, counts)
    assert res.ok == brute_force(m, counts), (m.key, counts, res.reason)
    if res.ok:
        check_placement(m, counts)
    else:
        assert res.reason


@pytest.mark.parametrize(
    ("counts", "valid"),
    [
        ({"1g.10gb": 7}, True),
        ({"3g.40gb": 1, "1g.10gb": 4}, True),
        ({"4g.40gb": 1, "3g.40gb": 1}, True),
        ({"3g.40gb": 2}, True),
        ({"3g.40gb": 2, "1g.10gb": 1}, False),
        ({"2g.20gb": 3, "1g.10gb": 1}, True),
        ({"1g.10gb": 8}, False),
        ({"7g.80gb": 1, "1g.10gb": 1}, False),
        ({"1g.20gb": 4}, True),
        ({"1g.20gb": 4, "1g.10gb": 1}, False),
        ({"1g.10gb+me": 1, "1g.10gb": 6}, True),
        ({"1g.10gb+me": 2}, False),
    ],
)
def test_reference_consequences_on_h100(counts: dict[str, int], valid: bool) -> None:
    h100 = model("H100 80GB")
    assert fits(h100, counts) is valid
    assert brute_force(h100, counts) is valid


def test_concrete_placements_of_named_cases() -> None:
    h100 = model("H100 80GB")
    res = place(h100, {"3g.40gb": 1, "1g.10gb": 4})
    assert res.placed is not None
    three = next(p for p in res.placed if p.profile.name == "3g.40gb")
    assert three.start == 4
    assert sorted(p.start for p in res.placed if p.profile.name == "1g.10gb") == [0, 1, 2, 3]
    res = place(h100, {"4g.40gb": 1, "3g.40gb": 1})
    assert res.placed is not None
    assert {(p.profile.name, p.start) for p in res.placed} == {("4g.40gb", 0), ("3g.40gb", 4)}


def test_reasons_are_specific() -> None:
    h100 = model("H100 80GB")
    assert "does not exist on H100 80GB" in place(h100, {"1g.5gb": 1}).reason
    assert "exceeds the maximum of 2" in place(h100, {"3g.40gb": 3}).reason
    assert "needs 8 compute slices" in place(h100, {"4g.40gb": 1, "2g.20gb": 2}).reason
    assert "no valid placement" in place(h100, {"3g.40gb": 2, "1g.10gb": 1}).reason
    assert "does not support MIG" in place(model("L4"), {"1g.10gb": 1}).reason
    assert describe({"3g.40gb": 2, "1g.10gb": 1}) == "3g.40gb×2 + 1g.10gb×1"


def test_name_derivation_for_driver_spellings() -> None:
    a100 = model("A100 80GB")
    assert canonical_profile(a100, "3g.39gb").name == "3g.40gb"  # type: ignore[union-attr]
    assert canonical_profile(a100, "7g.79gb").name == "7g.80gb"  # type: ignore[union-attr]
    assert canonical_profile(a100, "1g.10gb").name == "1g.10gb"  # type: ignore[union-attr]
    assert canonical_profile(a100, "1g.5gb") is None  # an A100-40GB profile, not a spelling
    assert canonical_profile(a100, "nonsense") is None
    a40 = model("A100 40GB")
    assert canonical_profile(a40, "1g.10gb").memory_slices == 2  # type: ignore[union-attr]
    # Memory reported by NVML decides when given.
    assert canonical_profile(a100, "3g.39gb", memory_mib=40192).name == "3g.40gb"  # type: ignore[union-attr]
    assert memory_slices_for(40192, 81920) == 4
    assert memory_slices_for(10240, 81920) == 1
    with pytest.raises(ValueError):
        memory_slices_for(1, 0)


@pytest.mark.parametrize(
    ("device_id", "key", "names"),
    [
        (0x20B0, "A100 40GB", ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
        (
            0x20B2,
            "A100 80GB",
            ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        ),
        (
            0x2330,
            "H100 80GB",
            ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        ),
        (
            0x2321,
            "H100 NVL",
            ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
        ),
        (
            0x2342,
            "H100 96GB",
            ["1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"],
        ),
        (0x2335, "H200", ["1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"]),
        (
            0x2348,
            "GH200 144GB",
            ["1g.18gb", "1g.18gb+me", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"],
        ),
        (0x2901, "B200", ["1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"]),
        (0x20B7, "A30", ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]),
        (0x2941, "GB200", ["1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"]),
        (
            0x3182,
            "B300",
            ["1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"],
        ),
        (
            0x31C2,
            "GB300",
            ["1g.35gb", "1g.35gb+me", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb"],
        ),
        (
            0x2BB5,
            "RTX PRO 6000",
            [
                "1g.24gb",
                "1g.24gb+gfx",
                "1g.24gb-me",
                "1g.24gb+me.all",
                "2g.48gb",
                "2g.48gb+gfx",
                "2g.48gb-me",
                "2g.48gb+me.all",
                "4g.96gb",
                "4g.96gb+gfx",
            ],
        ),
    ],
)
def test_catalogue_by_device_id(device_id: int, key: str, names: list[str]) -> None:
    m = by_device_id(device_id)
    assert m is not None and m.key == key
    assert [p.name for p in m.profiles] == names
    assert by_device_id((device_id << 16) | 0x10DE) is m
    assert find_model(f"0x{device_id:04x}") is m
    assert m.device_filter() == f"0x{m.device_id:04X}10DE"


@pytest.mark.parametrize(
    "device_id",
    [
        0x20B1,
        0x20F1,
        0x20F6,
        0x20B5,
        0x20F3,
        0x20F5,
        0x2331,
        0x2322,
        0x2324,
        0x233A,
        0x233D,
        0x20B6,
        0x2329,
        0x233B,
    ],
)
def test_every_listed_device_id_resolves(device_id: int) -> None:
    m = by_device_id(device_id)
    assert m is not None and m.mig_capable


def test_profile_tables_are_consistent() -> None:
    for m in SEVEN:
        assert m.memory_slices == 8
        by_id = {p.gi_profile_id: p for p in m.profiles}
        assert by_id[19].starts == tuple(range(7)) and by_id[19].max_count == 7
        assert by_id[20].max_count == 1
        assert by_id[15].starts == (0, 2, 4, 6) and by_id[15].max_count == 4
        assert by_id[14].starts == (0, 2, 4) and by_id[14].max_count == 3
        assert by_id[9].starts == (0, 4) and by_id[9].memory_slices == 4 and by_id[9].max_count == 2
        assert by_id[5].starts == (0,) and by_id[0].memory_slices == 8
    h100 = model("H100 80GB")
    assert h100.profile("1g.10gb").sms == 16 and h100.profile("1g.20gb").sms == 26  # type: ignore[union-attr]
    assert h100.profile("7g.80gb").sms == 132  # type: ignore[union-attr]
    assert by_device_id(0x2236).mig_capable is False  # type: ignore[union-attr]  # A10


# -- the catalogue's facts: names by mig-parted's rule, exact MiB, variants, CI profiles, sources ----------


@pytest.mark.parametrize(
    ("total_gb", "expected"),
    [
        (40, (5, 10, 20, 40)),  # A100 40GB
        (80, (10, 20, 40, 80)),  # A100/H100 80GB
        (94, (12, 24, 47, 94)),  # H100 NVL: 11.75 → 12, 23.5 → 24
        (141, (18, 35, 71, 141)),  # H200: 70.5 → 71
        (180, (23, 45, 90, 180)),  # B200: 22.5 → 23
        (186, (23, 47, 93, 186)),  # GB200 (GPU Operator default config)
        (189, (24, 47, 95, 189)),  # GB200 (mig-parted's Hopper/Blackwell example)
        (269, (34, 67, 135, 269)),  # B300
    ],
)
def test_names_follow_mig_parteds_rounding(total_gb: int, expected: tuple[int, ...]) -> None:
    assert tuple(name_gb(s, 8, total_gb) for s in (1, 2, 4, 8)) == expected


def test_a100_profiles_hold_the_published_mib_not_round_figures() -> None:
    a40 = model("A100 40GB")
    assert [a40.profile(n).memory_mib for n in ("1g.5gb", "1g.10gb", "3g.20gb", "7g.40gb")] == [  # type: ignore[union-attr]
        4864,
        9856,
        19968,
        40192,
    ]
    a80 = model("A100 80GB")
    assert [a80.profile(n).memory_mib for n in ("1g.10gb", "2g.20gb", "4g.40gb", "7g.80gb")] == [  # type: ignore[union-attr]
        9856,
        19968,
        40192,
        80384,
    ]
    # No inferred profile holds more than its share of the part's memory.
    for m in MIG_MODELS:
        for p in m.profiles:
            assert p.memory_mib <= m.memory_mib * p.memory_slices / m.memory_slices, (m.key, p.name)


def test_every_mig_model_names_its_source_and_products() -> None:
    for m in MIG_MODELS:
        assert m.source, m.key
        assert {p.device_id for p in m.products} == set(m.device_ids), m.key
        if m.inferred:
            assert "inferred" in m.source, m.key
    assert not model("A100 40GB").inferred and "lgipp" in model("A100 40GB").source


def test_gb200_accepts_both_published_name_sets_and_nothing_else() -> None:
    gb200 = model("GB200")
    for name in ("1g.23gb", "1g.24gb", "3g.93gb", "3g.95gb", "7g.186gb", "7g.189gb", "1g.24gb+me", "2g.47gb"):
        assert gb200.profile(name) is not None, name
    assert gb200.profile("1g.24gb") is gb200.profile("1g.23gb")
    assert gb200.profile("7g.180gb") is None and gb200.profile("3g.94gb") is None


@pytest.mark.parametrize(
    ("key", "name", "gi", "size"),
    [
        ("H100 80GB", "1c.3g.40gb", "3g.40gb", 1),
        ("A100 40GB", "2c.3g.20gb", "3g.20gb", 2),
        ("A100 40GB", "1c.7g.40gb", "7g.40gb", 1),
        ("H100 80GB", "4c.7g.80gb", "7g.80gb", 4),
        ("A30", "2c.4g.24gb", "4g.24gb", 2),
        ("H100 80GB", "3g.40gb", "3g.40gb", 3),
    ],
)
def test_compute_instance_names(key: str, name: str, gi: str, size: int) -> None:
    found = model(key).compute_profile(name)
    assert found is not None and (found[0].name, found[1]) == (gi, size)


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("H100 80GB", "3c.4g.40gb"),  # a 4g instance has no 3-slice compute instance
        ("H100 80GB", "3c.3g.40gb"),  # the whole instance is spelled 3g.40gb
        ("H100 80GB", "1c.3g.47gb"),  # another GPU's GI name
        ("H100 80GB", "1c.1g.10gb+me"),
    ],
)
def test_compute_instance_names_refused(key: str, name: str) -> None:
    assert model(key).compute_profile(name) is None


@pytest.mark.parametrize(
    ("key", "name", "hint"),
    [
        ("H100 96GB", "7g.94gb", "7g.96gb"),
        ("H100 NVL", "7g.96gb", "7g.94gb"),
        ("GH200 144GB", "3g.71gb", "3g.72gb"),
        ("H200", "7g.144gb", "7g.141gb"),
        ("B200", "7g.186gb", "7g.180gb"),
        ("A100 80GB", "3g.39gb", "3g.40gb"),
        ("A30", "1g.5gb", "1g.6gb"),
    ],
)
def test_other_gpus_names_are_not_this_gpus_and_get_a_hint(key: str, name: str, hint: str) -> None:
    m = model(key)
    assert m.profile(name) is None and m.compute_profile(name) is None
    assert near_misses(m, name)[0] == hint


def test_parse_name_forms() -> None:
    assert parse_name("1c.3g.40gb") == ProfileName(3, 40, "", 1)
    assert parse_name("1g.24gb+me.all") == ProfileName(1, 24, "+me.all")
    assert parse_name("2g.48gb-me") == ProfileName(2, 48, "-me")
    for bad in ("3g.40GB", "3g", "g.40gb", "1g.10gb+xx", "1c.3g.40gb.x", ""):
        assert parse_name(bad) is None, bad


def test_unknown_subsystem_falls_back_to_the_device_id() -> None:
    assert by_device_id(0x2330, 0x16C110DE) is model("H100 80GB")
    assert by_device_id(0x9999) is None
    assert models_with_name("7g.80gb") == (model("A100 80GB"), model("H100 80GB"))
