"""The simulator's shared and DRA nodes: time-sliced GPUs with per-pod processes, DRA static MIG
(claims by canonical names), DynamicMIG (a new claim and MIG UUID every period), through the collector
as the exporter serves them; the scenario checks; and examples/fleet-sharing.yaml end to end."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from exporter.collect.collector import Collector
from exporter.errors import ScenarioError
from exporter.settings import CollectorSettings
from simulator import scenario as scenario_mod
from simulator.backend import SimBackend

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet-sharing.yaml"
H = 3600.0


@pytest.fixture(scope="module")
def fleet():
    return scenario_mod.load(EXAMPLE)


def page_at(fleet, node: str, t: float) -> str:
    backend = SimBackend(fleet, node=node, clock=lambda: t)
    c = Collector(
        backend,
        hostname=node,
        settings=CollectorSettings(interval=10.0),
        allocations=backend.allocations,
        process_owners=backend.process_owners,
    )
    try:
        assert c.collect_once(), c.last_error
        return c.page.body(openmetrics=False, gzip=False, now=time.monotonic()).decode()
    finally:
        c.stop()


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels_text, value = line[len(name) + 1 :].rsplit("} ", 1)
            labels = dict(part.split("=", 1) for part in labels_text.split('",'))
            out.append(({k: v.strip('"') for k, v in labels.items()}, float(value)))
    return out


def test_time_sliced_gpu_gives_each_pod_its_share_and_the_sum_stays_under_the_device(fleet):
    t = fleet.epoch + 14 * H  # the chat pods' daily peak
    text = page_at(fleet, "gpu-ts", t)
    util = samples(text, "gpupilot_pod_gpu_utilization_ratio")
    mem = samples(text, "gpupilot_pod_gpu_memory_used_bytes")
    gpu0 = [v for lab, v in util if lab["gpu"] == "0"]
    assert len(gpu0) == 4 and len([1 for lab, _ in util if lab["gpu"] == "1"]) == 3
    device = {
        lab["gpu"]: v for lab, v in samples(text, "DCGM_FI_DEV_GPU_UTIL")
    }  # the same on each pod's series
    assert 0 < sum(gpu0) <= device["0"] / 100 + 1e-9
    # every pod on the GPU has its own figure, not the device's
    assert max(gpu0) < device["0"] / 100
    assert sum(v for lab, v in mem if lab["gpu"] == "0") == pytest.approx(4 * 9000 * 1048576)
    assert {lab["namespace"] for lab, _ in util} == {"chat", "batch"}
    # the device series still carry every pod (one series per holder, as dcgm-exporter)
    assert len([1 for lab, _ in samples(text, "gpupilot_device_pod_info") if lab["gpu"] == "0"]) == 4


def test_dra_static_node_labels_claims_by_canonical_names(fleet):
    text = page_at(fleet, "gpu-dra-s", fleet.epoch + 11 * H)
    pods = samples(text, "gpupilot_device_pod_info")
    assert {lab["pod"] for lab, _ in pods} >= {"rerank-0"}
    rerank = next(lab for lab, _ in pods if lab["pod"] == "rerank-0")
    assert rerank["dra_pool_name"] == "gpu-dra-s" and rerank["dra_mig_profile"] == "3g.40gb"
    assert rerank["dra_device_name"] == "gpu-0-mig-3g40gb-9-4"  # the driver's names since v25.12.0
    assert rerank["dra_driver_name"] == "gpu.nvidia.com"
    assert rerank["dra_claim_name"].startswith("rerank-0-gpu-")
    info = {lab["GPU_I_ID"]: lab["mig_uuid"] for lab, _ in samples(text, "gpupilot_mig_instance_info")}
    assert rerank["dra_mig_device_uuid"] == info[rerank["GPU_I_ID"]]
    assert 'gpupilot_exporter_collection_errors_total{backend="sim",kind="dra"} 0' in text


def test_dynamic_mig_creates_instances_per_claim_with_new_uuids(fleet):
    first = page_at(fleet, "gpu-dra-d", fleet.epoch + 1 * H)
    later = page_at(fleet, "gpu-dra-d", fleet.epoch + 7 * H)  # the next claim (claim_every 6h)
    a = {lab["pod"]: lab for lab, _ in samples(first, "gpupilot_device_pod_info")}
    b = {lab["pod"]: lab for lab, _ in samples(later, "gpupilot_device_pod_info")}
    assert set(a) == set(b) == {"infer-0", "tiny-0"}
    for pod in a:
        assert a[pod]["dra_mig_device_uuid"] != b[pod]["dra_mig_device_uuid"]
        assert a[pod]["dra_claim_name"] != b[pod]["dra_claim_name"]
        assert a[pod]["dra_device_name"] == b[pod]["dra_device_name"]  # the same placement
    # only claimed placements exist: the layout has a third (unclaimed) 1g.10gb
    assert len(samples(first, "gpupilot_mig_instance_info")) == 2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "nodes: [{name: n, gpus: [{model: H100 80GB, mig: all-1g.10gb, time_slicing: 2}]}]",
            "nodes[0].gpus[0].time_slicing: time-slicing shares a whole GPU",
        ),
        (
            "nodes: [{name: n, gpus: [{model: H100 80GB, time_slicing: 2}]}]\n"
            "workloads: [{deployment: a, replicas: 3, devices: [n/0, n/0, n/0]}]",
            "workloads[0].devices[2]: n GPU 0 is time-sliced 2 ways, all held",
        ),
        (
            "nodes: [{name: n, dra: sometimes, gpus: [{model: H100 80GB}]}]",
            "nodes[0].dra: 'sometimes' is not one of static, dynamic",
        ),
        (
            "nodes: [{name: n, gpus: [{model: H100 80GB}]}]\nfaults: [{kind: mig_reconfigure, node: n, gpu: 0, at: 1h}]",
            "faults[0]: a mig_reconfigure fault needs 'mig'",
        ),
        (
            "nodes: [{name: n, gpus: [{model: H100 80GB}]}]\n"
            "faults: [{kind: mig_reconfigure, node: n, gpu: 0, at: 1h, mig: {3g.40gb: 3}}]",
            "faults[0].mig: 3g.40gb×3 exceeds the maximum of 2 per GPU on H100 80GB",
        ),
    ],
)
def test_scenario_errors_are_one_line(text: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(message)) as err:
        scenario_mod.loads(text, name="s.yaml")
    assert "\n" not in str(err.value)


def test_a_node_of_an_older_dra_driver_names_mig_devices_as_v25_8_did(fleet):
    text = EXAMPLE.read_text().replace("dra: static", "dra: {mode: static, driver: v25.8}")
    older = scenario_mod.loads(text)
    page = page_at(older, "gpu-dra-s", older.epoch + 11 * H)
    rerank = next(lab for lab, _ in samples(page, "gpupilot_device_pod_info") if lab["pod"] == "rerank-0")
    assert rerank["dra_device_name"] == "gpu-0-mig-9-4-4" and rerank["dra_mig_profile"] == "3g.40gb"
    with pytest.raises(ScenarioError, match=r"is not one of v25\.12, v25\.8"):
        scenario_mod.loads(text.replace("driver: v25.8", "driver: v24"))
