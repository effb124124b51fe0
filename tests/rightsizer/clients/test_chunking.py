"""Fleet-wide queries cut into node groups (rightsizer.clients.chunks): the selectors they scope, the
groups they form under each limit, identical analyses and plans however the fleet is cut, and a real
VictoriaMetrics with a low ``-search.maxUniqueTimeseries`` that refuses the whole-fleet queries but
answers the cut ones."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rightsizer.analysis import history as analysis
from rightsizer.analysis.types import Analysis
from rightsizer.cli import main
from rightsizer.clients.chunks import QueryLimits, matcher, node_groups, scoped
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.report import data as report_data
from tests.support.rightsizer.history import History
from tests.support.rightsizer.small_history import DAYS

# ---------------------------------------------------------------------------------------------- units


def test_scoped_adds_the_node_matcher_to_every_selector() -> None:
    q = (
        'max by (Hostname, gpu) (avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_ID!=""}[1h])) '
        "or max by (Hostname, gpu) (avg_over_time(DCGM_FI_DEV_GPU_UTIL[1h])) / 100 "
        "unless on (Hostname) gpupilot_exporter_process_visibility{} == 0"
    )
    out = scoped(q, ("node-a", "gpu.node-7"))
    m = 'Hostname=~"node-a|gpu\\\\.node-7"'
    assert f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{GPU_I_ID!="", {m}}}' in out
    assert f"DCGM_FI_DEV_GPU_UTIL{{{m}}}" in out
    assert f"gpupilot_exporter_process_visibility{{{m}}}" in out
    assert out.count("Hostname=~") == 3
    # label names and functions are untouched; one node is an exact match; one group: the query as is
    assert "max by (Hostname, gpu)" in out
    assert scoped("gpupilot:slice_activity:avg5m", ("n1",)) == 'gpupilot:slice_activity:avg5m{Hostname="n1"}'
    assert scoped(q, None) == q


def test_groups_respect_series_samples_and_length() -> None:
    devices = {f"node-{i:03d}": 10 for i in range(100)}  # 20 series per node in the worst query
    assert node_groups(devices, limits=QueryLimits(), samples_per_series=1440) == [None]
    by_series = node_groups(devices, limits=QueryLimits(max_series=100), samples_per_series=1)
    assert all(g is not None and len(g) == 5 for g in by_series) and len(by_series) == 20
    by_samples = node_groups(devices, limits=QueryLimits(max_samples=20 * 1440 * 3), samples_per_series=1440)
    assert {len(g or ()) for g in by_samples} == {3, 1}
    # 12,000 bytes less 1,500 for the query itself, over 3 selectors: 3,500 bytes of node names each
    long_names = {f"gpu-node-{i:03d}.rack-{i % 7}.example.internal": 10 for i in range(400)}
    by_length = node_groups(long_names, limits=QueryLimits(max_series=4000), samples_per_series=1)
    assert len(by_length) > 400 * 20 // 4000  # more groups than the series limit alone makes
    assert all(3 * len(matcher(g or ())) <= 12_000 - 1_500 + 3 * 20 for g in by_length)
    assert [n for g in by_length for n in g or ()] == sorted(long_names)
    # every node once, in order
    for groups in (by_series, by_samples):
        assert [n for g in groups for n in g or ()] == sorted(devices)


def test_a_node_over_the_limit_still_gets_its_own_group() -> None:
    groups = node_groups({"big": 1000, "small": 1}, limits=QueryLimits(max_series=10), samples_per_series=1)
    assert groups == [("big",), ("small",)]


# ---------------------------------------------------------------------------------------------- Prometheus


@pytest.mark.prometheus
def test_analysis_is_the_same_however_the_fleet_is_cut(small_history: History) -> None:
    url, end = small_history.url, small_history.end
    settings = analysis.AnalysisSettings(window_s=DAYS * 86400.0)
    with PrometheusClient(url) as client:
        whole = analysis.analyse(client, end=end, settings=settings)
        one_query = client.queries
    tiny = analysis.AnalysisSettings(window_s=DAYS * 86400.0, limits=QueryLimits(max_series=1))
    lines: list[str] = []
    with PrometheusClient(url) as client:
        cut = analysis.analyse(client, end=end, settings=tiny, progress=lines.append)
        assert client.queries > one_query  # one node per group: every statistic asked per node
    assert any("in 5 node groups" in line for line in lines)
    assert any("5/5 node group queries answered" in line for line in lines)
    assert cut == whole
    assert any(d.peak is not None for d in cut.devices)  # not trivially equal: real statistics


def _sizing(result: Analysis) -> list[tuple[object, ...]]:
    """What sizing and idleness read of each device (p50/p95 are per piece, for information)."""
    return [
        (
            d.node,
            d.gpu,
            d.gpu_instance_id,
            d.peak,
            d.peak_at,
            d.idle_hours,
            d.coverage_hours,
            d.max,
            d.fb_peak_mib,
            d.allocated_hours,
        )
        for d in result.devices
    ]


@pytest.mark.prometheus
def test_daily_pieces_fold_to_the_whole_window(small_history: History) -> None:
    """Asked day by day, the folded peaks, their hours and the hour counts equal the whole window's."""
    url, end = small_history.url, small_history.end
    with PrometheusClient(url) as client:
        whole = analysis.analyse(client, end=end, settings=analysis.AnalysisSettings(window_s=DAYS * 86400.0))
    daily = analysis.AnalysisSettings(window_s=DAYS * 86400.0, chunk_s=86400.0)
    lines: list[str] = []
    with PrometheusClient(url) as client:
        cut = analysis.analyse(client, end=end, settings=daily, progress=lines.append)
    assert any(f"(part {DAYS}/{DAYS})" in line for line in lines)
    assert _sizing(cut) == _sizing(whole)
    assert sum(1 for d in whole.devices if d.peak_at is not None) >= 10


