"""dcgm-exporter's own series (DCGM_EXP_XID_ERRORS_COUNT, _CLOCK_EVENTS_COUNT, _GPU_HEALTH_STATUS), the Xid
table and labels, the host label, and the simulator's values for the opt-in fields."""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

import pytest

from exporter.commands import cli
from exporter.contract import counters, xid_catalogue
from exporter.contract.layout import SeriesLayout
from exporter.expose import health
from exporter.expose import windows as windows_mod
from exporter.expose.exposition import Family, device_families
from exporter.expose.windows import EventWindows
from exporter.snapshot import GpuSnapshot, PodRef
from simulator import scenario as scenario_mod
from simulator.backend import SimBackend
from tests.support.exporter import fakes

ROOT = Path(__file__).resolve().parents[3]
T0 = 1767225600.0

EXP_CSV = """\
DCGM_FI_DEV_XID_ERRORS, gauge, last xid
DCGM_EXP_XID_ERRORS_COUNT, gauge, xid count
DCGM_EXP_CLOCK_EVENTS_COUNT, gauge, clock events
DCGM_EXP_GPU_HEALTH_STATUS, gauge, health
"""
EXP_LAYOUT = SeriesLayout(
    selection=counters.select(counters.parse(EXP_CSV, source="exp.csv")),
    xid_window_s=60.0,
    clock_events_window_s=30.0,
)


