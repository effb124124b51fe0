"""``gpupilot-rightsizer validate``: exit codes, one-line errors, summaries, --device-id, --help."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from devkit.clidocs import pointers
from rightsizer.cli import main
from rightsizer.commands import validate

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"


def test_seed_examples_exit_zero_with_summary(capsys: pytest.CaptureFixture[str]) -> None:
    for path in sorted((EXAMPLES / "mig-configs").glob("*.yaml")):
        assert main(["validate", str(path)]) == 0
        out = capsys.readouterr().out
        assert "OK:" in out and "against their device-filter, else every catalogued MIG GPU" in out
        assert out.splitlines()[0].split() == ["CONFIG", "DEVICE", "VERDICT", "REASON"]
    assert (
        main(
            [
                "validate",
                str(EXAMPLES / "mig-configs" / "seed-002-mig-parted-config.yaml"),
                "--device-id",
                "0x2330",
            ]
        )
        == 0
    )
    assert "4 mig-parted config(s), 4 entry(ies) checked against 0x2330 H100 80GB" in capsys.readouterr().out


def test_time_slicing_seed_is_recognised(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(EXAMPLES / "time-slicing" / "seed-002-time-slicing-config.yaml")]) == 0
    assert "1 device-plugin config(s)" in capsys.readouterr().out


def test_bad_time_slicing_rejected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (EXAMPLES / "time-slicing" / "seed-002-time-slicing-config.yaml").read_text()
    bad = tmp_path / "ts.yaml"
    bad.write_text(text.replace("replicas: 4", "replicas: 1"))
    assert main(["validate", str(bad)]) == 1
    assert "sharing.timeSlicing.resources[0].replicas must be an integer >= 2" in capsys.readouterr().err


def test_invalid_layout_exit_one_one_line_each(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "version: v1\nmig-configs:\n  big:\n    - devices: all\n      mig-enabled: true\n"
        '      mig-devices: {"3g.40gb": 2, "1g.10gb": 1}\n'
        "  ok:\n    - devices: all\n      mig-enabled: false\n"
    )
    assert main(["validate", str(path), "--device-id", "0x2330"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == (
        f"{path}: config big entry 0 (device 0x2330 H100 SXM5 80GB): "
        "3g.40gb×2 + 1g.10gb×1 has no valid placement on H100 80GB: needs 9 memory slices of 8"
    )
    assert err[-1] == f"{path}: 1 error(s)"
    # Without --device-id it fits none of the GPUs that have these names: an error for each.
    assert main(["validate", str(path)]) == 1
    out, err2 = capsys.readouterr()
    assert err2.strip().splitlines()[-1] == f"{path}: 2 error(s)"
    assert "big     H100 SXM5 80GB" in out or "INVALID" in out


def test_same_file_checked_for_a100_40gb_fails(capsys: pytest.CaptureFixture[str]) -> None:
    path = EXAMPLES / "mig-configs" / "seed-002-mig-parted-config.yaml"
    assert main(["validate", str(path), "--device-id", "0x20B0"]) == 1
    err = capsys.readouterr().err
    assert (
        "config all-1g.10gb entry 0 (device 0x20b0 A100-SXM4-40GB): 1g.10gb×7 exceeds the maximum of 4" in err
    )


def test_yaml_error_one_line_with_line_number(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("version: v1\nmig-configs:\n  a:\n    - devices: [0\n")
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(f"error: {path}:5: invalid YAML")


def test_missing_file_and_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(tmp_path / "none.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    assert main(["validate", str(empty)]) == 1
    assert "no mig-parted config found" in capsys.readouterr().err


def test_malformed_device_id_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["validate", "x.yaml", "--device-id", "H100"])
    assert exc.value.code == 2
    assert "is not a PCI device id" in capsys.readouterr().err


def test_device_id_outside_the_catalogue_is_checked_not_refused(capsys: pytest.CaptureFixture[str]) -> None:
    path = EXAMPLES / "mig-configs" / "seed-002-mig-parted-config.yaml"
    # A GPU the catalogue does not know: disabled entries pass, MIG entries are not for it.
    assert main(["validate", str(path), "--device-id", "0x999910DE"]) == 0
    out = capsys.readouterr().out
    assert "0x9999 uncatalogued GPU  unknown" in out and "--node NAME" in out


@pytest.mark.slow
def test_console_script_help_mentions_default_device() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "rightsizer", "validate", "--help"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    assert "every catalogued MIG GPU" in text
    for flag in ("--device-id", "--node", "--kubeconfig", "--namespace"):
        assert flag in text


def test_json_and_yaml_output_parse_with_the_documented_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seed = sorted(EXAMPLES.glob("mig-configs/*.yaml"))[0]
    assert main(["validate", str(seed), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["file", "ok", "results", "notes", "errors", "summary"]
    assert list(doc) == pointers.schema_keys(validate.OUTPUT_SCHEMA)  # the reference page's table
    assert doc["ok"] is True and doc["errors"] == [] and ": OK: " in doc["summary"]
    assert doc["results"] and set(doc["results"][0]) == {"config", "device", "verdict", "reason"}
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: v1\nmig-configs:\n  big:\n    - devices: all\n      mig-enabled: true\n"
        '      mig-devices: {"3g.40gb": 2, "1g.10gb": 1}\n'
    )
    assert main(["validate", str(bad), "--device-id", "0x2330", "-o", "yaml"]) == 1  # exit code unchanged
    out, err = capsys.readouterr()
    doc = yaml.safe_load(out)
    assert doc["ok"] is False and len(doc["errors"]) == 1 and "no valid placement" in doc["errors"][0]
    assert doc["errors"][0] in err  # still on stderr too
