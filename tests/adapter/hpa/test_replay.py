"""replay-hpa against a real Prometheus holding 20 minutes of the seed workload: the decision function
over history, as written and with another target, the load model, the table, the summary and the
PNG chart; bad flags in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import requests

from adapter.cli import main
from adapter.commands import replay_hpa
from adapter.hpa import replay
from adapter.hpa import spec as hpaspec
from adapter.hpa.timeline import Timeline
from devkit.clidocs import pointers
from hpa_controller import decide as hpa
from tests.adapter.conftest import PromEnv

SEED_HPA = Path(__file__).resolve().parents[3] / "examples" / "hpa-llm-inference.yaml"


def test_replay_as_written_and_with_another_target(
    prom: PromEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = tmp_path / "replay.png"
    code = main(
        [
            "replay-hpa",
            "-f",
            str(SEED_HPA),
            "--prometheus-url",
            prom.url,
            "--since",
            "15m",
            "--until",
            str(int(prom_now(prom)) - 120),
            "--set",
            "inference_queue_depth=6",
            "--chart",
            str(chart),
            "--rows",
            "5",
        ]
    )
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, captured.err
    assert [line for line in out.splitlines() if line.startswith("wrote ")] == [f"wrote {chart}"]
    assert "fetching 2 metric(s) over 15m" in captured.err
    assert "61 steps of 15s" in out
    assert "recorded replicas from pods with a value" in out
    # as written: queue 12 vs 10 → 4 pods; then 12 × 3 / 4 = 9 per pod is inside the tolerance: 4
    # with target 6: 2 × 3 → 6 via 5 (+2 pods per 120 s after the 60 s scale-up window); 36 / 6 = 6
    assert "inference_queue_depth=6" in out
    means = next(line for line in out.splitlines() if line.strip().startswith("mean replicas")).split()
    assert means[2] == "3.00"  # recorded
    assert 3.9 < float(means[3]) <= 4.0  # as written
    assert 5.5 < float(means[4]) <= 6.0  # target 6
    events = next(line for line in out.splitlines() if line.strip().startswith("scale events")).split()
    assert events[-2:] == ["1/0", "2/0"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10_000


def prom_now(prom: PromEnv) -> float:
    data = requests.get(f"{prom.url}/api/v1/query", params={"query": "time()"}, timeout=5).json()
    return float(data["data"]["result"][0])


def test_load_model_rescales_per_pod_means() -> None:
    obs = hpa.Observation(per_pod={"a": 90.0, "b": 80.0, "c": 70.0})
    scaled, mean = replay.rescale(obs, recorded=3, replicas=4)
    assert mean == pytest.approx(60.0)  # 80 × 3 / 4
    assert scaled.per_pod is not None and len(scaled.per_pod) == 4
    total = hpa.Observation(values=(36.0,))
    assert replay.rescale(total, recorded=3, replicas=6) == (total, None)


def test_replay_holds_scale_down_for_the_window() -> None:
    # one metric at 1/4 of target for 10 minutes from 8 replicas: the default 300 s scale-down
    # window of a behavior section keeps 8 for 5 minutes, then the controller drops to 2 at once
    model = hpa.HpaModel(1, 10, (hpa.MetricSpec("Pods", "q", "AverageValue", 10),), hpa.Behavior())
    times = [1_800_000_000.0 + 15 * i for i in range(41)]
    observations = [[hpa.Observation(per_pod={f"p{j}": 2.5 for j in range(8)})] for _ in times]
    line = Timeline(times, observations, [8] * len(times), "test", [f"p{j}" for j in range(8)])
    result = replay.replay(model, line, label="x")
    replicas = [s.replicas for s in result.steps]
    assert replicas[0] == 8 and replicas[19] == 8  # t = 285 s
    assert replicas[21] == 2  # 315 s: past the window; 2.5 × 8 / 2 = 10 per pod, on target


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--set", "nosuch=5"], "--set 'nosuch=5': expected METRIC=TARGET with METRIC one of"),
        (["--set", "inference_queue_depth=-1"], "the target must be a positive number"),
        (["--since", "forever"], "--since: 'forever' is not a duration"),
        (["--step", "0s"], "--step 0s: must be at least 1s"),
    ],
)
def test_bad_flags_are_one_line(flags: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay-hpa", "-f", str(SEED_HPA), "--prometheus-url", "http://127.0.0.1:9", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and "\n" not in err


def test_replay_starts_from_the_recorded_count_and_the_first_sync_records_the_clamp() -> None:
    """Recorded 10 with maxReplicas 8 (a what-if with a lower bound): the controller's first sync sets
    8 and stores a scale-down event of 2; under a 'Pods 1 per 60 s' scale-down policy that event keeps
    the count at 8 for the next 60 s, although the load asks for fewer pods at once."""
    down = hpa.scale_down_rules(stabilization_seconds=0, policies=(hpa.Policy("Pods", 1, 60),))
    model = hpa.HpaModel(
        1, 8, (hpa.MetricSpec("Pods", "q", "AverageValue", 10),), hpa.Behavior(scale_down=down)
    )
    times = [1_800_000_000.0 + 15 * i for i in range(9)]
    observations = [[hpa.Observation(per_pod={f"p{j}": 2.0 for j in range(10)})] for _ in times]
    line = Timeline(times, observations, [10] * len(times), "test", [f"p{j}" for j in range(10)])
    result = replay.replay(model, line, label="x")
    replicas = [s.replicas for s in result.steps]
    assert replicas[0] == 8  # clamped by the first sync, not before it
    # 60 s after the clamp's event (step 4) the policy allows one pod less, then one per 60 s
    assert replicas[1:4] == [8, 8, 8] and replicas[4] == 7 and replicas[8] == 6
    # starting from the clamped count without the event (what replay did before) drops at once
    clamped = Timeline(times, observations, [8] * len(times), "test", [f"p{j}" for j in range(8)])
    assert replay.replay(model, clamped, label="x").steps[0].replicas == 7


def test_replay_json_document_has_the_documented_keys() -> None:
    model = hpa.HpaModel(1, 10, (hpa.MetricSpec("Pods", "q", "AverageValue", 10),), hpa.Behavior())
    times = [1_800_000_000.0 + 15 * i for i in range(41)]
    observations = [[hpa.Observation(per_pod={f"p{j}": 2.5 for j in range(8)})] for _ in times]
    line = Timeline(times, observations, [8] * len(times), "test", [f"p{j}" for j in range(8)])
    runs = [replay.replay(model, line, label="as written"), replay.replay(model, line, label="q=5")]
    spec = replace(hpaspec.load_hpa(SEED_HPA), model=model)
    doc = replay.document(spec, line, runs, step=15, gpus_per_pod=1, rows=4, targets={"q": 5.0})
    assert list(doc) == [
        "hpa", "kubernetes", "start", "end", "step_seconds", "steps", "pods", "recorded_from", "recorded",
        "runs", "slices",
    ]  # fmt: skip
    assert list(doc) == pointers.schema_keys(replay_hpa.OUTPUT_SCHEMA)  # the reference page's table
    assert doc["steps"] == 41 and doc["recorded"]["mean_replicas"] == 8  # type: ignore[index]
    assert [r["label"] for r in doc["runs"]] == ["as written", "q=5"]  # type: ignore[attr-defined]
    assert doc["runs"][1]["targets"] == {"q": 5.0} and doc["runs"][0]["first_replicas"] == 8  # type: ignore[index]
    assert len(doc["slices"]) == 4  # type: ignore[arg-type]
    json.dumps(doc, allow_nan=False)  # plain JSON
