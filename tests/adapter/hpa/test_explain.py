"""explain-hpa on the seed's HPA (ai-serving/llm-inference-hpa) against a real Prometheus: values per
pod, averages, per-metric proposals, behavior and the final decision; bad input in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapter.cli import main
from tests.adapter.conftest import PromEnv

SEED_HPA = Path(__file__).resolve().parents[3] / "examples" / "hpa-llm-inference.yaml"


def test_seed_hpa(prom: PromEnv, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain-hpa", "-f", str(SEED_HPA), "--prometheus-url", prom.url])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "HPA ai-serving/llm-inference-hpa → Deployment/llm-inference" in out
    assert "3 pods, 3 ready; current replicas 3; min 2, max 8; tolerance 0.1; behavior as written" in out, out
    lines = {line.split()[0]: line for line in out.splitlines() if line.strip().startswith("pods/")}
    # DCGM_FI_DEV_GPU_UTIL: mean of 90, 80, 70 = 80 vs 75 → ratio 1.067, inside tolerance → 3
    util = lines["pods/DCGM_FI_DEV_GPU_UTIL"].split()
    assert util[1:5] == ["Pods", "AverageValue", "75", "80"] and util[5] == "3/3" and util[6] == "3", out
    # inference_queue_depth: mean 12 vs 10 → ratio 1.2 → ceil(3.6) = 4
    queue = lines["pods/inference_queue_depth"].split()
    assert queue[4] == "12" and queue[6] == "4" and "(ratio 1.200)" in lines["pods/inference_queue_depth"], (
        out
    )
    pod_a = next(line.split() for line in out.splitlines() if line.strip().startswith("llm-inference-7d9f-a"))
    assert pod_a == ["llm-inference-7d9f-a", "ready", "90", "14"], out  # DCGM_FI_DEV_GPU_UTIL, queue
    # the last 300 s are rebuilt from range queries: steady at 4 (3 pods, queue 12 vs 10), so the
    # 60 s scale-up window does not hold it back
    assert "recommendation(s) of the last 300s recomputed from Prometheus range queries" in out, out
    assert "caveat" not in out
    assert "FINAL: 3 → 4 replicas (scale up)" in out
    assert (
        "(selector from Deployment llm-inference in the same file; pods from the prometheus pod source)"
        in out
    )
    assert "(decision as Kubernetes v1.35)" in out


def test_without_history_says_so(prom: PromEnv, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain-hpa", "-f", str(SEED_HPA), "--prometheus-url", prom.url, "--no-history"])
    out = capsys.readouterr().out
    assert code == 0
    assert "FINAL: 3 → 4 replicas (scale up)" in out
    # without history the answer assumes a steady HPA, and says what a new one would do
    assert (
        "caveat: no history" in out
        and "an HPA created just now (its memory starts at 3) would go to 3" in out
    )


def test_current_replicas_flag_and_clamp(prom: PromEnv, capsys: pytest.CaptureFixture[str]) -> None:
    # with 6 replicas reported, utilisation 80 × 3 pods ... the HPA averages over pods with values;
    # missing pods do not exist here, so ratios stay; queue → ceil(1.2 × 3) = 4 < 6, util → keep 6:
    # largest proposal 6 → no change
    code = main(["explain-hpa", "-f", str(SEED_HPA), "--prometheus-url", prom.url, "--current-replicas", "6"])
    out = capsys.readouterr().out
    assert code == 0
    assert "FINAL: 6 → 6 replicas (no change)" in out


def test_missing_metric_is_reported_not_fatal(
    prom: PromEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hpa = tmp_path / "hpa.yaml"
    hpa.write_text(SEED_HPA.read_text().replace("inference_queue_depth", "no_such_metric"))
    code = main(["explain-hpa", "-f", str(hpa), "--prometheus-url", prom.url])
    out = capsys.readouterr().out
    assert code == 0
    assert "could not find the metric no_such_metric" in out
    # util proposes 3 = current: no scale-down to block, so the HPA acts on the metric that works
    assert "1 metric(s) failed; the others propose 3 ≥ 3, so the HPA acts on them" in out
    assert "FINAL: 3 → 3 replicas (no change)" in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("apiVersion: v1\nkind: ConfigMap\n", "no HorizontalPodAutoscaler document found"),
        (
            "apiVersion: autoscaling/v1\nkind: HorizontalPodAutoscaler\nspec: {}\n",
            "only autoscaling/v2 is supported",
        ),
        ("kind: [unclosed\n", "invalid YAML"),
    ],
)
def test_bad_hpa_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    f = tmp_path / "hpa.yaml"
    f.write_text(content)
    code = main(["explain-hpa", "-f", str(f), "--prometheus-url", "http://127.0.0.1:9"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err and str(f) in err and "\n" not in err


def test_prometheus_down_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["explain-hpa", "-f", str(SEED_HPA), "--prometheus-url", "http://127.0.0.1:9"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err == (
        "gpupilot-adapter explain-hpa: cannot reach Prometheus at http://127.0.0.1:9: connection refused; "
        "is it running? check --prometheus-url"
    )


def test_object_and_external_metrics(
    prom: PromEnv, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hpa = tmp_path / "hpa.yaml"
    hpa.write_text(
        """
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: mixed, namespace: ai-serving}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: llm-inference}
  minReplicas: 1
  maxReplicas: 10
  metrics:
    - type: Object
      object:
        describedObject: {apiVersion: v1, kind: Namespace, name: ai-serving}
        metric: {name: inference_queue_depth}
        target: {type: AverageValue, averageValue: "10"}
    - type: External
      external:
        metric: {name: gpupilot_fleet_waste_gpu_equivalents}
        target: {type: Value, value: "500m"}
    - type: Resource
      resource: {name: memory, target: {type: Utilization, averageUtilization: 50}}
"""
    )
    code = main(
        [
            "explain-hpa",
            "-f",
            str(hpa),
            "--prometheus-url",
            prom.url,
            "--selector",
            "app=llm-inference",
            "-o",
            "wide",  # every column, whatever the terminal's width
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.startswith("  ") and "/" in line.split()[0]
    }
    # Object AverageValue: 36 queued in the namespace, 10 per replica → ceil(3.6) = 4; the HPA
    # reports the per-replica average, ceil(36 / 3) = 12
    assert rows["namespaces/ai-serving/inference_queue_depth"][4] == "12"
    assert rows["namespaces/ai-serving/inference_queue_depth"][6] == "4"
    # External Value: 1.5 vs 0.5 → ratio 3 × 3 ready pods = 9
    assert rows["external/gpupilot_fleet_waste_gpu_equivalents"][4] == "1.5"
    assert rows["external/gpupilot_fleet_waste_gpu_equivalents"][6] == "9"
    # Resource memory from cAdvisor + kube-state-metrics series: 60 GiB of 96 GiB requested = 62 %
    # vs 50 % → ratio 1.24 → ceil(3.72) = 4
    assert rows["resource/memory"][4] == "62%" and rows["resource/memory"][6] == "4", out
    assert "FINAL: 3 → 6 replicas (scale up)" in out  # no behavior: limited to max(2 × 3, 4) = 6
