"""mig-parted configs: the spec (parse), per config × device applicability (NVIDIA's verdicts), the writer."""

from __future__ import annotations

from pathlib import Path

import pytest

from mig_geometry.catalogue import find_model
from rightsizer.migparted import applicability, manifest
from rightsizer.migparted import config as migparted
from rightsizer.migparted.applicability import NOT_FOR, SKIPPED, VALID
from rightsizer.migparted.config import MigEntry, MigPartedError
from tests.support.rightsizer import nvidia_configs

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "mig-configs"
H100 = find_model("H100 80GB")


def parse(text: str) -> list[migparted.MigPartedConfig]:
    return manifest.load_manifest(text, source="t.yaml").mig


def check(text: str, **kw: object) -> applicability.ValidationResult:
    return applicability.validate(parse(text), **kw)  # type: ignore[arg-type]


def lines(text: str, **kw: object) -> list[str]:
    return [i.line() for i in check(text, **kw).issues]


def one_entry(body: str, *, filt: str = "", devices: str = "all") -> str:
    """A config ``c`` with one entry; ``body`` is the entry's mig-enabled/mig-devices YAML (flow)."""
    f = f"      device-filter: {filt}\n" if filt else ""
    return f"version: v1\nmig-configs:\n  c:\n    - devices: {devices}\n{f}      {body}\n"


def enabled(devs: str, **kw: str) -> str:
    return one_entry(f"mig-enabled: true\n      mig-devices: {devs}", **kw)


# -- NVIDIA's own files: their verdict is "valid", for no device and for every device they name ----------


def test_default_configmap_passes_for_no_device() -> None:
    result = check(nvidia_configs.default_like_configmap())
    assert result.ok, result.issues[:3]
    assert result.configs == len(nvidia_configs.default_like_configs()["mig-configs"])


@pytest.mark.parametrize("device_id", nvidia_configs.NAMED_DEVICE_IDS, ids=hex)
def test_default_configmap_passes_for_every_device_it_names(device_id: int) -> None:
    result = check(nvidia_configs.default_like_configmap(), device_id=device_id)
    assert result.ok, [i.line() for i in result.issues[:3]]
    assert any(v.verdict == VALID and v.config == "all-balanced" for v in result.verdicts)


def test_manager_example_manifest_skips_other_kinds_and_passes() -> None:
    found = manifest.load_manifest(nvidia_configs.manager_example_manifest(), source="ex.yaml")
    assert [n.split(": ", 1)[1].split(" ")[0] for n in found.notes] == [
        "DaemonSet",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
    ]
    assert len(found.mig) == 1 and found.mig[0].issues == ()
    result = applicability.validate(found.mig)
    assert result.ok, result.issues
    for did in (0x2941, 0x2901, 0x2335, 0x2330, 0x2321):
        assert applicability.validate(found.mig, device_id=did).ok, hex(did)


def test_gb200_rows_accept_the_189gb_names_of_migparteds_example() -> None:
    result = applicability.validate(
        manifest.load_manifest(nvidia_configs.manager_example_manifest(), source="ex.yaml").mig,
        device_id=0x2941,
    )
    rows = {(v.config, v.entry): v for v in result.verdicts}
    assert rows[("all-balanced", 0)].verdict == VALID
    assert rows[("all-1g.24gb", 0)].verdict == VALID
    assert rows[("all-1g.24gb", 1)].verdict == SKIPPED


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_seed_configs_are_valid_for_h100(path: Path) -> None:
    result = applicability.validate(manifest.load_path(path).mig, device_id=0x2330)
    assert result.ok, [i.line() for i in result.issues]
    assert result.entries_checked >= 3


