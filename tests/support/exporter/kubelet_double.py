"""A kubelet pod-resources double: a real gRPC server implementing v1 ``List`` on a unix socket.

Reusable by any test that needs pod attribution::

    with KubeletDouble(tmp_path / "kubelet.sock") as kubelet:
        kubelet.set_pods([pod("ns", "p", [container("c", gpu=["GPU-…"])])])
        ... PodResourcesClient(kubelet.socket_path) ...

``fail_with`` makes ``List`` answer with a gRPC status; ``delay_s`` holds each answer back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from concurrent import futures
from pathlib import Path

import grpc

from exporter.attribute.podresources import api_pb2, api_pb2_grpc


def container(
    name: str,
    *,
    gpu: Sequence[str] = (),
    mig: dict[str, Sequence[str]] | None = None,
    other: dict[str, Sequence[str]] | None = None,
    claims: Sequence[api_pb2.DynamicResource] = (),
) -> api_pb2.ContainerResources:
    """A container holding GPUs (``nvidia.com/gpu``), MIG devices by profile, other devices, or
    devices from ResourceClaims (``claims``, see :func:`claim`)."""
    devices = []
    if gpu:
        devices.append(api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=list(gpu)))
    for profile, ids in (mig or {}).items():
        devices.append(
            api_pb2.ContainerDevices(resource_name=f"nvidia.com/mig-{profile}", device_ids=list(ids))
        )
    for resource, ids in (other or {}).items():
        devices.append(api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids)))
    return api_pb2.ContainerResources(name=name, devices=devices, dynamic_resources=list(claims))


def claim(
    name: str,
    namespace: str,
    devices: Sequence[str],
    *,
    pool: str = "node-a",
    driver: str = "gpu.nvidia.com",
) -> api_pb2.DynamicResource:
    """A ResourceClaim's allocation as the kubelet reports it: ``devices`` by name in ``pool``."""
    return api_pb2.DynamicResource(
        claim_name=name,
        claim_namespace=namespace,
        claim_resources=[
            api_pb2.ClaimResource(
                driver_name=driver,
                pool_name=pool,
                device_name=d,
                cdi_devices=[api_pb2.CDIDevice(name=f"k8s.{driver}/claim={name}-{d}")],
            )
            for d in devices
        ],
    )


def pod(namespace: str, name: str, containers: Iterable[api_pb2.ContainerResources]) -> api_pb2.PodResources:
    return api_pb2.PodResources(namespace=namespace, name=name, containers=list(containers))


class _Lister(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, double: KubeletDouble) -> None:
        self.double = double

    def List(self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext):
        d = self.double
        with d.lock:
            d.calls += 1
            failure, delay, pods = d.fail_with, d.delay_s, list(d.pods)
        if delay:
            time.sleep(delay)
        if failure is not None:
            context.abort(failure[0], failure[1])
        return api_pb2.ListPodResourcesResponse(pod_resources=pods)


class KubeletDouble:
    """The server; a context manager that starts it on ``socket_path`` and stops it on exit."""

    def __init__(self, socket_path: Path | str) -> None:
        self.socket_path = str(socket_path)
        self.lock = threading.Lock()
        self.pods: list[api_pb2.PodResources] = []
        self.fail_with: tuple[grpc.StatusCode, str] | None = None
        self.delay_s = 0.0
        self.calls = 0
        self._server: grpc.Server | None = None

    def set_pods(self, pods: Iterable[api_pb2.PodResources]) -> None:
        with self.lock:
            self.pods = list(pods)

    def start(self) -> KubeletDouble:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4),
            options=[("grpc.max_send_message_length", 256 * 1024 * 1024)],
        )
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Lister(self), server)
        server.add_insecure_port("unix://" + self.socket_path)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None

    def __enter__(self) -> KubeletDouble:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
