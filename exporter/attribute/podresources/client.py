"""kubelet pod-resources v1 client: device id → containers, over the kubelet's unix socket.

One ``List`` call per collection (no cache: a finished pod disappears on the next call). Device ids
of NVIDIA's device plugin are GPU UUIDs (``nvidia.com/gpu``) or MIG UUIDs (``nvidia.com/mig-*``),
with a ``::N`` suffix when the device is shared (time-slicing); the suffix is stripped so the id
matches the UUID NVML reports. Devices from ResourceClaims (``dynamic_resources``) are read too
when DRA is enabled and resolved against the snapshot (:mod:`exporter.attribute.podresources.dra`). Every failure becomes one :class:`PodResourcesError` with a one-line
cause; the collector counts it and publishes series without pod labels.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import grpc

from exporter.attribute.podresources import api_pb2, api_pb2_grpc, dra
from exporter.errors import ExporterError
from exporter.snapshot import Allocations, PodRef

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""Well above gRPC's 4 MiB default, which busy nodes exceed (dcgm-exporter#509)."""
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-")
"""Attributed device-plugin resources: GPUs, their ``renameByDefault`` name under sharing
(``nvidia.com/gpu.shared``; ``nvidia.com/mig-<profile>.shared`` is under the MIG prefix), MIG devices.
``NVIDIA_RESOURCE_NAMES`` adds others (:func:`resource_names`)."""
"""Resource names whose device ids are GPU or MIG UUIDs (exact name, or prefix when ending in ``-``)."""


class PodResourcesError(ExporterError):
    """The kubelet could not be asked; ``str(e)`` is one line naming the socket and the cause."""

    temporary = True


def resource_names(extra: Iterable[str]) -> tuple[str, ...]:
    """:data:`GPU_RESOURCES` plus ``extra`` (dcgm-exporter's ``NVIDIA_RESOURCE_NAMES``, exact names)."""
    return (*GPU_RESOURCES, *(n for n in extra if n and n not in GPU_RESOURCES))


def strip_sharing_suffix(device_id: str) -> str:
    """``MIG-abc::3`` → ``MIG-abc``: time-slicing replicas share the underlying device's UUID."""
    base, sep, _ = device_id.partition("::")
    return base if sep else device_id


def is_gpu_resource(resource_name: str, prefixes: Iterable[str] = GPU_RESOURCES) -> bool:
    return any(resource_name == p or (p.endswith("-") and resource_name.startswith(p)) for p in prefixes)


def allocations_from_response(
    response: api_pb2.ListPodResourcesResponse, *, resources: Iterable[str] = GPU_RESOURCES
) -> dict[str, tuple[PodRef, ...]]:
    """Pure: a ``List`` response → device id → the containers holding it (in response order)."""
    wanted = tuple(resources)
    out: dict[str, dict[PodRef, None]] = {}  # each device's holders in response order, each once
    for pod in response.pod_resources:
        for container in pod.containers:
            for dev in container.devices:
                if not is_gpu_resource(dev.resource_name, wanted):
                    continue
                for raw_id in dev.device_ids:
                    ref = PodRef(
                        namespace=pod.namespace,
                        pod=pod.name,
                        container=container.name,
                        resource=dev.resource_name,
                        replica=raw_id.partition("::")[2],
                    )
                    out.setdefault(strip_sharing_suffix(raw_id), {})[ref] = None
    return {device: tuple(refs) for device, refs in out.items()}


SliceSource = Callable[[], tuple[dra.SliceIndex | None, str]]
"""The current ResourceSlice index and, when it is None, one line on why (API unreadable)."""


class PodResourcesClient:
    """Asks the kubelet which containers hold which GPU/MIG devices.

    ``timeout`` is the deadline of one ``List`` call in seconds; ``max_message_bytes`` the largest
    response accepted. ``dra_drivers``: DRA drivers whose claimed devices are attributed (empty: DRA
    off, as dcgm-exporter without ``--kubernetes-enable-dra``); ``slices`` gives the ResourceSlice
    index (None: canonical device names only). The channel is opened on first use and reused; call
    :meth:`close` when done.
    """

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        resources: tuple[str, ...] = GPU_RESOURCES,
        dra_drivers: tuple[str, ...] = (dra.NVIDIA_DRIVER,),
        slices: SliceSource | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.dra_drivers = dra_drivers
        self.slices = slices
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes
        self.resources = resources
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    def _lister(self) -> api_pb2_grpc.PodResourcesListerStub:
        if self._stub is None:
            target = "unix://" + os.path.abspath(self.socket_path)
            self._channel = grpc.insecure_channel(
                target,
                options=[
                    ("grpc.max_receive_message_length", self.max_message_bytes),
                    ("grpc.enable_http_proxy", 0),
                ],
            )
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    def list_pod_resources(self) -> api_pb2.ListPodResourcesResponse:
        """The raw v1 ``List`` response; raises :class:`PodResourcesError`."""
        if not os.path.exists(self.socket_path):
            raise PodResourcesError(
                f"{self.socket_path}: kubelet pod-resources socket not found; mount "
                "/var/lib/kubelet/pod-resources into the pod or fix --pod-resources-socket"
            )
        try:
            response: api_pb2.ListPodResourcesResponse = self._lister().List(
                api_pb2.ListPodResourcesRequest(), timeout=self.timeout
            )
        except grpc.RpcError as exc:
            raise PodResourcesError(self._describe(exc)) from exc
        return response

    def allocations(self) -> Allocations:
        """Device id (GPU or MIG UUID, sharing suffix stripped) → containers holding it."""
        return allocations_from_response(self.list_pod_resources(), resources=self.resources)

    def attribution(self) -> dra.Attribution:
        """Device-plugin allocations plus the claimed devices (resolved later against the snapshot)."""
        response = self.list_pod_resources()
        devices = allocations_from_response(response, resources=self.resources)
        claims = dra.claims_from_response(response, drivers=self.dra_drivers) if self.dra_drivers else ()
        if not claims:
            return dra.Attribution(devices)
        index, note = self.slices() if self.slices is not None else (None, "ResourceSlices not watched")
        return dra.Attribution(devices, claims, slices=index, slices_note=note)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _describe(self, exc: grpc.RpcError) -> str:
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
        details = " ".join(str(details).split())
        where = f"{self.socket_path}: kubelet pod-resources List"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"{where} got no answer within {self.timeout:g} s (deadline exceeded)"
        if code == grpc.StatusCode.UNAVAILABLE:
            return f"{where} unavailable: {details}"
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return (
                f"{where} answer exceeds {self.max_message_bytes} bytes: {details}; "
                "raise the client's max_message_bytes"
            )
        name = code.name if code is not None else "error"
        return f"{where} failed: {name}: {details}"
