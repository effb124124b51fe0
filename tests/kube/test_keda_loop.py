"""The same loop with KEDA (v2.21.0, its operator and metrics server built from its Go module) in
front of the controller: a ScaledObject's external trigger names the adapter's KEDA scaler, reached
over mutual TLS with the CA and client certificate a TriggerAuthentication gives (as docs/adapter.md
says to), KEDA makes the HorizontalPodAutoscaler, and the kube-controller-manager's HPA controller
scales the GPU Deployment out in the simulated fleet's burst and back in after it, asking KEDA's
metrics server, which asks the operator, which asks the adapter."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.cluster.keda import Keda
from tests.kube import world
from tests.kube.conftest import RealCluster
from tests.kube.loop import METRIC, TARGET, Loop, Recorder, running_loop


@pytest.fixture
def loop(real_cluster: RealCluster, namespace: str) -> Iterator[Loop]:
    with running_loop(real_cluster, namespace, aggregated=False, scaler=True) as world_loop:
        yield world_loop


def test_keda_scales_on_the_external_scaler_over_mutual_tls(
    real_cluster: RealCluster, namespace: str, loop: Loop
) -> None:
    assert loop.client is not None
    node = f"{namespace[:40]}-gpu"
    world.add_gpu_node(real_cluster, node, config="all-disabled", gpus=4)
    world.deployment(real_cluster, namespace, "inference", resources={"nvidia.com/gpu": 1}, node=node)
    world.wait(lambda: world.running_pods(real_cluster, namespace, "inference"), what="inference Running")
    with Keda(real_cluster.cp, Path(real_cluster.cp.directory) / namespace / "keda"):
        real_cluster.kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "keda-gpupilot-client", "namespace": namespace},
                "data": {
                    key: base64.b64encode(path.read_bytes()).decode()
                    for key, path in (
                        ("ca.crt", loop.ca.path),
                        ("tls.crt", loop.client.cert),
                        ("tls.key", loop.client.key),
                    )
                },
            }
        )
        real_cluster.kube.apply(
            {
                "apiVersion": "keda.sh/v1alpha1",
                "kind": "TriggerAuthentication",
                "metadata": {"name": "gpupilot-scaler-tls", "namespace": namespace},
                "spec": {
                    "secretTargetRef": [
                        {"parameter": "caCert", "name": "keda-gpupilot-client", "key": "ca.crt"},
                        {"parameter": "tlsClientCert", "name": "keda-gpupilot-client", "key": "tls.crt"},
                        {"parameter": "tlsClientKey", "name": "keda-gpupilot-client", "key": "tls.key"},
                    ]
                },
            }
        )
        real_cluster.kube.apply(
            {
                "apiVersion": "keda.sh/v1alpha1",
                "kind": "ScaledObject",
                "metadata": {"name": "inference", "namespace": namespace},
                "spec": {
                    "scaleTargetRef": {"name": "inference"},
                    "pollingInterval": 5,
                    "minReplicaCount": 1,
                    "maxReplicaCount": 3,
                    "advanced": {
                        "horizontalPodAutoscalerConfig": {
                            "behavior": {
                                "scaleUp": {
                                    "stabilizationWindowSeconds": 0,
                                    "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15}],
                                },
                                "scaleDown": {
                                    "stabilizationWindowSeconds": 20,
                                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
                                },
                            }
                        }
                    },
                    "triggers": [
                        {
                            "type": "external",
                            "metadata": {
                                "scalerAddress": loop.scaler,
                                "metric": METRIC,
                                "targetValue": str(int(TARGET)),
                            },
                            "authenticationRef": {"name": "gpupilot-scaler-tls"},
                        }
                    ],
                },
            }
        )
        recorder = Recorder(real_cluster, namespace, "inference")
        try:
            world.wait(
                lambda: _hpa_reads_its_metric(real_cluster, namespace),
                what="KEDA's HPA reading the scaler",
                timeout=120,
            )
            burst_start, burst_end = loop.out_and_back(recorder, namespace, logs=f"logs in {loop.work}")
        finally:
            recorder.stop()
    changes = recorder.changes()
    assert [r for _, r in changes] == [1, 3, 1], changes
    assert burst_start <= changes[1][0] <= burst_end, "out during the burst"
    assert changes[2][0] >= burst_end, "in after it"
    scaler_log = (loop.work / "adapter.log").read_text()
    assert "KEDA external scaler (gRPC, TLS" in scaler_log or "external scaler" in scaler_log, scaler_log[
        -500:
    ]
    print(
        f"KEDA: 1→3 at +{changes[1][0] - burst_start:.1f}s into the burst, 3→1 at +{changes[2][0] - burst_end:.1f}s after it"
    )


def _hpa_reads_its_metric(cluster: RealCluster, namespace: str) -> bool:
    hpa = cluster.kube.get("autoscaling/v2", "HorizontalPodAutoscaler", "keda-hpa-inference", namespace) or {}
    conds = (hpa.get("status") or {}).get("conditions") or []
    return any(c["type"] == "ScalingActive" and c["status"] == "True" for c in conds)
