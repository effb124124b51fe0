"""``--mig-series``: per-gpu (ours) vs per-instance (dcgm-exporter's layout), NVIDIA's dashboard panels
on MIG nodes through a real Prometheus, and the documented join from GPU-level series to pods."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devkit.prometheus import PrometheusServer, ScrapeJob
from exporter.collect.collector import Collector
from exporter.commands import cli
from exporter.contract.layout import SeriesLayout
from exporter.expose.exposition import Family, device_families
from exporter.serve.server import MetricsServer
from exporter.settings import CollectorSettings
from exporter.snapshot import PodRef
from simulator import scenario as scenario_mod
from simulator.backend import SimBackend
from tests.support.exporter import fakes
from tests.support.promquery import instant

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "examples" / "fleet-demo.yaml"
PER_INSTANCE = SeriesLayout(mig_series="per-instance")

# NVIDIA's Grafana dashboard for dcgm-exporter: its per-node panels, with "All" selected for both
# variables ($instance, $gpu).
NVIDIA_PANELS = {
    "GPU Temperature": 'DCGM_FI_DEV_GPU_TEMP{instance=~".*", gpu=~".*"}',
    "GPU Avg. Temp": 'avg(DCGM_FI_DEV_GPU_TEMP{instance=~".*", gpu=~".*"})',
    "GPU Power Usage": 'DCGM_FI_DEV_POWER_USAGE{instance=~".*", gpu=~".*"}',
    "GPU Power Total": 'sum(DCGM_FI_DEV_POWER_USAGE{instance=~".*", gpu=~".*"})',
    "GPU SM Clocks": 'DCGM_FI_DEV_SM_CLOCK{instance=~".*", gpu=~".*"} * 1000000',
    "GPU Framebuffer Mem Used": 'DCGM_FI_DEV_FB_USED{instance=~".*", gpu=~".*"}',
    "Tensor Core Utilization": 'avg by (instance, gpu) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~".*", gpu=~".*"})',
}


def by_name(fams: list[Family]) -> dict[str, Family]:
    return {f.name: f for f in fams}


def test_per_instance_repeats_gpu_fields_on_every_instance_with_its_pods() -> None:
    snap = fakes.node(fakes.mig_gpu(0, 3))
    holder = PodRef("batch", "etl-1", "worker", "nvidia.com/mig-1g.10gb")
    allocations = {snap.gpus[0].instances[1].uuid: (holder,)}
    fams = by_name(device_families(snap, hostname="n", allocations=allocations, layout=PER_INSTANCE))
    power = [dict(labels) for labels, _ in fams["DCGM_FI_DEV_POWER_USAGE"].samples]
    assert [(p["GPU_I_PROFILE"], p["GPU_I_ID"], p.get("pod")) for p in power] == [
        ("1g.10gb", "9", None),
        ("1g.10gb", "10", "etl-1"),
        ("1g.10gb", "11", None),
    ]
    assert {v for _, v in fams["DCGM_FI_DEV_POWER_USAGE"].samples} == {312.5}  # the GPU's value
    assert power[1]["UUID"] == fakes.gpu_info(0).uuid  # the physical GPU's UUID, as dcgm-exporter
    assert len(fams["DCGM_FI_DEV_FB_USED"].samples) == 3
    assert "DCGM_FI_DEV_GPU_UTIL" not in fams  # NVML has none on MIG; dcgm-exporter neither


def test_per_gpu_default_publishes_gpu_fields_once_and_sums_are_right() -> None:
    snap = fakes.node(fakes.mig_gpu(0, 3))
    per_gpu = by_name(device_families(snap, hostname="n"))
    per_inst = by_name(device_families(snap, hostname="n", layout=PER_INSTANCE))
    assert sum(v for _, v in per_gpu["DCGM_FI_DEV_POWER_USAGE"].samples) == 312.5
    assert sum(v for _, v in per_inst["DCGM_FI_DEV_POWER_USAGE"].samples) == 3 * 312.5
    # device-level series are identical in both modes
    assert per_gpu["DCGM_FI_DEV_FB_USED"].samples == per_inst["DCGM_FI_DEV_FB_USED"].samples


def test_mig_gpu_without_instances_keeps_its_gpu_fields_in_per_instance_mode() -> None:
    fams = by_name(device_families(fakes.node(fakes.mig_gpu(0, 0)), hostname="n", layout=PER_INSTANCE))
    ((labels, value),) = fams["DCGM_FI_DEV_POWER_USAGE"].samples
    assert value == 312.5 and "GPU_I_ID" not in dict(labels)


def test_whole_gpus_look_the_same_in_both_modes() -> None:
    snap = fakes.node(fakes.whole_gpu(0))
    assert device_families(snap, hostname="n") == device_families(snap, hostname="n", layout=PER_INSTANCE)


def test_flag_parses() -> None:
    assert (
        cli.parse_settings(["--mig-series", "per-instance"], environ={}).layout.mig_series == "per-instance"
    )
    assert cli.parse_settings([], environ={}).layout.mig_series == "per-gpu"


@pytest.fixture(scope="module")
def mig_series_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    """gpu-h100-b and gpu-a100-a (all MIG) in per-instance mode, gpu-h100-a in per-gpu mode."""
    scenario = scenario_mod.load(SCENARIO)
    frozen = scenario.epoch + 15 * 3600
    servers: list[MetricsServer] = []
    collectors: list[Collector] = []
    targets: dict[str, list[str]] = {}
    for node, mode in (
        ("gpu-h100-b", "per-instance"),
        ("gpu-a100-a", "per-instance"),
        ("gpu-h100-a", "per-gpu"),
    ):
        backend = SimBackend(scenario, node=node, clock=lambda: frozen)
        collector = Collector(
            backend,
            hostname=node,
            settings=CollectorSettings(interval=1.0, collect_timeout=1.0),
            allocations=backend.allocations,
            layout=SeriesLayout(mig_series=mode),  # type: ignore[arg-type]
        )
        collector.collect_once()
        server = MetricsServer(collector, host="127.0.0.1", port=0)
        server.start()
        servers.append(server)
        collectors.append(collector)
        targets.setdefault(mode, []).append(f"127.0.0.1:{server.port}")
    jobs = [ScrapeJob(name=mode, targets=t, interval="1s") for mode, t in targets.items()]
    try:
        with PrometheusServer(
            tmp_path_factory.mktemp("prom") / "data", scrape_jobs=jobs, scrape_interval="1s"
        ) as p:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(instant(p.url, "up == 1")) < 3:
                time.sleep(0.3)
            yield p
    finally:
        for server in servers:
            server.stop()
        for collector in collectors:
            collector.stop()


def labels(series: dict[str, object]) -> dict[str, str]:
    metric = series["metric"]
    assert isinstance(metric, dict)
    return {str(k): str(v) for k, v in metric.items()}


@pytest.mark.prometheus
def test_nvidia_dashboard_panels_answer_for_mig_nodes_in_per_instance_mode(
    mig_series_prom: PrometheusServer,
) -> None:
    for title, promql in NVIDIA_PANELS.items():
        only_instance_mode = promql.replace('instance=~".*"', 'job="per-instance"')
        assert instant(mig_series_prom.url, only_instance_mode), f"panel {title!r} has no data"
    # the all-MIG A100 node: one temperature series per instance (2 GPUs × 2 × 3g.20gb), as upstream
    temps = instant(mig_series_prom.url, 'DCGM_FI_DEV_GPU_TEMP{Hostname="gpu-a100-a"}')
    assert len(temps) == 4
    assert {labels(t)["GPU_I_PROFILE"] for t in temps} == {"3g.20gb"}
    # MIG instances held by pods carry them on GPU-level series too (dcgm-exporter's layout)
    held = instant(
        mig_series_prom.url, 'DCGM_FI_DEV_POWER_USAGE{Hostname="gpu-h100-b", GPU_I_ID!="", pod!=""}'
    )
    assert len(held) >= 4
    # gpupilot's own rules and dashboards take max by GPU first, so they stay right in this mode:
    # one power series per physical GPU (gpu-h100-b: 3, gpu-a100-a: 2)
    fleet_power = 'max by (Hostname, UUID) (DCGM_FI_DEV_POWER_USAGE{job="per-instance"})'
    assert len(instant(mig_series_prom.url, fleet_power)) == 5


@pytest.mark.prometheus
def test_gpu_level_series_reach_the_pods_of_a_mig_gpu_in_per_gpu_mode(
    mig_series_prom: PrometheusServer,
) -> None:
    # the README's join: a MIG GPU's power, once per pod holding one of its instances
    join = (
        'DCGM_FI_DEV_POWER_USAGE{job="per-gpu"} * on (Hostname, UUID) group_right () '
        'gpupilot_device_pod_info{job="per-gpu", GPU_I_ID!=""}'
    )
    result = instant(mig_series_prom.url, join)
    assert result
    power = {
        labels(s)["UUID"]: float(s["value"][1])
        for s in instant(mig_series_prom.url, 'DCGM_FI_DEV_POWER_USAGE{job="per-gpu"}')
    }
    for series in result:
        lb = labels(series)
        assert lb["pod"] and lb["GPU_I_ID"]
        assert float(series["value"][1]) == power[lb["UUID"]]
    # power once per physical GPU there: the node's sum is the sum over its 4 GPUs
    assert len(instant(mig_series_prom.url, 'DCGM_FI_DEV_POWER_USAGE{job="per-gpu"}')) == 4
