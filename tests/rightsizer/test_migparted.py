"""mig-parted configs: parsing (bare, ConfigMap, multi-document), structural errors, geometry checks, writer."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mig_geometry.catalogue import find_model
from rightsizer.migparted import config as migparted
from rightsizer.migparted.config import MigEntry, MigPartedError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "mig-configs"
H100 = find_model("H100 80GB")


def parse(text: str) -> list[migparted.MigPartedConfig]:
    return migparted.load_text(text, source="t.yaml")


def lines(text: str, **kw) -> list[str]:
    return [i.line() for i in migparted.validate(parse(text), **kw).issues]


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_seed_configs_are_valid_for_h100(path: Path) -> None:
    docs = migparted.load_file(path)
    result = migparted.validate(docs, device_id=0x2330)
    assert result.ok, [i.line() for i in result.issues]
    assert result.entries_checked >= 3


def test_seed_configs_contain_the_seeds_names() -> None:
    names = set()
    for path in EXAMPLES.glob("*.yaml"):
        for doc in migparted.load_file(path):
            names |= set(doc.configs)
    assert {"inference-mix", "all-1g.10gb", "all-2g.20gb", "mixed-inference", "all-disabled"} <= names


def test_two_3g_and_a_1g_rejected_with_reason() -> None:
    text = """
version: v1
mig-configs:
  too-much:
    - devices: all
      mig-enabled: true
      mig-devices: {"3g.40gb": 2, "1g.10gb": 1}
"""
    out = lines(text)
    assert len(out) == 1
    assert out[0].startswith("t.yaml: config too-much entry 0 (device 0x2330 H100 80GB): ")
    assert "no valid placement" in out[0]


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
      mig-devices: {"1g.10gb": -1}
  b: []
"""
    out = "\n".join(lines(text))
    assert "unknown field 'extra'" in out
    assert "version must be v1" in out
    assert "devices lists a GPU index twice" in out
    assert "mig-enabled must be true or false" in out
    assert "devices must be 'all' or a non-empty list" in out
    assert "unknown field 'colour'" in out
    assert "disabled entries carry no devices" in out
    assert "mig-devices is required when mig-enabled is true" in out
    assert "vendor must be 10DE" in out
    assert "count must be an integer >= 0" in out
    assert "config b: must be a non-empty list" in out


def test_device_filter_selects_models() -> None:
    text = """
version: v1
mig-configs:
  per-model:
    - devices: all
      device-filter: ["0x20B010DE", "0x20B110DE"]
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
    - devices: all
      device-filter: "0x233010DE"
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
"""
    assert lines(text) == []
    # Forcing A100 40GB skips the H100 entry, and checks the A100 one.
    result = migparted.validate(parse(text), device_id=0x20B0)
    assert result.ok and result.entries_skipped == 1 and result.entries_checked == 1
    # A 1g.5gb entry on H100 is unknown.
    bad = text.replace('"1g.10gb": 7', '"1g.5gb": 1')
    assert any("profile 1g.5gb does not exist on H100 80GB" in x for x in lines(bad))


def test_counts_above_max_rejected() -> None:
    text = 'version: v1\nmig-configs:\n  x:\n    - {devices: all, mig-enabled: true, mig-devices: {"7g.80gb": 2}}\n'
    assert "exceeds the maximum of 1" in lines(text)[0]


def test_driver_spelling_is_accepted_on_a100_80gb() -> None:
    text = (
        'version: v1\nmig-configs:\n  x:\n    - {devices: all, device-filter: "0x20B210DE", '
        'mig-enabled: true, mig-devices: {"3g.39gb": 1, "4g.40gb": 1}}\n'
    )
    assert lines(text) == []


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


def test_yaml_error_inside_config_map_has_file_line() -> None:
    text = (EXAMPLES / "seed-000-custom-mig-config.yaml").read_text()
    broken = text.replace('"1g.10gb": 5', '"1g.10gb": [5')
    with pytest.raises(MigPartedError) as err:
        parse(broken)
    msg = str(err.value)
    assert "\n" not in msg
    line_no = int(msg.split(":")[1])
    # The error points at (or right after) the broken line of the outer file.
    broken_line = next(i for i, ln in enumerate(broken.splitlines(), 1) if "[5" in ln)
    assert broken_line <= line_no <= broken_line + 2


def test_no_config_is_an_error() -> None:
    with pytest.raises(MigPartedError, match="no mig-parted config"):
        parse("# nothing here\n")
    out = lines("apiVersion: v1\nkind: Pod\n")
    assert "t.yaml: unknown field 'apiVersion'" in out[0]
    assert any("mig-configs must be a non-empty mapping" in x for x in out)


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
    assert migparted.validate([doc]).ok
    cm = migparted.config_map(name="gpupilot", namespace="gpu-operator", configs=configs)
    assert yaml.safe_load(cm["data"]["config.yaml"]) == migparted.document(configs)


def test_entries_for_layouts_group_identical_gpus() -> None:
    entries = migparted.entries_for_layouts(
        [(2, True, {"1g.10gb": 7}), (0, True, {"1g.10gb": 7}), (1, False, {})], device_id=0x2330
    )
    assert [e.devices for e in entries] == [(0, 2), (1,)]
    assert entries[1].to_dict() == {"devices": [1], "device-filter": "0x233010DE", "mig-enabled": False}
    assert H100 is not None
    assert all(migparted.check_entry(H100, e) is None for e in entries)
