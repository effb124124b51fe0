"""The counters file (``-f``/``--collectors``): dcgm-exporter's format, the shipped default set, errors
naming file/line/field, fields this exporter cannot read named once, and the selection on the page."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.commands import cli
from exporter.contract import counters, fields
from exporter.contract.layout import SeriesLayout
from exporter.errors import ConfigError
from exporter.expose.exposition import device_families
from exporter.snapshot import NodeSnapshot
from tests.support.exporter import fakes

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "examples" / "fleet-demo.yaml"

# dcgm-exporter 4.5–4.8 etc/default-counters.csv: its 25 enabled metric lines, with their types
# (shared/reference/dcgm-exporter-compat.md), and the one label line.
UPSTREAM_DEFAULT = {
    "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEMORY_TEMP": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge",
    "DCGM_FI_DEV_ENC_UTIL": "gauge",
    "DCGM_FI_DEV_DEC_UTIL": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_FB_RESERVED": "gauge",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "counter",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "gauge",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gauge",
    "DCGM_FI_PROF_DRAM_ACTIVE": "gauge",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "gauge",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "gauge",
}

UPSTREAM_STYLE = """\
# Format,,
# If line starts with a '#' it is considered a comment,,
# DCGM FIELD, Prometheus metric type, help message

# Clocks,,
DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).
  DCGM_FI_DEV_DEC_UTIL ,     gauge, Decoder utilization (in %).
