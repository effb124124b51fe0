"""Scenario ``pending:`` pods: checked like the rest of the file (one line naming the field), and
published by the cluster endpoint as kube-state-metrics shows a pod the scheduler cannot place."""

from __future__ import annotations

import pytest

from exporter.errors import ScenarioError
from simulator import cluster, scenario

NODES = """
nodes:
  - name: n
    gpus: [{model: H100 80GB, mig: {"3g.40gb": 2}}]
workloads:
  - {namespace: ml, pod: running, devices: [n/0/3g.40gb]}
"""


def test_pending_pod_series() -> None:
    s = scenario.loads(
        NODES
        + """
pending:
  - {namespace: ml, pod: wants-4g, resource: nvidia.com/mig-4g.40gb, count: 2}
  - {namespace: ml, pod: wants-gpu, resource: nvidia.com/gpu}
"""
    )
    got = {
        (
            x.family,
            dict(x.labels).get("pod"),
            dict(x.labels).get("phase"),
            dict(x.labels).get("resource"),
        ): x.value
        for x in cluster.series(s)
    }
    assert got[("kube_pod_status_phase", "wants-4g", "Pending", None)] == 1.0
    assert got[("kube_pod_status_phase", "wants-4g", "Running", None)] == 0.0
    assert got[("kube_pod_container_resource_requests", "wants-4g", None, "nvidia_com_mig_4g_40gb")] == 2.0
    assert got[("kube_pod_container_resource_requests", "wants-gpu", None, "nvidia_com_gpu")] == 1.0
    # The running pod stays Running.
    assert got[("kube_pod_status_phase", "running", "Running", None)] == 1.0


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "{pod: x, resource: nvidia.com/gpus}",
            "pending[0].resource: 'nvidia.com/gpus' is not nvidia.com/gpu",
        ),
        (
            "{namespace: ml, pod: running, resource: nvidia.com/gpu}",
            "pending[0].pod: pod ml/running is defined twice",
        ),
        (
            "{pod: x, resource: nvidia.com/gpu, count: 0}",
            "pending[0].count: must be a whole number from 1 to 64, got 0",
        ),
        ("{pod: x, resource: nvidia.com/gpu, colour: red}", "colour"),
    ],
)
def test_bad_pending_entries_are_one_line(entry: str, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        scenario.loads(NODES + f"pending:\n  - {entry}\n")
    assert message in str(err.value) and "\n" not in str(err.value)
