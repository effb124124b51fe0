"""Pod attribution over a real gRPC kubelet double: GPUs, MIG, sharing suffixes, big answers, faults."""

from __future__ import annotations

import os
import socket

import grpc
import pytest

from exporter.attribute.podresources import api_pb2
from exporter.attribute.podresources.client import (
    PodResourcesClient,
    PodResourcesError,
    allocations_from_response,
    resource_names,
    strip_sharing_suffix,
)
from exporter.snapshot import PodRef
from tests.support.exporter.kubelet_double import container, pod

GPU0 = "GPU-0f2c1a7e-8d61-4bb8-9f0a-1c2d3e4f5a60"
GPU1 = "GPU-7b1e2d3c-4a5b-6c7d-8e9f-0a1b2c3d4e5f"
MIG_A = "MIG-2a9b7c51-3d4e-5f60-8172-93a4b5c6d7e8"
MIG_B = "MIG-9e8d7c6b-5a49-3827-1605-f4e3d2c1b0a9"


@pytest.fixture
def client(kubelet):
    c = PodResourcesClient(kubelet.socket_path, timeout=2.0)
    yield c
    c.close()


def test_whole_gpus_map_to_their_containers(kubelet, client):
    kubelet.set_pods(
        [
            pod("ai-serving", "llm-inference-0", [container("server", gpu=[GPU0])]),
            pod("ai-serving", "llm-inference-1", [container("server", gpu=[GPU1]), container("sidecar")]),
        ]
    )
    allocs = client.allocations()
    assert allocs == {
        GPU0: (PodRef("ai-serving", "llm-inference-0", "server", "nvidia.com/gpu"),),
        GPU1: (PodRef("ai-serving", "llm-inference-1", "server", "nvidia.com/gpu"),),
    }


def test_mig_devices_and_other_resources(kubelet, client):
    kubelet.set_pods(
        [
            pod(
                "research",
                "notebook",
                [container("jupyter", mig={"1g.10gb": [MIG_A]}, other={"example.com/nic": ["eth1"]})],
            ),
            pod("batch", "trainer", [container("main", mig={"3g.40gb": [MIG_B]})]),
        ]
    )
    allocs = client.allocations()
    assert set(allocs) == {MIG_A, MIG_B}, "non-NVIDIA resources must be ignored"
    assert allocs[MIG_A] == (PodRef("research", "notebook", "jupyter", "nvidia.com/mig-1g.10gb"),)
    assert allocs[MIG_B][0].resource == "nvidia.com/mig-3g.40gb"


def test_sharing_suffix_is_stripped_and_each_replica_kept_with_its_index(kubelet, client):
    kubelet.set_pods(
        [
            pod("team-a", "a", [container("c", gpu=[f"{GPU0}::0", f"{GPU0}::3"])]),
            pod("team-b", "b", [container("c", mig={"1g.10gb": [f"{MIG_A}::1"]})]),
            pod("team-c", "c", [container("c", gpu=[f"{GPU0}::1"])]),
        ]
    )
    allocs = client.allocations()
    assert allocs[GPU0] == (
        PodRef("team-a", "a", "c", "nvidia.com/gpu", replica="0"),
        PodRef("team-a", "a", "c", "nvidia.com/gpu", replica="3"),
        PodRef("team-c", "c", "c", "nvidia.com/gpu", replica="1"),
    )
    assert allocs[MIG_A] == (PodRef("team-b", "b", "c", "nvidia.com/mig-1g.10gb", replica="1"),)
    assert strip_sharing_suffix("GPU-x") == "GPU-x"


def test_answer_larger_than_4_mib(kubelet, client):
    filler = "x" * 900
    pods = [
        pod("bulk", f"pod-{i:05d}-{filler}", [container("c", other={"example.com/cpu-ish": ["d"]})])
        for i in range(6000)
    ]
    pods.append(pod("ai", "big-gpu-user", [container("c", gpu=[GPU1])]))
    kubelet.set_pods(pods)
    size = api_pb2.ListPodResourcesResponse(pod_resources=pods).ByteSize()
    assert size > 5 * 1024 * 1024
    assert client.allocations()[GPU1][0].pod == "big-gpu-user"
    # The same answer with gRPC's default 4 MiB limit fails: the raised limit is what makes it work.
    small = PodResourcesClient(kubelet.socket_path, timeout=5.0, max_message_bytes=4 * 1024 * 1024)
    try:
        with pytest.raises(PodResourcesError, match="exceeds 4194304 bytes"):
            small.allocations()
    finally:
        small.close()


def test_finished_pod_disappears_on_next_call(kubelet, client):
    kubelet.set_pods(
        [pod("a", "job-1", [container("c", gpu=[GPU0])]), pod("a", "job-2", [container("c", gpu=[GPU1])])]
    )
    assert set(client.allocations()) == {GPU0, GPU1}
    kubelet.set_pods([pod("a", "job-2", [container("c", gpu=[GPU1])])])
    assert set(client.allocations()) == {GPU1}
    assert kubelet.calls == 2


def test_socket_missing_is_one_clear_line(tmp_path):
    path = tmp_path / "nothing.sock"
    with pytest.raises(PodResourcesError) as err:
        PodResourcesClient(str(path)).allocations()
    msg = str(err.value)
    assert str(path) in msg and "not found" in msg and "\n" not in msg