# DCGM_FI_DEV_POWER_VIOLATION,       counter, Throttling duration due to power constraints (in us).
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, Total energy, since boot (in mJ).
DCGM_FI_DRIVER_VERSION,        label, Driver Version
DCGM_FI_DEV_BRAND,             label, Device Brand
DCGM_FI_DEV_FAN_SPEED,         gauge
"""


def test_shipped_default_equals_dcgm_exporters_default_set() -> None:
    default = counters.default_file()
    metrics = {c.field: c.type for c in default.counters if c.type != "label"}
    assert metrics == UPSTREAM_DEFAULT
    assert [c.field for c in default.counters if c.type == "label"] == ["DCGM_FI_DRIVER_VERSION"]
    # every enabled line is one this exporter reads: nothing named as unreadable at start
    assert counters.select(default).unreadable == ()


def test_gpupilot_default_adds_the_contracts_extras_after_the_file() -> None:
    names = [m.name for m in counters.gpupilot_default().metrics]
    assert names[:25] == list(UPSTREAM_DEFAULT)
    assert names[25:] == list(fields.GPUPILOT_EXTRAS)


def test_upstream_format_comments_whitespace_commas_in_help() -> None:
    parsed = counters.parse(UPSTREAM_STYLE, source="mine.csv")
    assert [(c.field, c.type, c.line) for c in parsed.counters] == [
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", 6),
        ("DCGM_FI_DEV_DEC_UTIL", "gauge", 7),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", 9),
        ("DCGM_FI_DRIVER_VERSION", "label", 10),
        ("DCGM_FI_DEV_BRAND", "label", 11),
        ("DCGM_FI_DEV_FAN_SPEED", "gauge", 12),
    ]
    assert parsed.counters[2].help == "Total energy, since boot (in mJ)."
    sel = counters.select(parsed)
    assert [m.name for m in sel.metrics] == [
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    ]
    assert sel.labels == {"DCGM_FI_DRIVER_VERSION"}
    assert sel.unreadable == ("DCGM_FI_DEV_BRAND", "DCGM_FI_DEV_FAN_SPEED")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("DCGM_FI_DEV_GPU_TMP, gauge, t\n", "f.csv:1: DCGM_FI_DEV_GPU_TMP: unknown DCGM field"),
        (
            "\n# c\nDCGM_FI_DEV_GPU_TEMP, histogram, t\n",
            "f.csv:3: DCGM_FI_DEV_GPU_TEMP: unknown Prometheus type",
        ),
        ("DCGM_FI_DEV_GPU_TEMP\n", "f.csv:1: DCGM_FI_DEV_GPU_TEMP: expected 'DCGM field, type, help'"),
        (
            "DCGM_FI_DEV_GPU_TEMP, gauge, a\nDCGM_FI_DEV_GPU_TEMP, gauge, b\n",
            "f.csv:2: DCGM_FI_DEV_GPU_TEMP: listed twice (first on line 1)",
        ),
    ],
)
def test_bad_lines_are_one_error_naming_file_line_field(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as err:
        counters.parse(text, source="f.csv")
    assert str(err.value).startswith(expected)
    assert "\n" not in str(err.value)


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="counters file not found; check -f/--collectors"):
        counters.load(tmp_path / "missing.csv")
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        counters.load(binary)
    big = tmp_path / "big.csv"
    big.write_bytes(b"#" * (counters.MAX_BYTES + 1))
    with pytest.raises(ConfigError, match="too large for a counters file"):
        counters.load(big)


def test_file_type_and_help_reach_the_page_and_driver_label_follows_the_file() -> None:
    text = "DCGM_FI_DEV_POWER_USAGE, counter, My power help\n"
    layout = SeriesLayout(selection=counters.select(counters.parse(text, source="x")))
    fams = device_families(fakes.node(fakes.whole_gpu(0)), hostname="n", layout=layout)
    assert [(f.name, f.kind, f.help) for f in fams if f.name.startswith("DCGM")] == [
        ("DCGM_FI_DEV_POWER_USAGE", "counter", "My power help")
    ]
    assert "DCGM_FI_DRIVER_VERSION" not in dict(fams[0].samples[0][0])  # no label line in the file


def test_collectors_flag_and_environment_variable(tmp_path: Path) -> None:
    mine = tmp_path / "mine.csv"
    mine.write_text("DCGM_FI_DEV_GPU_TEMP, gauge, t\n")
    by_flag = cli.parse_settings(["-f", str(mine)], environ={})
    by_long = cli.parse_settings(["--collectors", str(mine)], environ={})
    by_env = cli.parse_settings([], environ={"DCGM_EXPORTER_COLLECTORS": str(mine)})
    for s in (by_flag, by_long, by_env):
        assert [m.name for m in s.layout.selection.metrics] == ["DCGM_FI_DEV_GPU_TEMP"]
    other = tmp_path / "other.csv"
    other.write_text("DCGM_FI_DEV_POWER_USAGE, gauge, p\n")
    flag_wins = cli.parse_settings(["-f", str(other)], environ={"DCGM_EXPORTER_COLLECTORS": str(mine)})
    assert [m.name for m in flag_wins.layout.selection.metrics] == ["DCGM_FI_DEV_POWER_USAGE"]


def test_once_with_upstream_file_serves_listed_fields_and_names_the_others_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "counters.csv"
    mine.write_text(UPSTREAM_STYLE + "DCGM_FI_DEV_POWER_VIOLATION, counter, pv\n")
    args = ["--backend", "sim", "--scenario", str(SCENARIO), "--node", "gpu-h100-a", "--once"]
    assert cli.main([*args, "-f", str(mine)]) == 0
    out, err = capsys.readouterr()
    assert err == (
        f"gpupilot-exporter: {mine}: 2 field(s) this exporter cannot read, not published: "
        "DCGM_FI_DEV_BRAND, DCGM_FI_DEV_FAN_SPEED\n"
    )
    fams = {f.name: f for f in text_string_to_metric_families(out)}
    dcgm = {name for name in fams if name.startswith("DCGM_")}
    assert dcgm == {
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_POWER_VIOLATION",
    }
    assert fams["DCGM_FI_DEV_POWER_VIOLATION"].type == "counter"


def test_bad_counters_file_stops_the_exporter_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("# fine\nDCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_NOPE, gauge, x\n")
    assert cli.main(["--backend", "sim", "--scenario", str(SCENARIO), "--once", "-f", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"gpupilot-exporter: {bad}:3: DCGM_FI_DEV_NOPE: unknown DCGM field")
    assert err.count("\n") == 1


def test_names_dcgm_4_6_renamed_publish_the_old_fields_value_under_the_files_name():
    text = (
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS, gauge, GPU temperature (in C).\n"
        "DCGM_FI_DEV_BOARD_POWER_WATTS, gauge, Power draw (in W).\n"
        "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO, gauge, Graphics engine.\n"
        "DCGM_FI_DEV_XID_ERROR, gauge, Last Xid.\n"
        "DCGM_FI_SYSTEM_DRIVER_VERSION, label, Driver version\n"
    )
    sel = counters.select(counters.parse(text, source="4.6.csv"))
    assert sel.unreadable == ()
    assert sel.labels == frozenset({"DCGM_FI_DRIVER_VERSION"})
    snap = NodeSnapshot(taken_at=1.0, gpus=(fakes.whole_gpu(0),))
    fams = device_families(snap, hostname="n", layout=SeriesLayout(selection=sel))
    by_name = {f.name: f for f in fams}
    assert by_name["DCGM_FI_DEV_GPU_TEMP_CELSIUS"].samples[0][1] == fakes.GPU_VALUES["DCGM_FI_DEV_GPU_TEMP"]
    assert by_name["DCGM_FI_DEV_BOARD_POWER_WATTS"].samples[0][1] == 312.5
    assert by_name["DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO"].samples[0][1] == 0.85
    assert "DCGM_FI_DEV_GPU_TEMP" not in by_name and "DCGM_FI_DEV_POWER_USAGE" not in by_name
    labels = dict(by_name["DCGM_FI_DEV_GPU_TEMP_CELSIUS"].samples[0][0])
    assert labels["DCGM_FI_DRIVER_VERSION"] == fakes.DRIVER


def test_a_field_under_both_its_names_is_one_line_too_many():
    text = "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_GPU_TEMP_CELSIUS, gauge, t\n"
    with pytest.raises(
        ConfigError,
        match=r"x\.csv:2: DCGM_FI_DEV_GPU_TEMP_CELSIUS: the same DCGM field as DCGM_FI_DEV_GPU_TEMP on line 1",
    ):
        counters.parse(text, source="x.csv")
