"""The exporter's settings: frozen dataclasses, parsed once from the command line (:mod:`exporter.commands.cli`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from exporter.contract.layout import SeriesLayout

DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")


@dataclass(frozen=True)
class CollectorSettings:
    interval: float = 10.0
    """Seconds between collections. 10 s matches common scrape intervals; each scrape is a lookup."""
    collect_timeout: float = 5.0
    """Seconds one backend read may take before the collection is abandoned (a hung NVML call);
    the last good snapshot keeps being served. Capped at ``interval`` when parsed."""
    backoff_initial: float = 1.0
    """Seconds before the first retry after the backend failed to start (NVML init)."""
    backoff_max: float = 60.0
    """Upper bound of the exponential backoff between start attempts, in seconds."""
    ready_intervals: float = 3.0
    """``/ready`` fails when the last good snapshot is older than this many intervals."""


@dataclass(frozen=True)
class ListenAddress:
    host: str = ""
    """Empty means every interface (``:9400``), as dcgm-exporter's ``--address``."""
    port: int = 9400

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Settings:
    backend: str = "nvml"
    """``nvml`` (real GPUs) or ``sim`` (the scenario simulator)."""
    scenario: Path | None = None
    """Scenario YAML for ``--backend sim``."""
    sim_node: str | None = None
    """Which node of the scenario this exporter plays (``--node``); the first one when omitted."""
    node_name: str = ""
    """Value of the ``Hostname`` label (``--node-name``, else ``$NODE_NAME``, else the host name)."""
    kubernetes: bool = False
    """Attribute devices to pods through kubelet's pod-resources API."""
    pod_resources_socket: Path = DEFAULT_POD_RESOURCES_SOCKET
    pod_resources_socket_given: bool = False
    """True when ``--pod-resources-socket`` was on the command line (then it wins over the simulator's
    own allocations in sim mode)."""
    enable_dra: bool = False
    """Attribute GPUs allocated through Dynamic Resource Allocation (``--kubernetes-enable-dra``, as
    dcgm-exporter's flag and ``$KUBERNETES_ENABLE_DRA``); device-plugin allocations are always read."""
    resource_names: tuple[str, ...] = ()
    """Device-plugin resources attributed besides ``nvidia.com/gpu``, ``nvidia.com/gpu.shared`` and
    ``nvidia.com/mig-*`` (``--nvidia-resource-names``, dcgm-exporter's ``NVIDIA_RESOURCE_NAMES``)."""
    kube_api_url: str = ""
    """Kubernetes API for the node's ResourceSlices (in a pod: from ``KUBERNETES_SERVICE_HOST``);
    empty: DRA devices are resolved by NVIDIA's canonical device names only."""
    web_config: Path | None = None
    """exporter-toolkit web config (TLS, basic auth); plain HTTP without it."""
    once: bool = False
    """One collection, exposition on stdout, exit."""
    log_level: str = "info"
    log_format: str = "text"
    """``text`` or ``json`` (:mod:`gpupilot_common.logs`)."""
    listen: ListenAddress = field(default_factory=ListenAddress)
    layout: SeriesLayout = field(default_factory=SeriesLayout)
    """Fields (``-f``/``--collectors``), MIG series layout and host label of the device series."""
    collector: CollectorSettings = field(default_factory=CollectorSettings)