def gpu_at(xid: dict[int, int], reasons: int | None = None, **values: float) -> GpuSnapshot:
    base = fakes.whole_gpu(0)
    merged = {**base.values, **values}
    if reasons is not None:
        merged["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] = float(reasons)
    return GpuSnapshot(info=base.info, values=MappingProxyType(merged), xid_counts=MappingProxyType(xid))


def fam(fams: list[Family], name: str) -> Family:
    (found,) = [f for f in fams if f.name == name]
    return found


def samples(f: Family) -> list[tuple[dict[str, str], float]]:
    return [(dict(labels), value) for labels, value in f.samples]


def test_xid_count_is_the_number_of_events_inside_the_window() -> None:
    windows = EventWindows(xid_window_s=60.0, clock_events_window_s=30.0)
    counts = [{}, {31: 1}, {31: 3}, {31: 3, 79: 1}, {31: 3, 79: 1}]
    results = []
    for i, xid in enumerate(counts):  # one collection every 20 s
        snap = fakes.node(gpu_at(xid), taken_at=T0 + 20 * i)
        results.append(dict(windows.update(snap)[fakes.gpu_info(0).uuid].xid))
    assert results[3] == {31: 3, 79: 1}  # started 60 s ago: everything so far is in the window
    assert results[4] == {31: 2, 79: 1}  # the event seen at t=20 has left the 60 s window


def test_clock_events_count_collections_per_reason_in_the_window() -> None:
    windows = EventWindows(xid_window_s=60.0, clock_events_window_s=30.0)
    for i, mask in enumerate([0x4, 0x4 | 0x1, 0x1, 0x1]):  # every 10 s
        got = windows.update(fakes.node(gpu_at({}, mask), taken_at=T0 + 10 * i))
    assert dict(got[fakes.gpu_info(0).uuid].clock_events) == {"gpu_idle": 3, "power_cap": 1}


def test_windows_stay_bounded_when_the_clock_stands_still() -> None:
    windows = EventWindows(xid_window_s=60.0, clock_events_window_s=30.0, max_entries=50)
    snap = fakes.node(gpu_at({}, 0x1), taken_at=T0)
    for _ in range(200):
        got = windows.update(snap)
    assert dict(got[fakes.gpu_info(0).uuid].clock_events) == {"gpu_idle": 50}


def test_exp_families_have_dcgm_exporters_labels() -> None:
    windows = EventWindows(xid_window_s=60.0, clock_events_window_s=30.0)
    snap = fakes.node(fakes.with_xid(gpu_at({}, 0x4), 48, count=2))
    fams = device_families(snap, hostname="n", layout=EXP_LAYOUT, windows=windows.update(snap))
    xid = samples(fam(fams, "DCGM_EXP_XID_ERRORS_COUNT"))
    assert [(s["window_size_in_ms"], s["xid"], v) for s, v in xid] == [("60000", "48", 2.0)]
    clock = samples(fam(fams, "DCGM_EXP_CLOCK_EVENTS_COUNT"))
    assert [(s["window_size_in_ms"], s["clock_event"], v) for s, v in clock] == [("30000", "power_cap", 1.0)]
    healthy = samples(fam(fams, "DCGM_EXP_GPU_HEALTH_STATUS"))
    assert [s["health_watch"] for s, _ in healthy] == list(health.WATCHES)
    assert all(v == 0.0 and s["health_error_code"] == "DCGM_FR_OK" for s, v in healthy)


def test_no_events_gives_one_zero_series_as_upstream() -> None:
    windows = EventWindows(xid_window_s=60.0, clock_events_window_s=30.0)
    snap = fakes.node(gpu_at({}, 0))
    fams = device_families(snap, hostname="n", layout=EXP_LAYOUT, windows=windows.update(snap))
    (only,) = samples(fam(fams, "DCGM_EXP_XID_ERRORS_COUNT"))
    assert "xid" not in only[0] and only[1] == 0.0
    ((labels, value),) = samples(fam(fams, "DCGM_FI_DEV_XID_ERRORS"))  # no Xid seen: 0, as upstream
    assert value == 0.0 and labels["err_code"] == "0" and "err_msg" not in labels


def test_health_fails_memory_on_double_bit_errors_and_warns_on_thermal_throttling() -> None:
    result = {
        w: (r, c)
        for w, r, c in health.status(
            {
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 1.0,
                "DCGM_FI_DEV_POWER_USAGE": 1.0,
                "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0x40,
            }
        )
    }
    assert result["MEM"] == (health.FAIL, "DCGM_FR_VOLATILE_DBE_DETECTED")
    assert result["THERMAL"] == (health.WARN, "DCGM_FR_CLOCK_THROTTLE_THERMAL")
    assert result["POWER"] == (health.PASS, "DCGM_FR_OK")
    assert dict((w, r) for w, r, _ in health.status({}))["POWER"] == health.WARN  # unreadable power


def test_xid_catalogue_covers_every_published_code_and_labels_follow_pods() -> None:
    assert sorted(xid_catalogue.MESSAGES) == list(range(173))
    assert xid_catalogue.message(13) == "Graphics Engine Exception"
    assert xid_catalogue.message(31) == "GPU memory page fault"
    assert xid_catalogue.message(48) == "Double Bit ECC Error"
    assert xid_catalogue.message(94) == "Contained ECC error"
    assert xid_catalogue.message(119) == "GSP RPC Timeout"
    assert xid_catalogue.message(154) == "GPU Recovery Action Changed"
    assert xid_catalogue.message(172) == "Uncorrectable SRAM Error"
    assert xid_catalogue.message(9999) == "Unknown Xid"
    snap = fakes.node(fakes.with_xid(fakes.whole_gpu(0), 119))
    pod = PodRef("ai", "llm-0", "server")
    fams = device_families(snap, hostname="n", allocations={fakes.gpu_info(0).uuid: (pod,)})
    ((labels, value),) = samples(fam(fams, "DCGM_FI_DEV_XID_ERRORS"))
    assert value == 119.0
    assert (labels["err_code"], labels["err_msg"], labels["pod"]) == ("119", "GSP RPC Timeout", "llm-0")


@pytest.mark.parametrize(
    ("flag", "label"), [("Hostname", "Hostname"), ("hostname", "hostname"), ("none", None)]
)
def test_hostname_label_flag(flag: str, label: str | None) -> None:
    layout = cli.parse_settings(["--hostname-label", flag], environ={}).layout
    fams = device_families(
        fakes.node(fakes.whole_gpu(0), lost=(fakes.lost(1),)), hostname="node-a", layout=layout
    )
    for f in fams:
        for labels, _ in f.samples:
            names = dict(labels)
            hosts = {k for k in names if k.lower() == "hostname"}
            assert hosts == ({label} if label else set()), f.name
            if label:
                assert names[label] == "node-a"


def test_window_flags_are_checked() -> None:
    with pytest.raises(Exception, match="--xid-count-window-size 5: must be between 1000 and 86400000"):
        cli.parse_settings(["--xid-count-window-size", "5"], environ={})
    too_many = [
        "--interval",
        "1",
        "--clock-events-count-window-size",
        str((windows_mod.MAX_ENTRIES + 1) * 1000),
    ]
    with pytest.raises(Exception, match="holds more than 4096 collections at --interval 1"):
        cli.parse_settings(too_many, environ={})
    layout = cli.parse_settings(["--clock-events-count-window-size", "60000"], environ={}).layout
    assert layout.clock_events_window_s == 60.0


def test_simulator_gives_plausible_opt_in_values() -> None:
    demo = scenario_mod.load(ROOT / "examples" / "fleet-demo.yaml")
    backend = SimBackend(demo, node="gpu-h100-a")
    day = demo.epoch + 300 * 86400
    busy = backend.snapshot_at(day + 15 * 3600).gpus[0].values  # llm-inference at its peak
    later = backend.snapshot_at(day + 16 * 3600).gpus[0].values
    free = SimBackend(demo, node="gpu-a100-b").snapshot_at(day + 15 * 3600).gpus[1].values  # no pod
    assert later["DCGM_FI_DEV_POWER_VIOLATION"] >= busy["DCGM_FI_DEV_POWER_VIOLATION"] > 0
    assert later["DCGM_FI_DEV_LOW_UTIL_VIOLATION"] >= busy["DCGM_FI_DEV_LOW_UTIL_VIOLATION"]
    assert busy["DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"] >= busy["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"]
    assert busy["DCGM_FI_PROF_PIPE_FP64_ACTIVE"] < busy["DCGM_FI_PROF_PIPE_FP32_ACTIVE"] <= 1.0
    assert 0 < busy["DCGM_FI_DEV_NVLINK_BANDWIDTH_L0"] < busy["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"]
    assert int(busy["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]) & 0x1 == 0  # a busy GPU is not idle
    assert int(free["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]) & 0x1 == 0x1  # an unused GPU idles
    assert free["DCGM_FI_DEV_POWER_VIOLATION"] == 0 < free["DCGM_FI_DEV_LOW_UTIL_VIOLATION"]
    assert "DCGM_FI_DEV_VGPU_LICENSE_STATUS" not in busy  # no vGPU in the simulator
