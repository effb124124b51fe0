"""Analysis against a real Prometheus over a small backfilled history with known answers: inventory,
quantiles, idle and covered hours, gaps, a layout change, no-data-is-unknown, workloads, query count,
Prometheus down; and the plan CLI end to end on that history."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from devkit.prometheus import free_port
from rightsizer.analysis import history as analysis
from rightsizer.analysis.types import Analysis, PodKey
from rightsizer.cli import main
from rightsizer.clients.prometheus import PrometheusClient, PrometheusQueryError, PrometheusUnavailable
from rightsizer.plan.model import load_plan
from tests.support.rightsizer.history import History
from tests.support.rightsizer.small_history import DAYS, GAP_HOURS

pytestmark = pytest.mark.prometheus


@pytest.fixture(scope="module")
def result(small_history: History) -> Analysis:
    with PrometheusClient(small_history.url) as client:
        out = analysis.analyse(
            client, end=small_history.end, settings=analysis.AnalysisSettings(window_s=DAYS * 86400.0)
        )
        # The whole window at once × 11 statistics + a rule probe per day (there is no rule) + the
        # sampling-interval probe + inventory (4) + owners (2): the count depends on the window,
        # never on the number of samples.
        assert client.queries == 11 + DAYS + 1 + 4 + 2
    return out


def test_inventory_from_info_series(result: Analysis) -> None:
    nodes = {n.name: n for n in result.nodes}
    assert sorted(nodes) == ["node-a", "node-b", "node-c", "node-d", "node-e"]
    a = nodes["node-a"]
    assert a.mig_strategy == "mixed" and a.mig_config == "all-balanced"
    assert [g.model_key for g in a.gpus] == ["H100 80GB", "H100 80GB"]
    assert a.gpus[0].pci_device_id == 0x2330
    assert sorted(i.profile for i in a.gpus[0].instances) == ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]
    # GPU1 was re-partitioned from 7g to 7×1g a day in: only the current layout is inventory.
    assert [i.profile for i in a.gpus[1].instances] == ["1g.10gb"] * 7
    assert nodes["node-b"].mig_strategy == "single"
    c = nodes["node-c"].gpus[0]
    assert c.model_key == "L4" and not c.mig_enabled


def test_quantiles_peaks_and_hours(result: Analysis) -> None:
    train = result.device("node-a", 0, "5")
    assert train is not None and train.pods == (PodKey("ml", "train-0"),)
    assert train.p50 is not None and 0.80 <= train.p50 <= 0.84
    assert train.p95 is not None and 0.86 <= train.p95 <= 0.885
    assert train.max == pytest.approx(0.88, abs=0.005)
    # The 15-min rolling mean peaks at the sine's crest (06:00 UTC), within one sample step.
    assert train.peak == pytest.approx(0.88, abs=0.005) and train.busy_minutes == 15
    assert train.peak_at is not None and train.peak_at % 3600 == 0
    assert 5 <= (train.peak_at % 86400) / 3600 <= 6
    assert train.fb_peak_mib == 17000
    assert train.coverage_hours == pytest.approx(DAYS * 24, abs=1)
    assert train.idle_hours == 0
    free = result.device("node-a", 0, "13")
    assert free is not None and not free.allocated
    assert free.idle_hours == pytest.approx(DAYS * 24, abs=1)


def test_gap_counts_as_missing_hours_not_idle(result: Analysis) -> None:
    gappy = result.device("node-a", 0, "14")
    assert gappy is not None
    assert gappy.coverage_hours == pytest.approx(DAYS * 24 - GAP_HOURS, abs=1)
    assert gappy.idle_hours == pytest.approx(gappy.coverage_hours, abs=1)


def test_no_data_is_unknown_not_idle(result: Analysis) -> None:
    batch = result.device("node-a", 1, "7")
    assert batch is not None and batch.allocated
    assert batch.unknown and batch.p95 is None and batch.idle_hours == 0 and batch.coverage_hours == 0
    assert any("unknown" in n for n in result.notes)


def test_without_profiling_idle_hours_come_from_processes(result: Analysis) -> None:
    amp = result.device("node-d", 0, "7")
    assert amp is not None and amp.pods == (PodKey("ml", "amp-0"),)
    assert amp.p95 is None and amp.unknown  # activity itself stays unknown
    assert amp.coverage_hours == pytest.approx(DAYS * 24, abs=1)
    # An hour touching the 06:00 sample counts as busy: up to one hour a day off the nominal 12.
    assert amp.idle_hours == pytest.approx(DAYS * 12, abs=DAYS + 1)
    spare = result.device("node-d", 0, "13")
    assert spare is not None and spare.idle_hours == pytest.approx(DAYS * 24, abs=1)
    assert any("idle hours from compute processes" in n for n in result.notes)


def test_process_counts_of_a_blind_exporter_are_unknown_not_idle(result: Analysis) -> None:
    """node-e's exporter cannot see other containers' processes: its zeros mean nothing."""
    blind = result.device("node-e", 0, "7")
    assert blind is not None and blind.allocated and blind.pods == (PodKey("ml", "amp-blind"),)
    assert blind.unknown and blind.idle_hours == 0 and blind.coverage_hours == 0
    spare = result.device("node-e", 0, "13")
    assert spare is not None and spare.idle_hours == 0, "not idle either: nothing is known"


def test_layout_change_keeps_series_apart(result: Analysis) -> None:
    # GI 0 (7g.80gb, 95 % busy) existed only before the change; no current device inherits it.
    assert result.device("node-a", 1, "0") is None
    for gi in ("8", "9", "13"):
        dev = result.device("node-a", 1, gi)
        assert dev is not None and dev.max == 0.0
        assert dev.coverage_hours == pytest.approx((DAYS - 1) * 24, abs=1)


def test_whole_gpu_uses_gpu_util(result: Analysis) -> None:
    l4 = result.device("node-c", 0, "")
    assert l4 is not None and l4.whole_gpu
    assert l4.p95 is not None and 0.11 <= l4.p95 <= 0.131


def test_workloads_by_owner_with_headroom(result: Analysis) -> None:
    by_key = {w.key: w for w in result.workloads}
    infer = by_key["ml/Deployment/infer-a"]
    assert len(infer.pods) == 2
    # Worst replica: p95 ~0.10 of a 3g → 0.30 slices, × 1.2 headroom.
    assert 0.33 <= infer.demand_slices <= 0.37
    assert infer.demand_memory_mib == pytest.approx(6000 * 1.2)
    assert by_key["ml/StatefulSet/train"].demand_slices == pytest.approx(0.88 * 2 * 1.2, abs=0.05)
    unknown = by_key["ml/batch-1"]
    assert unknown.peak is None and unknown.demand_slices == 1  # keeps its size
    assert len(by_key["ml/Deployment/svc-b"].pods) == 3


def test_chunks_cover_window_exactly() -> None:
    parts = analysis.chunks(0, 2.5 * 86400, 86400)
    assert parts == [(0, 0.5 * 86400), (0.5 * 86400, 1.5 * 86400), (1.5 * 86400, 2.5 * 86400)]


def test_prometheus_down_is_one_clear_line() -> None:
    client = PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(PrometheusUnavailable, match=r"cannot reach Prometheus at http://127\.0\.0\.1:"):
        client.instant("up")


def test_bad_query_is_query_error(small_history: History) -> None:
    with PrometheusClient(small_history.url) as client, pytest.raises(PrometheusQueryError) as err:
        client.instant("sum(")
    assert str(err.value) == (
        f'Prometheus at {small_history.url} refused the query (bad_data: invalid parameter "query": '
        "1:5: parse error: unclosed left parenthesis)"
    )


def test_scalar_and_vector_answers(small_history: History) -> None:
    with PrometheusClient(small_history.url) as client:
        [two] = client.instant("1 + 1", small_history.end)
        up = client.instant('count(gpupilot_gpu_info{Hostname="node-c"})', small_history.end)
    assert two.labels == {} and two.value == 2.0 and two.timestamp == pytest.approx(small_history.end)
    assert [s.value for s in up] == [1.0]


def test_generic_range_api(small_history: History) -> None:
    with PrometheusClient(small_history.url) as client:
        series = client.range(
            'gpupilot_gpu_info{Hostname="node-c"}', small_history.end - 3600, small_history.end, 900
        )
    assert len(series) == 1 and len(series[0].points) == 5
    assert series[0].labels["pci_device_id"] == "0x27b8"


def test_plan_cli_end_to_end(
    small_history: History, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.json"
    code = main(
        [
            "plan",
            "--prometheus-url",
            small_history.url,
            "--window",
            f"{DAYS}d",
            "--at",
            str(small_history.end),
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "querying 3 day(s) of history" in captured.err
    plan = load_plan(out)
    node = plan.node("node-a")
    assert node is not None and node.changed
    # batch-1 (unknown) keeps 1g, infer-a shrinks to 1g ×2, train keeps its 2g (its peak fits it;
    # with the 20 % headroom it would need a 3g): one GPU does it.
    assert [dict(g.mig_devices) for g in node.proposed] == [{"2g.20gb": 1, "1g.10gb": 5}, {}]
    assert any("(ml/train-0): keeps its slice: peak" in n and "--grow-for-headroom" in n for n in plan.notes)
    assert [g.mig_enabled for g in node.proposed] == [True, False]
    assert node.gpus_freed == 1
    assert (
        node.config_name.startswith("gpupilot-") and node.config_name in node.config_document["mig-configs"]
    )
    assert {p.name for p in node.pods_disrupted} >= {"train-0", "batch-1"}
    assert plan.node("node-b").changed is False  # type: ignore[union-attr]
    ts = plan.time_slicing
    assert len(ts) == 1 and ts[0].node == "node-c" and ts[0].replicas >= 2
    assert ts[0].config_document["sharing"]["timeSlicing"]["resources"][0]["name"] == "nvidia.com/gpu"
    assert "node-a" in captured.out and "gpupilot-" in captured.out
    data = json.loads(out.read_text())
    assert data["schema"] == "gpupilot.plan/v1" and data["prometheus_url"] == small_history.url
    # The proposed configs are valid mig-parted documents.
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(data["mig_parted_config"]))
    assert main(["validate", str(cfg)]) == 0


def test_plan_cli_prometheus_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "plan",
            "--prometheus-url",
            f"http://127.0.0.1:{free_port()}",
            "--out",
            str(tmp_path / "p.json"),
            "--timeout",
            "2",
        ]
    )
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: cannot reach Prometheus at http://127.0.0.1:")
    assert not (tmp_path / "p.json").exists()


def test_plan_cli_no_inventory(
    small_history: History, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "plan",
            "--prometheus-url",
            small_history.url,
            "--at",
            str(small_history.start - 86400),
            "--out",
            str(tmp_path / "p.json"),
        ]
    )
    assert code == 1
    assert "no gpupilot_gpu_info series" in capsys.readouterr().err


def test_plan_cli_keep_profiles_consolidates(
    small_history: History, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "plan.json"
    args = [
        "plan",
        "--prometheus-url",
        small_history.url,
        "--window",
        f"{DAYS}d",
        "--at",
        str(small_history.end),
    ]
    assert main([*args, "--out", str(out), "--keep-profiles", "--max-nodes", "1"]) == 0
    capsys.readouterr()
    node = load_plan(out).node("node-a")
    assert node is not None and node.changed
    # Every pod keeps its profile: GPU0 keeps all-balanced (its free 1g takes batch-1), GPU1 is freed.
    assert dict(node.proposed[0].mig_devices) == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert node.proposed[1].mig_enabled is False and node.gpus_freed == 1
    # GPU1 switches MIG off: mig-parted's mode step clears and resets every GPU of the node, so the
    # pods on GPU0 go too, although its layout stays (see rightsizer.plan.disruption).
    assert [p.name for p in node.pods_disrupted] == [
        "batch-1",
        "infer-a-5d8f7c9b6-abcde",
        "infer-a-5d8f7c9b6-fghij",
        "train-0",
    ]
    assert node.pods_kept == ()
    batch = node.pods_disrupted[0]
    assert [(t.gpu, t.profile) for t in batch.targets] == [(0, "1g.10gb")]
    plan_notes = load_plan(out).notes
    assert any("node-a: GPU(s) 0, 1 re-created (a GPU switches MIG mode" in n for n in plan_notes)
    assert not any("moves from" in n for n in plan_notes)  # every pod keeps its profile
