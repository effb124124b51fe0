"""Scenario loading: one-line errors naming file and path, built-in MIG configs, pods and labels."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from exporter.errors import ScenarioError
from simulator import scenario

REPO = Path(__file__).resolve().parents[2]
GOOD_NODE = "nodes: [{name: n1, gpus: [{model: H100 80GB}]}]\n"


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as exc:
        scenario.load(path)
    message = str(exc.value)
    assert "\n" not in message, message
    assert message.startswith(f"{path}"), message
    return message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "nodes:\n - name: a\n - name: b\n - name: c\n   gpus: [{model: H100 80GB, mig: {'3g.40gb': 2, '1g.10gb': 1}}]\n",
            "nodes[0].gpus: required, give a list",
        ),
        (
            "nodes:\n - {name: a, gpus: [{model: H100}]}\n - {name: b, gpus: [{model: H100}]}\n"
            " - {name: c, gpus: [{model: H100 80GB, mig: {'3g.40gb': 2, '1g.10gb': 1}}]}\n",
            "nodes[2].gpus[0].mig: 3g.40gb×2 + 1g.10gb×1 has no valid placement on H100 80GB",
        ),
        (
            "nodes: [{name: a, gpus: [{model: H100 80GB, colour: red}]}]\n",
            "nodes[0].gpus[0].colour: unknown field (known: model, count",
        ),
        ("nodes: [{name: a, gpus: [{model: Z9000}]}]\n", "nodes[0].gpus[0].model: unknown GPU model 'Z9000'"),
        (
            "nodes: [{name: a, gpus: [{model: H100 80GB, mig: all-5g.50gb}]}]\n",
            "unknown MIG config 'all-5g.50gb'",
        ),
        (
            "nodes: [{name: a, gpus: [{model: L4, mig: all-balanced}]}]\n",
            "mig: all-balanced needs MIG, which L4 does not support",
        ),
        ("nodes: [{name: a, gpus: [{model: H100 80GB, mig: {'2g.20gb': 4}}]}]\n", "exceeds the maximum of 3"),
        (
            GOOD_NODE + "workloads: [{pod: p, devices: [n1/3]}]\n",
            "workloads[0].devices[0].gpu: n1 has 1 GPUs",
        ),
        (
            GOOD_NODE + "workloads: [{pod: p, devices: [n2/0]}]\n",
            "workloads[0].devices[0].node: no node 'n2'",
        ),
        (
            GOOD_NODE + "workloads: [{pod: p, devices: [n1/0]}, {pod: q, devices: [n1/0]}]\n",
            "workloads[1].devices[0]: device already held by default/p",
        ),
        (
            GOOD_NODE + "workloads: [{deployment: d, replicas: 2, devices: [n1/0]}]\n",
            "workloads[0].devices: 1 devices for 2 replicas",
        ),
        (
            GOOD_NODE + "workloads: [{pod: p, devices: [n1/0], utilization: {pattern: sine}}]\n",
            "workloads[0].utilization.pattern: 'sine' is not one of",
        ),
        (
            GOOD_NODE + "workloads: [{pod: p, devices: [n1/0], utilization: 140}]\n",
            "workloads[0].utilization: 140 is outside [0, 100]",
        ),
        (
            GOOD_NODE + "faults: [{kind: xid, node: n1, gpu: 0}]\n",
            "faults[0].code: required, a whole number >= 1",
        ),
        (GOOD_NODE + "faults: [{kind: meltdown, node: n1}]\n", "faults[0].kind: 'meltdown' is not one of"),
        (
            GOOD_NODE + "faults: [{kind: nvml_error, node: n1, gpu: 0, field: DCGM_FI_NOPE}]\n",
            "faults[0].field: 'DCGM_FI_NOPE' is not a field",
        ),
        (
            GOOD_NODE + "faults: [{kind: hung, node: n1, gpu: 0, at: soon}]\n",
            "faults[0].at: 'soon' is not a duration",
        ),
        (
            GOOD_NODE + "faults: [{kind: gpu_lost, node: n1, gpu: 0, every: 5m, duration: 10m}]\n",
            "faults[0].every: must be longer than duration",
        ),
        (
            "nodes: [{name: a, labels: {nvidia.com/mig.strategy: single}, gpus: [{model: H100 80GB, mig: all-balanced}]}]\n",
            "single needs every GPU of the node in MIG mode with one and the same profile",
        ),
        (
            GOOD_NODE + "hpas: [{name: h, target: nope, max_replicas: 3, metrics: [{name: m, value: 1}]}]\n",
            "no deployment default/nope",
        ),
        ("seed: 1\nsurprise: true\n" + GOOD_NODE, "surprise: unknown field (known: seed, epoch, nodes"),
        ('seed: "²"\n' + GOOD_NODE, ":1: seed: must be a whole number, got '²'"),
        ("", "fleet.yaml: nodes: required, give a list"),
        ("- nodes\n", "fleet.yaml:1: the scenario must be a mapping of fields, got list"),
        (
            GOOD_NODE + "workloads: [{pod: p, devices: [n1/0], utilization: daily}]\n",
            "workloads[0].utilization: must be a number, idle, or a mapping with pattern: constant, daily or",
        ),
    ],
)
def test_errors_are_one_line_with_path(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in _error(tmp_path, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "nodes:\n - name: a\n - name: b\n - name: c\n   gpus: [{model: H100 80GB, mig: {'3g.40gb': 2, '1g.10gb': 1}}]\n",
            ":2: nodes[0].gpus: required, give a list",
        ),
        (
            "seed: 1\nnodes:\n  - name: a\n    gpus:\n      - model: H100 80GB\n        mig: {'2g.20gb': 4}\n",
            ":6: nodes[0].gpus[0].mig: ",
        ),
        (
            "nodes:\n  - name: a\n    labels:\n      nvidia.com/mig.strategy: single\n"
            "    gpus: [{model: H100 80GB, mig: all-balanced}]\n",
            ":4: nodes[0].labels.nvidia.com/mig.strategy: ",
        ),
        (
            GOOD_NODE + "faults:\n  - kind: hung\n    node: n1\n    gpu: 0\n    at: soon\n",
            ":6: faults[0].at: ",
        ),
        ("seed: 1\nsurprise: true\n" + GOOD_NODE, ":2: surprise: unknown field"),
    ],
)
def test_errors_name_the_line_of_the_field(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in _error(tmp_path, text)


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    message = _error(tmp_path, "nodes:\n  - name: a\n    gpus: [{model: H100\n")
    assert message.startswith(f"{tmp_path / 'fleet.yaml'}:4: ")
    assert message.endswith("(YAML syntax)")


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read the scenario"):
        scenario.load(tmp_path / "absent.yaml")


def test_builtin_configs_resolve_per_model() -> None:
    s = scenario.loads(
        "nodes: [{name: a, gpus: [{model: H100 80GB, mig: all-balanced}, {model: A100 40GB, mig: all-1g.10gb},"
        " {model: H200, mig: all-balanced}, {model: '0x2330', mig: all-enabled}, {model: A100 40GB, mig: all-disabled}]}]"
    )
    gpus = s.nodes[0].gpus
    assert dict(gpus[0].mig_counts or {}) == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    assert dict(gpus[1].mig_counts or {}) == {"1g.10gb": 4}  # the 2-slice profile on A100 40GB
    assert dict(gpus[2].mig_counts or {}) == {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
    assert gpus[3].mig_enabled and gpus[3].instances == () and gpus[3].model.key == "H100 80GB"
    assert not gpus[4].mig_enabled
    # instances are placed on disjoint memory slices with distinct GPU-instance ids
    placed = [(i.start, i.start + i.profile.memory_slices) for i in gpus[0].instances]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(placed))
    assert len({i.gi_id for i in gpus[0].instances}) == 4


def test_deployment_pods_named_like_kubernetes_and_devices_assigned_in_order() -> None:
    s = scenario.load(REPO / "examples" / "fleet-demo.yaml")
    llm = [p for p in s.pods if p.deployment == "llm-inference"]
    assert len(llm) == 3
    for pod in llm:
        prefix, rs_hash, suffix = pod.name.rsplit("-", 2)
        assert prefix == "llm-inference" and len(rs_hash) == 10 and len(suffix) == 5
        assert pod.owner_kind == "ReplicaSet" and pod.owner_name == f"llm-inference-{rs_hash}"
        assert pod.container == "vllm" and dict(pod.labels) == {"app": "llm-inference"}
        assert pod.devices[0].gi_id is None  # whole GPUs
    assert len({p.name for p in llm}) == 3
    uuids = [d.uuid for p in s.pods for d in p.devices]
    assert len(uuids) == len(set(uuids))
    # the same file loads to equal objects: ids are derived from the seed, not from chance
    assert scenario.load(REPO / "examples" / "fleet-demo.yaml") == s


def test_node_labels_default_to_gpu_operator_labels() -> None:
    s = scenario.load(REPO / "examples" / "fleet-demo.yaml")
    a100 = s.node("gpu-a100-a")
    assert a100.labels["nvidia.com/mig.strategy"] == "single"
    assert a100.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"
    assert a100.labels["nvidia.com/mig.config"] == "all-3g.20gb"
    assert s.node("gpu-a100-b").labels["nvidia.com/mig.config"] == "all-disabled"
    assert s.node("gpu-h100-a").labels["nvidia.com/mig.config"] == "inference-mix"
    assert all(n.labels["nvidia.com/mig.config.state"] == "success" for n in s.nodes)


def test_demo_fleet_has_what_the_issue_asks_for() -> None:
    s = scenario.load(REPO / "examples" / "fleet-demo.yaml")
    models = {g.model.key for n in s.nodes for g in n.gpus}
    assert {"H100 80GB", "A100 40GB", "H200"} <= models and len(s.nodes) >= 4
    assert {n.mig_strategy for n in s.nodes} == {"single", "mixed"}
    held = {d.uuid for p in s.pods for d in p.devices}
    slices = [i for n in s.nodes for g in n.gpus for i in g.instances]
    assert any(i.uuid not in held for i in slices)  # free slices
    idle_held = [p for p in s.pods if p.utilization.kind == "idle" and p.devices[0].gi_id is not None]
    assert idle_held  # allocated but idle slices
    assert [h.name for h in s.hpas] == ["llm-inference-hpa"]
    assert {f.kind for f in s.faults} >= {"xid"}


def test_bench_scenario_is_8_h100_with_56_pods() -> None:
    s = scenario.load(REPO / "bench" / "node-8xh100-56pods.yaml")
    (node,) = s.nodes
    assert [g.model.key for g in node.gpus] == ["H100 80GB"] * 8
    assert all(dict(g.mig_counts or {}) == {"1g.10gb": 7} for g in node.gpus)
    assert len(s.pods) == 56
