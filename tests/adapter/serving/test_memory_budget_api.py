"""The memory budget as the HPA and KEDA meet it: the adapter (real HTTPS and gRPC) reading a
stand-in Prometheus that answers every query with 1,000,000 series (devkit.hugeanswer), with a
16 MiB ``--memory-budget``: the external metrics API answers 503 and the KEDA scaler UNAVAILABLE,
each with the one line naming the budget, and nothing stays charged afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from adapter.config.settings import ScalerSettings, ServeSettings
from adapter.serving.app import Adapter
from adapter.serving.keda import externalscaler_pb2 as pb
from adapter.serving.keda import externalscaler_pb2_grpc as pb_grpc
from devkit.hugeanswer import HugeAnswerServer
from tests.adapter.conftest import Client, base_settings
from tests.support.adapter.pki import Pki

CONFIG = "external:\n  - name: util\n    series: DCGM_FI_DEV_GPU_UTIL\n    query: sum by (pod) (DCGM_FI_DEV_GPU_UTIL{<<matchers>>})\n"
MiB = 1 << 20


@pytest.fixture(scope="module")
def huge() -> Iterator[HugeAnswerServer]:
    with HugeAnswerServer(1_000_000) as server:
        yield server


def test_an_answer_over_the_budget_is_503_and_unavailable_naming_it(
    huge: HugeAnswerServer, pki: Pki, start_adapter: Callable[[ServeSettings], Adapter], tmp_path: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    settings = base_settings(
        huge.url, pki, config_path=config, refresh_interval=60.0, memory_budget=16 * MiB,
        external_scaler=ScalerSettings(host="127.0.0.1", port=0),
    )  # fmt: skip
    adapter = start_adapter(settings)
    answer = Client(f"https://127.0.0.1:{adapter.port}", pki).as_hpa(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/ai/util", {"labelSelector": "pod=a"}
    )
    assert answer.status_code == 503
    assert "memory budget for Prometheus answers" in answer.text and "--memory-budget 16 MiB" in answer.text
    assert adapter.scaler is not None
    with grpc.insecure_channel(f"127.0.0.1:{adapter.scaler.port}") as channel:
        r = pb.ScaledObjectRef(
            name="consumer",
            namespace="ai",
            scalerMetadata={"metric": "util", "targetValue": "1", "labelSelector": "pod=b"},
        )
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.ExternalScalerStub(channel).GetMetrics(
                pb.GetMetricsRequest(scaledObjectRef=r), timeout=30
            )
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "--memory-budget 16 MiB" in info.value.details() and "\n" not in info.value.details()
    assert adapter.budget.refused >= 2
    # Nothing refused keeps any of the budget. The discovery thread may still be reading the huge
    # 'metric names' answer (it holds its share until it stops it): wait for that, not for a leak.
    deadline = time.monotonic() + 20
    while adapter.budget.used and time.monotonic() < deadline:
        time.sleep(0.05)
    assert adapter.budget.used == 0
