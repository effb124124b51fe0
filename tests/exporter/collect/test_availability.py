"""The start-up line on configured fields a GPU cannot give: profiling fields need NVML GPM (Hopper+),
so on an A100 they are absent; the exporter says which, on which GPUs and why, once."""

from __future__ import annotations

import dataclasses
import logging

from exporter.collect.availability import missing_fields_line
from exporter.collect.collector import Collector
from exporter.contract.fields import GPM_ONLY
from exporter.nvml.gpm import RATIO_METRICS
from exporter.settings import CollectorSettings
from exporter.snapshot import GpuSnapshot, NodeSnapshot
from tests.support.exporter import fakes


def a100(index: int) -> GpuSnapshot:
    gpu = fakes.whole_gpu(index)
    info = dataclasses.replace(gpu.info, model_name="NVIDIA A100-SXM4-80GB", gpm_supported=False)
    return dataclasses.replace(gpu, info=info)


def test_gpm_only_fields_are_the_gpm_ratio_metrics():
    assert {dcgm for _, dcgm in RATIO_METRICS} == GPM_ONLY


def test_one_line_names_the_skipped_fields_the_gpus_and_why():
    snap = NodeSnapshot(taken_at=1.0, gpus=(a100(0), a100(1), a100(2), a100(5), fakes.whole_gpu(6)))
    line = missing_fields_line(
        [
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_PROF_SM_ACTIVE",
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "DCGM_FI_PROF_PCIE_TX_BYTES",
        ],
        snap,
    )
    assert line.startswith(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, DCGM_FI_PROF_SM_ACTIVE cannot be collected on GPU 0-2,5 "
        "(NVIDIA A100-SXM4-80GB): these profiling fields come from NVML GPM here, which needs a Hopper"
    )
    assert "\n" not in line
    assert missing_fields_line(["DCGM_FI_PROF_SM_ACTIVE"], NodeSnapshot(1.0, (fakes.whole_gpu(0),))) == ""
    assert missing_fields_line(["DCGM_FI_DEV_GPU_UTIL"], snap) == ""


def test_the_collector_warns_once_at_start_up(caplog):
    snap = NodeSnapshot(taken_at=1.0, gpus=(a100(0),))
    c = Collector(fakes.FakeBackend(snap), hostname="n", settings=CollectorSettings(interval=1.0))
    try:
        with caplog.at_level(logging.WARNING, logger="exporter.collect.collector"):
            assert c.collect_once() and c.collect_once()
    finally:
        c.stop()
    said = [r.getMessage() for r in caplog.records if "cannot be collected" in r.getMessage()]
    assert len(said) == 1
    # the default set: dcgm-exporter's GR_ENGINE_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE and the extras
    for name in (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE",
    ):
        assert name in said[0]
