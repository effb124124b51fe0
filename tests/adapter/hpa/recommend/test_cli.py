"""recommend-hpa end to end: three days of the simulator's inference service backfilled into a real
Prometheus, the example HPA recommended on, and each bad input answered with one line and exit 2
(or 1 when no configuration meets the bound)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapter.cli import main
from devkit.prometheus import PrometheusServer
from rightsizer.report import hpas
from simulator import backfill, scenario
from simulator.backfill import BackfillSettings

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[4]
HPA = REPO / "examples" / "hpa-chat-inference.yaml"
WEEK = REPO / "examples" / "inference-week.yaml"
START, END = 1796083200.0, 1796342400.0  # 2026-12-01T00:00Z .. 2026-12-04T00:00Z (Tuesday to Friday)
BOUND = 'inference_queue_wait_seconds{quantile="0.95"} <= 2'


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("recommend")
    backfill.run(
        scenario.load(WEEK),
        BackfillSettings(start=START, end=END, step=60.0, out_dir=root / "data"),
        progress=None,
    )
    with PrometheusServer(root / "data") as server:
        yield server.url


def _run(prom_url: str, *extra: str) -> list[str]:
    return [
        "recommend-hpa",
        "-f",
        str(HPA),
        "--prometheus-url",
        prom_url,
        "--bound",
        BOUND,
        "--bound-budget",
        "2%",
        "--since",
        "3d",
        "--held-out",
        "1d",
        "--until",
        "2026-12-04T00:00:00Z",
        "--step",
        "60s",
        *extra,
    ]


def test_recommends_a_cheaper_configuration_checked_on_the_held_out_day(
    prom_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(_run(prom_url, "-o", "json")) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["held_out_days"] == ["2026-12-03"]
    assert doc["model"]["capacity_per_replica"] == pytest.approx(10.0, rel=0.1)
    assert doc["model"]["startup_seconds"] == pytest.approx(120.0, abs=60.0)
    kinds = {c["name"]: c["model"] for c in doc["model"]["curves"]}
    assert kinds["inference_queue_depth"] == "curve"
    assert abs(doc["replay_error"]["replica_hours_percent"]) < 10 and doc["replay_error"]["trusted"]
    rec, cur = doc["recommended"], doc["current"]
    assert rec["held_out"]["bound_held"]
    assert rec["held_out"]["replica_hours"] < cur["held_out"]["replica_hours"]
    assert rec["saving_percent"] > 0
    hpa = rec["hpa"]
    assert (
        hpa["kind"] == "HorizontalPodAutoscaler"
        and hpa["spec"]["minReplicas"] == rec["configuration"]["minReplicas"]
    )
    assert {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]} <= {
        "inference_queue_depth",
        "inference_kv_cache_usage_ratio",
    }
    assert doc["candidates"] >= 100
    # the weekly report reads this answer as it is (rightsizer report --hpa-recommendation)
    saved = tmp_path / "recommend.json"
    saved.write_text(json.dumps(doc))
    line = hpas.read(saved)
    assert line.saving_percent == rec["saving_percent"] and line.hpa == "ai-serving/chat-inference-hpa"


def test_the_table_shows_current_beside_recommended(
    prom_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_run(prom_url, "--may-change", "targets", "--jobs", "1")) == 0
    out = capsys.readouterr().out
    assert "current (replayed)" in out and "recommended" in out and "held-out GPU-hours" in out
    assert "model error, training days" in out and "apiVersion: autoscaling/v2" in out
    # only the targets may change: the HPA's own behaviour is kept
    assert "stabilizationWindowSeconds: 900" in out


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (
            ["--bound", "nonexistent_wait_seconds <= 2"],
            2,
            "--bound nonexistent_wait_seconds: Prometheus has no such series for the pods of ai-serving/chat-inference",
        ),
        (["--served-requests", "nope_total"], 2, "--served-requests nope_total: Prometheus has no series"),
        (["--since", "1d"], 2, "--since 1d is not longer than --held-out 1d"),
        (["--held-out", "36h"], 2, "--held-out 36h: must be whole days"),
        (["--may-change", "colour"], 2, "--may-change 'colour': expected a comma-separated list"),
        (
            ["--bound", 'inference_queue_wait_seconds{quantile="0.95"} <= 0.001', "--bound-budget", "0%"],
            1,
            "no configuration keeps inference_queue_wait_seconds",
        ),
    ],
)
def test_bad_input_is_one_line(
    prom_url: str, capsys: pytest.CaptureFixture[str], extra: list[str], code: int, message: str
) -> None:
    assert main([*_run(prom_url), *extra]) == code
    err = capsys.readouterr().err.strip().splitlines()
    last = err[-1]
    assert message in last, err


def test_an_hpa_whose_metrics_ignore_replicas_is_one_line(
    prom_url: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    external = HPA.read_text().replace(
        """    - type: Pods
      pods:
        metric:
          name: inference_queue_depth
        target:
          type: AverageValue
          averageValue: "3"
    - type: Pods
      pods:
        metric:
          name: inference_kv_cache_usage_ratio
        target:
          type: AverageValue
          averageValue: 700m
""",
        """    - type: External
      external:
        metric:
          name: inference_queue_depth_total
        target:
          type: AverageValue
          averageValue: "3"
""",
    )
    path = tmp_path / "hpa.yaml"
    path.write_text(external)
    args = _run(prom_url)
    args[args.index(str(HPA))] = str(path)
    assert main(args) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "every metric of the HPA is Object or External: none responds to the replica count" in last
