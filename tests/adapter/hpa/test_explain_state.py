"""explain-hpa --state: black-box answers from a state file (no Prometheus), history included, and
bad state files in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from adapter.cli import main
from adapter.commands import explain_hpa
from devkit.clidocs import pointers

ROOT = Path(__file__).resolve().parents[3]
SEED_HPA = ROOT / "examples" / "hpa-llm-inference.yaml"
EXAMPLE_STATE = ROOT / "examples" / "hpa-state.yaml"


def run(hpa: Path, state: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str, str]:
    code = main(["explain-hpa", "-f", str(hpa), "--state", str(state), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def test_example_state(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(SEED_HPA, EXAMPLE_STATE, capsys)
    assert code == 0, err
    # util: mean 91.33 of three ready pods vs 75 → 1.218; the pending pod counts 0 → 68.5 → 0.913:
    # the direction flips → no change (4).
    assert "rebalanced ratio 0.913 → no change" in out
    # queue: mean 38 of a and b vs 10 → 3.8; c (missing) and d (pending) count 0 → 19 → 1.9 → 8
    assert "8  (ratio 3.800)" in out
    # history: the 4 recommended 70 s ago is outside the 60 s scale-up window; one pod was added 90 s
    # ago, inside the 120 s period of the "2 pods" policy: (4 - 1) + 2 = 5
    assert (
        "limited by scaleUp policy Pods 2 per 120s (its only policy), which allows 5 now: it counts from 3 "
        "(current 4, less 1 added by the scale event(s) of its period: +1 90s ago)"
    ) in out
    assert "FINAL: 4 → 5 replicas (scale up)" in out
    assert f"(history from {EXAMPLE_STATE})" in out
    assert "caveat" not in out


def _hpa(tmp_path: Path, behavior: str = "") -> Path:
    f = tmp_path / "hpa.yaml"
    f.write_text(
        """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web, namespace: shop}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}
  minReplicas: 1
  maxReplicas: 20
  metrics:
    - type: Pods
      pods: {metric: {name: qps}, target: {type: AverageValue, averageValue: "20"}}
    - type: External
      external: {metric: {name: queue}, target: {type: AverageValue, averageValue: "30"}}
"""
        + behavior
    )
    return f


def _state(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "state.yaml"
    f.write_text(text)
    return f


def test_missing_pods_at_exactly_target_do_not_scale_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 5 pods, 3 with values averaging the target exactly: the controller fills nothing in → 5
    state = _state(
        tmp_path,
        """currentReplicas: 5
pods: [{name: a}, {name: b}, {name: c}, {name: d}, {name: e}]
metrics:
  qps: {a: 20, b: 19, c: 21}
  queue: [60, 40]
""",
    )
    code, out, err = run(_hpa(tmp_path), state, capsys)
    assert code == 0, err
    assert "FINAL: 5 → 5 replicas (no change)" in out
    assert "ratio exactly 1.0: none filled in" in out
    assert "caveat: no history" in out


def test_history_holds_a_scale_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = """currentReplicas: 6
pods: [{name: a}, {name: b}, {name: c}, {name: d}, {name: e}, {name: f}]
metrics:
  qps: {a: 5, b: 5, c: 5, d: 5, e: 5, f: 5}
  queue: 30
"""
    code, out, _ = run(_hpa(tmp_path), _state(tmp_path, text), capsys)
    # qps 5 vs 20 → ceil(0.25 × 6) = 2; queue 30 total / 30 per replica → 1: recommended 2 → min… 2
    assert "FINAL: 6 → 2 replicas (scale down)" in out
    assert "an HPA created just now (its memory starts at 6) would go to 6" in out
    held = text + "history:\n  recommendations: [{ago: 4m, replicas: 5}]\n"
    code, out, _ = run(_hpa(tmp_path), _state(tmp_path, held), capsys)
    assert code == 0
    assert "FINAL: 6 → 5 replicas (scale down)" in out  # highest recommendation of the last 300 s
    new = text + "history: {new: true}\n"
    code, out, _ = run(_hpa(tmp_path), _state(tmp_path, new), capsys)
    assert "FINAL: 6 → 6 replicas (no change)" in out
    # the reason is named: a new HPA's first recommendation is its current size
    assert "new HPA: the controller's first recommendation is the current size, 6" in out


def test_per_hpa_tolerance_from_behavior(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = """currentReplicas: 10
pods: [{name: p0}, {name: p1}, {name: p2}, {name: p3}, {name: p4}, {name: p5}, {name: p6}, {name: p7}, {name: p8}, {name: p9}]
metrics:
  qps: {p0: 21, p1: 21, p2: 21, p3: 21, p4: 21, p5: 21, p6: 21, p7: 21, p8: 21, p9: 21}
  queue: 300
