"""devkit.victoriametrics on a real single-node VictoriaMetrics: both import paths put the same
samples in, force_flush makes them searchable at once, latencyOffset is handled, errors are one line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from devkit import victoriametrics as vmkit
from devkit.history import build_history
from simulator import scenario as scenario_mod
from tests.support.promquery import instant

REPO = Path(__file__).resolve().parents[2]
SCENARIO = REPO / "tests" / "data" / "fleet-small.yaml"
STEP = 60.0


def _window() -> tuple[float, float]:
    now = time.time()
    end = now - now % STEP
    return end - 3 * 3600, end


@pytest.mark.slow
def test_import_api_and_vmctl_give_the_same_samples(tmp_path: Path) -> None:
    start, end = _window()
    scen = scenario_mod.load(SCENARIO)
    history = build_history(
        SCENARIO, start=start, end=end, step=STEP, out_dir=tmp_path / "blocks", progress=None
    )
    counts = []
    with vmkit.VictoriaMetricsServer(tmp_path / "a" / "data") as vm:
        stats = vmkit.import_history(vm, scen, start=start, end=end, step=STEP)
        counts.append(instant(vm.url, "sum(count_over_time({__name__!=''}[4h]))", time=end)[0]["value"][1])
        series_a = {r["metric"]["Hostname"] for r in instant(vm.url, "DCGM_FI_DEV_GPU_TEMP", time=end)}
        temp_a = instant(vm.url, 'sum(DCGM_FI_DEV_GPU_TEMP{Hostname="sim-a100"})', time=end - 600)
    with vmkit.VictoriaMetricsServer(tmp_path / "b" / "data") as vm:
        vmkit.vmctl_import(vm, tmp_path / "blocks")
        counts.append(instant(vm.url, "sum(count_over_time({__name__!=''}[4h]))", time=end)[0]["value"][1])
        temp_b = instant(vm.url, 'sum(DCGM_FI_DEV_GPU_TEMP{Hostname="sim-a100"})', time=end - 600)
    assert stats.samples == history.samples
    assert (stats.samples, float(counts[0])) == (history.samples, history.samples), counts
    # vmctl 1.79's prometheus mode drops leading samples of some series (docs/victoriametrics.md):
    # 0 to 4 of 67,875 in most runs, 840 (1.24 %) in one; the import API loses none (above)
    assert 0.98 * history.samples <= float(counts[1]) <= history.samples
    assert series_a == {"sim-h100-a", "sim-h100-b", "sim-a100", "sim-h200"}
    assert temp_a and temp_a[0]["value"][1] == temp_b[0]["value"][1]


def test_latency_offset_hides_fresh_samples_unless_lowered(tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    body = f'gpupilot_probe{{k="v"}} 1 {now_ms - 2000}\ngpupilot_old 1 {now_ms - 60_000}\n'.encode()
    with vmkit.VictoriaMetricsServer(tmp_path / "default" / "data", latency_offset="30s") as vm:
        vm.import_prometheus(body)
        vm.force_flush()
        assert instant(vm.url, "gpupilot_probe") == []
        assert len(instant(vm.url, "gpupilot_old")) == 1
    with vmkit.VictoriaMetricsServer(tmp_path / "low" / "data") as vm:
        vm.import_prometheus(body)
        vm.force_flush()
        assert [r["metric"] for r in instant(vm.url, "gpupilot_probe")] == [
            {"__name__": "gpupilot_probe", "k": "v"}
        ]


def test_a_refused_import_is_one_line(tmp_path: Path) -> None:
    with (
        vmkit.VictoriaMetricsServer(tmp_path / "data") as vm,
        pytest.raises(vmkit.VictoriaMetricsError, match="refused an import") as err,
    ):
        vm.import_prometheus(b"x" * 40_000_000)
    assert "\n" not in str(err.value)


def test_vmctl_on_a_missing_snapshot_is_one_line(tmp_path: Path) -> None:
    with (
        vmkit.VictoriaMetricsServer(tmp_path / "data") as vm,
        pytest.raises(vmkit.VictoriaMetricsError, match=r"vmctl prometheus .* failed") as err,
    ):
        vmkit.vmctl_import(vm, tmp_path / "no-such-dir")
    assert "\n" not in str(err.value)


def test_a_server_that_cannot_start_names_its_log(tmp_path: Path) -> None:
    bad = vmkit.VictoriaMetricsServer(tmp_path / "data", extra_args=["-search.latencyOffset=soon"])
    with pytest.raises(vmkit.VictoriaMetricsError, match=r"victoria-metrics exited with \d+; see .*\.log"):
        bad.start(timeout=20)


def test_missing_binary_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(vmkit.VictoriaMetricsError, match="make victoriametrics"):
        vmkit.require_binary("vmalert", vmkit.DEBIAN)