# -- exact names, with hints ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filt", "name", "count", "expected"),
    [
        ('"0x234210DE"', "7g.94gb", 1, "profile 7g.94gb does not exist on H100 96GB (did you mean 7g.96gb?)"),
        ('"0x234210DE"', "3g.47gb", 1, "(did you mean 3g.48gb?)"),
        ('"0x232110DE"', "7g.96gb", 1, "(did you mean 7g.94gb?)"),
        ('"0x234810DE"', "2g.35gb", 1, "(did you mean 2g.36gb?)"),
        ('"0x234810DE"', "3g.71gb", 1, "(did you mean 3g.72gb?)"),
        ('"0x234810DE"', "7g.141gb", 1, "(did you mean 7g.144gb?)"),
        ('"0x233510DE"', "7g.144gb", 1, "(did you mean 7g.141gb?)"),
        ('"0x290110DE"', "7g.186gb", 1, "(did you mean 7g.180gb?)"),
        ('"0x20B210DE"', "3g.39gb", 1, "(did you mean 3g.40gb?)"),
        ('"0x20B710DE"', "1g.5gb", 1, "(did you mean 1g.6gb?)"),
    ],
)
def test_names_of_other_gpus_are_refused_with_a_hint(filt: str, name: str, count: int, expected: str) -> None:
    out = lines(enabled(f'{{"{name}": {count}}}', filt=filt))
    assert len(out) == 1 and expected in out[0], out


def test_unfiltered_entry_of_another_gpu_is_not_for_this_device() -> None:
    text = enabled('{"7g.94gb": 1}')
    result = check(text, device_id=0x2342)
    assert result.ok
    (row,) = result.verdicts
    assert row.verdict == NOT_FOR and "H100 NVL" in row.reason
    # ... and fits H100 NVL when no device is given.
    assert check(text).ok
    assert any(v.verdict == VALID and v.device == "H100 NVL" for v in check(text).verdicts)


def test_name_on_no_gpu_is_an_error_with_the_nearest_guess() -> None:
    out = lines(enabled('{"3g.41gb": 1}'))
    assert len(out) == 1 and "fits no GPU" in out[0] and "did you mean 3g.40gb" in out[0]


# -- the spec, whole -----------------------------------------------------------------------------------------


def test_device_filter_forms() -> None:
    assert lines(enabled('{"1g.10gb": 7}', filt='"0x233010DE"')) == []
    assert lines(enabled('{"1g.10gb": 7}', filt='["0x233010DE", "0x20B210DE"]')) == []
    sub = parse(enabled('{"1g.10gb": 7}', filt='"0x233010DE:0x16C110DE"'))
    (entry,) = sub[0].configs["c"]
    assert entry.filters() == [(0x2330, 0x16C110DE)]
    assert applicability.validate(sub, device_id=0x2330).ok
    assert entry.to_dict()["device-filter"] == "0x233010DE:0x16C110DE"


@pytest.mark.parametrize(
    ("filt", "message"),
    [
        ('"0x2330"', "read by mig-parted as vendor 0x2330 and never matches"),
        ("0x233010DE", "must be a quoted string"),
        ('"0x2330ABCD"', "vendor must be 10DE"),
        ('"H100"', "is not of the form 0xDDDD10DE"),
        ("[]", "device-filter is an empty list"),
    ],
)
def test_device_filter_refusals(filt: str, message: str) -> None:
    out = lines(enabled('{"1g.10gb": 7}', filt=filt))
    assert any(message in x for x in out), out


def test_devices_forms() -> None:
    assert lines(enabled('{"1g.10gb": 7}', devices="[0, 1]")) == []
    empty = check(enabled('{"1g.10gb": 7}', devices="[]"))
    assert empty.ok and empty.verdicts[0].reason == "devices: [] selects no GPU"
    assert "devices must be 'all' or a list" in lines(enabled('{"1g.10gb": 7}', devices="some"))[0]
    assert "lists a GPU index twice" in lines(enabled('{"1g.10gb": 7}', devices="[0, 0]"))[0]