def test_server_error_is_reported_with_its_status(kubelet, client):
    kubelet.fail_with = (grpc.StatusCode.INTERNAL, "device manager\nnot ready")
    with pytest.raises(PodResourcesError) as err:
        client.allocations()
    msg = str(err.value)
    assert "INTERNAL" in msg and "device manager not ready" in msg and "\n" not in msg
    kubelet.fail_with = None
    kubelet.set_pods([pod("a", "p", [container("c", gpu=[GPU0])])])
    assert GPU0 in client.allocations(), "the client recovers once the kubelet answers again"


def test_deadline(kubelet):
    kubelet.delay_s = 1.0
    c = PodResourcesClient(kubelet.socket_path, timeout=0.2)
    try:
        with pytest.raises(PodResourcesError, match=r"no answer within 0.2 s"):
            c.allocations()
    finally:
        c.close()


def test_socket_file_without_server_is_unavailable(tmp_path):
    path = tmp_path / "dead.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))  # a socket file nobody listens on: kubelet restarting
    s.close()
    assert os.path.exists(path)
    c = PodResourcesClient(str(path), timeout=1.0)
    try:
        with pytest.raises(PodResourcesError, match=r"unavailable|deadline"):
            c.allocations()
    finally:
        c.close()


def test_pure_mapping_ignores_other_resources():
    resp = api_pb2.ListPodResourcesResponse(
        pod_resources=[pod("n", "p", [container("c", gpu=[GPU0], other={"example.com/fpga": ["F-1"]})])]
    )
    assert set(allocations_from_response(resp)) == {GPU0}


def test_renamed_shared_resources_and_nvidia_resource_names_are_attributed():
    """renameByDefault advertises nvidia.com/gpu.shared (and nvidia.com/mig-<profile>.shared); names in
    NVIDIA_RESOURCE_NAMES are attributed too, exactly as named."""
    resp = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            pod("n", "s", [container("c", other={"nvidia.com/gpu.shared": ["GPU-z::2"]})]),
            pod("n", "m", [container("c", other={"nvidia.com/mig-1g.10gb.shared": ["MIG-y::0"]})]),
            pod("n", "x", [container("c", other={"example.com/gpu-a100": ["GPU-x"]})]),
        ]
    )
    got = allocations_from_response(resp)
    assert set(got) == {"GPU-z", "MIG-y"}
    assert got["GPU-z"] == (PodRef("n", "s", "c", "nvidia.com/gpu.shared", replica="2"),)
    extra = allocations_from_response(resp, resources=resource_names(["example.com/gpu-a100"]))
    assert set(extra) == {"GPU-z", "MIG-y", "GPU-x"}


def test_nvml_uuids_and_kubelet_ids_join_on_the_series(kubelet, client):
    """End to end: fake NVML H100 (MIG) + kubelet double → pod labels on that instance's series."""
    from exporter.attribute.visibility import ProcessVisibility  # noqa: PLC0415
    from exporter.expose.exposition import device_families  # noqa: PLC0415
    from exporter.nvml.backend import NvmlBackend  # noqa: PLC0415
    from tests.support.exporter import fake_nvml as fk  # noqa: PLC0415

    lib = fk.FakeNvml([fk.h100_mig(0)])
    backend = NvmlBackend(
        library=lib,
        clock=lib.clock,
        sleep=lib.sleep,
        visibility=lambda: ProcessVisibility(True, "host PID namespace"),
    )
    backend.open()
    try:
        snap = backend.read()
    finally:
        backend.close()
    kubelet.set_pods(
        [pod("ai-serving", "llm-0", [container("server", mig={"3g.40gb": ["MIG-h100-0-gi2::0"]})])]
    )
    fams = {f.name: f for f in device_families(snap, hostname="n", allocations=client.allocations())}
    labelled = [
        dict(labels)
        for labels, _ in fams["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples
        if dict(labels).get("pod") == "llm-0"
    ]
    assert len(labelled) == 1
    assert labelled[0]["GPU_I_PROFILE"] == "3g.40gb" and labelled[0]["namespace"] == "ai-serving"


def test_6000_containers_sharing_one_gpu_are_attributed_in_linear_work(monkeypatch):
    """Each of 6,000 time-sliced replicas of one GPU is one holder, found without comparing it to
    every holder before it (before: ~18 million PodRef comparisons, 3-5 s per collection)."""
    from exporter.attribute.podresources import api_pb2  # noqa: PLC0415
    from exporter.attribute.podresources.client import allocations_from_response  # noqa: PLC0415
    from exporter.snapshot import PodRef  # noqa: PLC0415

    response = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                namespace="serve",
                name=f"infer-{n}",
                containers=[
                    api_pb2.ContainerResources(
                        name="srv",
                        devices=[
                            api_pb2.ContainerDevices(
                                resource_name="nvidia.com/gpu", device_ids=[f"GPU-1::{n}"]
                            )
                        ],
                    )
                ],
            )
            for n in range(6000)
        ]
    )
    compared = [0]
    plain_eq = PodRef.__eq__

    def counting_eq(self: PodRef, other: object) -> bool:
        compared[0] += 1
        return plain_eq(self, other)

    monkeypatch.setattr(PodRef, "__eq__", counting_eq)
    got = allocations_from_response(response)
    assert (
        len(got["GPU-1"]) == 6000 and got["GPU-1"][0].pod == "infer-0" and got["GPU-1"][-1].replica == "5999"
    )
    assert compared[0] <= 6000
