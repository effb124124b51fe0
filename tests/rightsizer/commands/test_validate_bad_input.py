"""Bad input to ``validate``: one line naming the file (and line), never a traceback, on any input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rightsizer.cli import main
from rightsizer.migparted import applicability, manifest, timeslicing
from rightsizer.migparted.config import MigPartedError


def run(
    tmp_path: Path, text: str | bytes, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str, str]:
    path = tmp_path / "in.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    code = main(["validate", str(path), *extra])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_config_map_whose_metadata_is_a_string(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: just-a-string\ndata:\n  config.yaml: |\n"
        "    version: v1\n    mig-configs:\n      disabled:\n        - devices: all\n          mig-enabled: false\n"
    )
    code, out, err = run(tmp_path, text, capsys)
    assert code == 1 and out == ""
    assert err == (
        f"error: {tmp_path / 'in.yaml'}:3: ConfigMap metadata must be a mapping (name, namespace, labels), "
        "got str; fix the manifest\n"
    )


def test_time_slicing_config_map_whose_metadata_is_a_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: [a, b]\ndata:\n  any: |\n    version: v1\n"
        "    sharing:\n      timeSlicing:\n        resources:\n          - name: nvidia.com/gpu\n            replicas: 4\n"
    )
    code, out, err = run(tmp_path, text, capsys)
    assert code == 1 and out == ""
    assert err.endswith(
        ":3: ConfigMap metadata must be a mapping (name, namespace, labels), got list; fix the manifest\n"
    )
    assert len(err.splitlines()) == 1


def test_deeply_nested_yaml_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(tmp_path, "a: " + "[" * 3000 + "]" * 3000 + "\n", capsys)
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'in.yaml'}:1: invalid YAML: nesting deeper than")


def test_yaml_error_inside_a_config_map_names_the_outer_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (
        "# comment\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\ndata:\n  config.yaml: |\n"
        "    version: v1\n    mig-configs:\n      x:\n        - devices: [0\n"
    )
    code, _, err = run(tmp_path, text, capsys)
    assert code == 1
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: {tmp_path / 'in.yaml'}:12: invalid YAML")


def test_binary_file_cannot_be_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(tmp_path, b"\xff\xfe\x00garbage", capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cannot read" in err


def test_huge_count_is_refused_at_parse_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = 'version: v1\nmig-configs:\n  x:\n    - {devices: all, mig-enabled: true, mig-devices: {"1c.7g.80gb": 1000000000}}\n'
    code, _, err = run(tmp_path, text, capsys)
    assert code == 1 and "count must be an integer from 0 to 64" in err


# -- property: generated junk never escapes as anything but one-line MigPartedError / Issues ----------------

_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(
        ["all", "v1", "1g.10gb", "1c.3g.40gb", "0x233010DE", "0x2330", "ConfigMap", "mig-configs"]
    ),
)
_keys = st.one_of(
    st.text(max_size=8),
    st.sampled_from(
        [
            "version",
            "mig-configs",
            "devices",
            "device-filter",
            "mig-enabled",
            "mig-devices",
            "kind",
            "apiVersion",
            "metadata",
            "data",
            "config.yaml",
            "sharing",
            "flags",
            "timeSlicing",
            "resources",
            "replicas",
            "name",
        ]
    ),
)
_tree = st.recursive(
    _scalar,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(_keys, children, max_size=5)),
    max_leaves=30,
)


def _embed(tree: Any) -> Any:
    """Sometimes wrap the junk as a ConfigMap carrying it as YAML text, as NVIDIA's files do."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": tree if not isinstance(tree, dict) else {"name": "x"},
        "data": {
            "config.yaml": "mig-configs: " + yaml.safe_dump(tree),
            "any": "sharing: " + yaml.safe_dump(tree),
        },
    }


def _exercise(text: str) -> None:
    try:
        found = manifest.load_manifest(text, source="junk.yaml")
    except MigPartedError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("junk.yaml")
        return
    for device_id in (None, 0x2330, 0x20B7):
        result = applicability.validate(found.mig, device_id=device_id)
        for issue in result.issues:
            assert "\n" not in issue.line()
        applicability.summarise(result.verdicts)
    for cfg in found.sharing:
        for line in timeslicing.check(cfg):
            assert "\n" not in line


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tree, st.booleans())
def test_loader_survives_generated_documents(tree: Any, wrap: bool) -> None:
    _exercise(yaml.safe_dump(_embed(tree) if wrap else tree))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab:-[]{}'\"|>\n #&*!0x1g.10gb\t,?%@`")), max_size=200))
def test_loader_survives_generated_text(text: str) -> None:
    _exercise(text)


def test_config_maps_of_other_kinds_are_noted_not_parsed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script that merely mentions 'sharing' is not a sharing config; the MIG config beside it is found."""
    text = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: scripts}\ndata:\n"
        "  run.sh: |\n    echo 'time sharing: [unbalanced'\n"
        "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: mig}\ndata:\n  config.yaml: |\n"
        "    version: v1\n    mig-configs:\n      all-disabled:\n        - devices: all\n          mig-enabled: false\n"
    )
    code, out, _ = run(tmp_path, text, capsys)
    assert code == 0
    assert "document 1 (ConfigMap scripts): no mig-parted or sharing config under data; skipped" in out


def test_oversized_file_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(tmp_path, "# x\n" * 300_000, capsys)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert "is too large for a config file (limit 1048576)" in line


@pytest.mark.parametrize("name", ["\n", "a\nb", "x" * 5000])
def test_config_names_that_cannot_be_printed_are_quoted_and_cut(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config key holding a newline (found by the property test) or a huge key keeps every
    message and table row on one short line."""
    for mig_enabled in ("true", "'maybe'"):
        doc: dict[str, Any] = {
            "version": "v1",
            "mig-configs": {name: [{"devices": "all", "mig-enabled": mig_enabled == "true"}]},
        }
        if mig_enabled != "true":
            doc["mig-configs"][name][0]["mig-enabled"] = "maybe"
        else:
            doc["mig-configs"][name][0]["mig-devices"] = {"1g.10gb": 2}
        code, out, err = run(tmp_path, yaml.safe_dump(doc), capsys)
        assert code == (0 if mig_enabled == "true" else 1)
        lines = (out + err).splitlines()
        assert all(line.strip() for line in lines), lines
        assert max(map(len, lines)) < 400