def test_disabled_entries_need_no_geometry_and_carry_no_devices() -> None:
    off = one_entry("mig-enabled: false", filt='"0x1FB010DE"')  # DGX Station display GPU, not catalogued
    assert check(off).ok and check(off, device_id=0x1FB0).ok
    assert check(one_entry("mig-enabled: false\n      mig-devices: {}")).ok
    for devs in ('{"1g.10gb": 1}', '{"1g.10gb": 0}'):
        out = lines(one_entry(f"mig-enabled: false\n      mig-devices: {devs}"))
        assert len(out) == 1 and "mig-enabled is false but mig-devices is not empty" in out[0]


def test_all_zero_counts_refused_but_empty_map_is_all_enabled() -> None:
    out = lines(enabled('{"1g.10gb": 0, "2g.20gb": 0}'))
    assert len(out) == 1 and "every mig-devices count is 0" in out[0]
    result = check(enabled("{}"), device_id=0x2330)
    assert result.ok and result.verdicts[0].reason == "MIG on, no instances"


@pytest.mark.parametrize(
    ("filt", "devs"),
    [
        ('"0x233010DE"', '{"1c.3g.40gb": 3}'),
        ('"0x20B010DE"', '{"2c.3g.20gb": 1, "1c.3g.20gb": 1}'),
        ('"0x20B010DE"', '{"1c.7g.40gb": 7}'),
        ('"0x233010DE"', '{"1c.3g.40gb": 6}'),  # two 3g instances
        ('"0x233010DE"', '{"1c.3g.40gb": 3, "4g.40gb": 1}'),
    ],
)
def test_compute_instance_profiles_are_valid(filt: str, devs: str) -> None:
    assert lines(enabled(devs, filt=filt)) == []


def test_compute_instances_that_need_too_many_gpu_instances() -> None:
    out = lines(enabled('{"1c.3g.40gb": 7}', filt='"0x233010DE"'))
    assert len(out) == 1 and "3g.40gb×3" in out[0] and "exceeds the maximum of 2" in out[0]
    out = lines(enabled('{"1c.7g.40gb": 7, "1g.5gb": 1}', filt='"0x20B010DE"'))
    assert len(out) == 1


def test_gpu_without_mig_is_skipped_under_devices_all() -> None:
    text = enabled('{"1g.10gb": 7}', filt='["0x233010DE", "0x27B810DE"]')
    result = check(text)
    assert result.ok
    assert {v.device: v.verdict for v in result.verdicts}["L4"] == SKIPPED
    listed = enabled('{"1g.10gb": 7}', filt='"0x27B810DE"', devices="[0]")
    assert "does not support MIG" in lines(listed)[0]
    assert check(enabled('{"1g.10gb": 7}'), device_id=0x27B8).ok


def test_filter_of_an_uncatalogued_mig_device_is_unknown_naming_the_way_out() -> None:
    result = check(enabled('{"1g.10gb": 7}', filt='"0x999910DE"'))
    (row,) = result.verdicts
    assert result.ok and row.verdict == applicability.UNKNOWN
    assert "not in the geometry catalogue" in row.reason and "--node" in row.reason


def test_structural_errors_are_collected() -> None:
    text = """
version: v2
extra: 1
mig-configs:
  a:
    - devices: [0, 0]
      mig-enabled: yes-please
    - devices: some
      mig-enabled: false
      mig-devices: {"1g.10gb": 1}
      colour: red
    - devices: [0]
      mig-enabled: true
    - devices: all
      device-filter: "0x2330ABCD"
      mig-enabled: true
      mig-devices: {"1g.10gb": -1, "bogus": 1}
    - devices: all
  b: []
"""
    out = "\n".join(lines(text))
    for expected in (
        "unknown field 'extra'",
        "version must be v1",
        "devices lists a GPU index twice",
        "mig-enabled must be true or false",
        "devices must be 'all' or a list",
        "unknown field 'colour'",
        "disabled entries carry no devices",
        "mig-devices is required when mig-enabled is true",
        "vendor must be 10DE",
        "count must be an integer from 0 to 64",
        "'bogus': not a MIG profile name",
        "config a entry 4: mig-enabled is required",
        "config b: must be a non-empty list",
    ):
        assert expected in out, expected