@pytest.mark.prometheus
def test_sparse_samples_step_the_means_by_their_interval_with_the_same_answer(
    small_history: History, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The history is sampled every 900 s: its 15-minute means are stepped by 900 s, not 60 s, and
    every peak, peak hour and idle hour is what 60-second steps give."""
    url, end = small_history.url, small_history.end
    settings = analysis.AnalysisSettings(window_s=DAYS * 86400.0)
    lines: list[str] = []
    with PrometheusClient(url) as client:
        sparse = analysis.analyse(client, end=end, settings=settings, progress=lines.append)
    assert any("rolling means every 900 s" in line for line in lines)
    monkeypatch.setattr(analysis, "samples_per_hour", lambda *_a, **_k: 0.0)
    lines.clear()
    with PrometheusClient(url) as client:
        dense = analysis.analyse(client, end=end, settings=settings, progress=lines.append)
    assert any("rolling means every 60 s" in line for line in lines)
    assert _sizing(sparse) == _sizing(dense)
    assert any(d.idle_hours for d in dense.devices) and any(d.peak for d in dense.devices)


def test_subquery_step_divides_the_mean_the_interval_and_the_hour() -> None:
    assert analysis.subquery_step(900) == 60  # interval unknown
    assert analysis.subquery_step(900, 15) == 60  # dense samples: 60 s as ever
    assert analysis.subquery_step(900, 900) == 900
    assert analysis.subquery_step(900, 300) == 300
    assert analysis.subquery_step(900, 600) == 300  # windows change every 300 s
    assert analysis.subquery_step(900, 514.3) == 60  # irregular: no common step beyond 60 s
    assert analysis.subquery_step(420, 420) == 60  # 420 s does not divide the hour
    assert analysis.subquery_step(120, 15) == 40  # a third of a short mean, as before
    assert analysis.subquery_step(120, 900) == 60
    assert analysis.subquery_step(900, float("nan")) == 60


@pytest.mark.prometheus
def test_plan_is_the_same_however_the_fleet_is_cut(small_history: History, tmp_path: Path) -> None:
    url, end = small_history.url, small_history.end
    common = ["plan", "--prometheus-url", url, "--window", f"{DAYS}d", "--at", str(end), "--quiet"]
    assert main([*common, "--out", str(tmp_path / "whole.json")]) == 0
    assert main([*common, "--max-query-series", "1", "--out", str(tmp_path / "cut.json")]) == 0
    assert _plan(tmp_path / "cut.json") == _plan(tmp_path / "whole.json")


def _plan(path: Path) -> dict[str, object]:
    data = json.loads(path.read_text())
    data.pop("created_at")
    data.pop("prometheus_url")  # a restarted server listens on another port
    data["solver"].pop("seconds")
    return data  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------------- VictoriaMetrics


@pytest.mark.slow
def test_victoriametrics_series_limit_refuses_whole_fleet_queries_not_cut_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from devkit import scale_history  # noqa: PLC0415
    from devkit.victoriametrics import VictoriaMetricsServer  # noqa: PLC0415

    now = time.time()
    end = now - now % 3600 - 3600
    data = tmp_path / "vm"
    common = ["--window", "2d", "--at", str(end), "--quiet"]
    with VictoriaMetricsServer(data, log_file=tmp_path / "vm.log") as vm:
        imported = scale_history.import_fleet(vm.url, nodes=12, end=end, days=2.0, step=900.0, seed=3)
        # the whole fleet in one query, on a server with default limits
        assert main(["plan", "--prometheus-url", vm.url, *common, "--out", str(tmp_path / "whole.json")]) == 0
    # above the series of one per-GPU or per-pod query (asked for the whole fleet), below those of
    # one per-device query
    counts = imported.per_metric
    limit = (counts["kube_pod_owner"] + counts["DCGM_FI_DEV_FB_USED"]) // 2
    assert counts["gpupilot_gpu_info"] < counts["kube_pod_owner"] < limit < counts["DCGM_FI_DEV_FB_USED"]
    with VictoriaMetricsServer(
        data, log_file=tmp_path / "vm-limited.log", extra_args=[f"-search.maxUniqueTimeseries={limit}"]
    ) as vm:
        url = ["--prometheus-url", vm.url]
        capsys.readouterr()
        assert main(["plan", *url, *common, "--out", str(tmp_path / "refused.json")]) == 1
        err = capsys.readouterr().err
        assert "refused the query" in err and "Traceback" not in err
        cut = ["--max-query-series", str(limit // 2)]
        assert main(["plan", *url, *common, *cut, "--out", str(tmp_path / "cut.json")]) == 0
        assert _plan(tmp_path / "cut.json") == _plan(tmp_path / "whole.json")
        report = ["report", *url, *common, "--plan", str(tmp_path / "cut.json")]
        assert main([*report, "--out", str(tmp_path / "refused-report")]) == 1
        assert "refused the query" in capsys.readouterr().err
        assert main([*report, *cut, "--out", str(tmp_path / "report")]) == 0
        # the heatmap of a large fleet keeps its least active nodes, read per node group
        with PrometheusClient(vm.url) as client:
            groups = [tuple(f"node-{i:05d}" for i in range(k, k + 3)) for k in range(0, 12, 3)]
            args: dict[str, Any] = {"start": end - 2 * 86400, "end": end}
            whole = report_data.fetch_heatmap(client, **args, groups=[None], rows=100)
            few = report_data.fetch_heatmap(client, **args, groups=list(groups), rows=5)
    # (nodes of A100s only have no activity series: 9 of the 12 have a row)
    assert len(whole.nodes) == whole.nodes_total == few.nodes_total > 5
    assert len(few.nodes) == 5
    rows = dict(zip(whole.nodes, whole.values, strict=True))
    for n, row in zip(few.nodes, few.values, strict=True):  # the same means (to float rounding)
        assert row == pytest.approx(rows[n], rel=1e-9)

    def mean(row: tuple[float | None, ...]) -> float:
        seen = [v for v in row if v is not None]
        return sum(seen) / len(seen)

    means = {n: mean(r) for n, r in zip(whole.nodes, whole.values, strict=True)}
    assert set(few.nodes) == set(sorted(means, key=lambda n: (means[n], n))[:5])
    assert (tmp_path / "report" / "report.html").stat().st_size > 0


@pytest.mark.prometheus
def test_long_report_window_stays_under_the_points_limit(
    small_history: History, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """60 days at the alerts' 5-minute step would be 17,280 points a series: over Prometheus' 11,000."""
    url, end = small_history.url, small_history.end
    common = ["--prometheus-url", url, "--at", str(end), "--quiet"]
    assert main(["plan", *common, "--window", f"{DAYS}d", "--out", str(tmp_path / "plan.json")]) == 0
    report = ["report", *common, "--window", "60d", "--plan", str(tmp_path / "plan.json")]
    assert main([*report, "--out", str(tmp_path / "report")]) == 0, capsys.readouterr().err
    assert "Alerts seen" in (tmp_path / "report" / "report.md").read_text()