"""
    code, out, _ = run(_hpa(tmp_path), _state(tmp_path, text), capsys)
    assert "FINAL: 10 → 10 replicas (no change)" in out  # ratio 1.05 inside the default 0.1
    behavior = "  behavior:\n    scaleUp: {tolerance: 0.02}\n"
    code, out, _ = run(_hpa(tmp_path, behavior), _state(tmp_path, text), capsys)
    assert code == 0
    assert "tolerance up 0.02 / down 0.1" in out
    assert "FINAL: 10 → 11 replicas (scale up)" in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("pods: [{name: a, phase: Sleeping}]\n", "pods[0].phase: 'Sleeping' is not one of"),
        ("pods: [{name: a}]\ncurrentReplicas: -1\n", "currentReplicas: must be a whole number"),
        ("pods: [{name: a}]\nmetrics: {qps: {a: lots}}\n", "metrics.qps.a: 'lots' is not a number"),
        ("pods: [{name: a}]\nmetrics: {qps: 5}\n", "metrics.qps: a Pods metric needs a value per pod"),
        ("pods: [{name: a}]\nhistory: {recommendations: [{replicas: 3}]}\n", "needs at (a time) or ago"),
        ("pods: [{name: a}]\nhistory: {recommendations: [{ago: soon, replicas: 3}]}\n", "not a duration"),
        ("pods: [{name: a}, {name: a}]\n", "a pod name appears twice"),
        ("podz: []\n", "podz: unknown field"),
        ("now: yesterday\n", "now: 'yesterday' is not a time (use RFC 3339"),
        ("[unclosed\n", "invalid YAML"),
    ],
)
def test_bad_state_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    state = _state(tmp_path, text)
    code, _, err = run(_hpa(tmp_path), state, capsys)
    assert code == 2
    assert message in err and str(state) in err and "\n" not in err


def test_min_above_max_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hpa = _hpa(tmp_path)
    hpa.write_text(hpa.read_text().replace("minReplicas: 1", "minReplicas: 25"))
    code, _, err = run(hpa, _state(tmp_path, "pods: []\n"), capsys)
    assert code == 2
    assert "spec.minReplicas 25 is greater than spec.maxReplicas 20" in err and "\n" not in err


def test_no_prometheus_and_no_state(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain-hpa", "-f", str(_hpa(tmp_path))])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert "needs --prometheus-url, or --state FILE" in err


def test_no_metrics_means_cpu_at_80_percent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the API server defaults an empty spec.metrics to CPU utilisation 80 %
    hpa = _hpa(tmp_path)
    text = hpa.read_text()
    hpa.write_text(text[: text.index("  metrics:")])
    state = _state(
        tmp_path,
        """currentReplicas: 2
pods:
  - {name: a, requests: {cpu: "1"}}
  - {name: b, requests: {cpu: 1000m}}
metrics:
  cpu: {a: 1.5, b: 1.7}
""",
    )
    code, out, err = run(hpa, state, capsys)
    assert code == 0, err
    # 3.2 cores of 2 requested = 160 % vs 80 % → ratio 2 → 4
    assert "resource/cpu" in out and "160%" in out and "FINAL: 2 → 4 replicas (scale up)" in out


def test_json_and_yaml_output_parse_with_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(SEED_HPA, EXAMPLE_STATE, capsys, "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert list(doc) == [
        "hpa", "kubernetes", "at", "current_replicas", "min_replicas", "max_replicas", "tolerance",
        "behavior", "pods", "metrics", "per_pod", "decision", "sources", "caveats",
    ]  # fmt: skip
    assert list(doc) == pointers.schema_keys(explain_hpa.OUTPUT_SCHEMA)  # the reference page's table
    assert doc["hpa"] == {
        "namespace": "ai-serving",
        "name": "llm-inference-hpa",
        "target": "Deployment/llm-inference",
    }
    queue = next(m for m in doc["metrics"] if m["metric"] == "pods/inference_queue_depth")
    assert queue["proposal"] == 8 and queue["current"] == 38 and queue["pods_with_value"] == 2
    assert doc["decision"]["final"] == 5 and doc["decision"]["change"] == "scale up"
    assert any("policy Pods 2 per 120s" in step for step in doc["decision"]["steps"])
    pending = next(p for p in doc["per_pod"] if p["name"] == "llm-inference-d")
    assert pending["state"] == "pending" and pending["values"]["inference_queue_depth"] is None
    code, out, _ = run(SEED_HPA, EXAMPLE_STATE, capsys, "-o", "yaml")
    assert code == 0 and yaml.safe_load(out) == doc