def test_reference_layouts_on_h100() -> None:
    h100 = '"0x233010DE"'
    assert lines(enabled('{"3g.40gb": 1, "1g.10gb": 4}', filt=h100)) == []
    assert lines(enabled('{"4g.40gb": 1, "3g.40gb": 1}', filt=h100)) == []
    (bad,) = lines(enabled('{"3g.40gb": 2, "1g.10gb": 1}', filt=h100))
    assert bad.startswith("t.yaml: config c entry 0 (device 0x2330 H100 SXM5 80GB): ")
    assert "no valid placement" in bad


def test_invalid_everywhere_is_an_error_valid_somewhere_is_not() -> None:
    # 1g.10gb×7 fits the 80GB parts; on A100 40GB (where 1g.10gb is the 2-slice profile) it does not.
    result = check(enabled('{"1g.10gb": 7}'))
    assert result.ok
    assert any(v.verdict == NOT_FOR and v.device == "A100-SXM4-40GB" for v in result.verdicts)
    assert not check(enabled('{"1g.10gb": 7}'), device_id=0x20B0).ok
    # 3g + 3g + 1g fits no GPU that has these names: errors for each.
    assert len(lines(enabled('{"3g.40gb": 2, "1g.10gb": 1}'))) == 2  # A100 80GB and H100 80GB


def test_multi_document_and_config_map() -> None:
    text = (
        (EXAMPLES / "seed-000-custom-mig-config.yaml").read_text()
        + "\n---\n"
        + (
            "version: v1\nmig-configs:\n  all-balanced:\n    - devices: all\n      mig-enabled: true\n"
            '      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}\n'
        )
    )
    docs = parse(text)
    assert [sorted(d.configs) for d in docs] == [["all-disabled", "inference-mix"], ["all-balanced"]]
    assert "document 2" in docs[1].source


def test_yaml_error_inside_config_map_has_the_outer_files_line() -> None:
    text = (EXAMPLES / "seed-000-custom-mig-config.yaml").read_text()
    broken = text.replace('"1g.10gb": 5', '"1g.10gb": [5')
    with pytest.raises(MigPartedError) as err:
        parse(broken)
    msg = str(err.value)
    assert "\n" not in msg
    line_no = int(msg.split(":")[1])
    broken_line = next(i for i, ln in enumerate(broken.splitlines(), 1) if "[5" in ln)
    assert broken_line <= line_no <= broken_line + 2


def test_writer_is_stable_and_round_trips() -> None:
    configs = {
        "zeta": [MigEntry(devices="all", mig_enabled=False)],
        "alpha": [
            MigEntry(
                devices=(0, 1),
                mig_enabled=True,
                mig_devices={"1g.10gb": 4, "3g.40gb": 1},
                device_filter=(0x2330,),
            )
        ],
    }
    text = migparted.dump(configs)
    assert text == migparted.dump(dict(reversed(list(configs.items()))))
    assert text.index("alpha") < text.index("zeta")
    assert text.index("3g.40gb") < text.index("1g.10gb")
    assert "0x233010DE" in text
    (doc,) = parse(text)
    assert doc.configs["alpha"][0] == configs["alpha"][0]
    assert applicability.validate([doc]).ok


def test_entries_for_layouts_group_identical_gpus() -> None:
    entries = migparted.entries_for_layouts(
        [(2, True, {"1g.10gb": 7}), (0, True, {"1g.10gb": 7}), (1, False, {})], device_id=0x2330
    )
    assert [e.devices for e in entries] == [(0, 2), (1,)]
    assert entries[1].to_dict() == {"devices": [1], "device-filter": "0x233010DE", "mig-enabled": False}
    assert H100 is not None
    assert all(applicability.check_entry(H100, e) is None for e in entries)
