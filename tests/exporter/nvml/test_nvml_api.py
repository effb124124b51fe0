"""The NVML backend's calls exist in the installed nvidia-ml-py, and the fake NVML matches it."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pynvml
import pytest

from exporter.nvml import gpm as nvml_gpm
from tests.support.exporter import fake_nvml

ROOT = Path(__file__).resolve().parents[3]
BACKEND_MODULES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "exporter" / "nvml").glob("*.py"))


def names_used_on_the_library() -> set[str]:
    used: set[str] = set()
    for rel in BACKEND_MODULES:
        used |= set(re.findall(r"\blib\.(\w+)", (ROOT / rel).read_text()))
    return used


def test_backend_uses_a_real_set_of_calls():
    assert len(BACKEND_MODULES) >= 5
    used = names_used_on_the_library()
    # A sanity floor: if the regex stopped matching, the next test would pass vacuously.
    assert {"nvmlInit", "nvmlGpmMigSampleGet", "nvmlDeviceGetMigDeviceHandleByIndex", "NVMLError"} <= used
    assert len(used) > 60


@pytest.mark.parametrize("name", sorted(names_used_on_the_library()))
def test_every_function_and_constant_exists_in_nvidia_ml_py(name):
    assert hasattr(pynvml, name), f"pynvml has no {name}"


@pytest.mark.parametrize("name", [m for m, _ in nvml_gpm.RATIO_METRICS + nvml_gpm.RATE_METRICS])
def test_gpm_metric_constants_exist_with_dcgm_ids(name):
    expected = {
        "NVML_GPM_METRIC_GRAPHICS_UTIL": 1,
        "NVML_GPM_METRIC_SM_UTIL": 2,
        "NVML_GPM_METRIC_SM_OCCUPANCY": 3,
        "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5,
        "NVML_GPM_METRIC_DRAM_BW_UTIL": 10,
        "NVML_GPM_METRIC_FP64_UTIL": 11,
        "NVML_GPM_METRIC_FP32_UTIL": 12,
        "NVML_GPM_METRIC_FP16_UTIL": 13,
        "NVML_GPM_METRIC_PCIE_TX_PER_SEC": 20,
        "NVML_GPM_METRIC_PCIE_RX_PER_SEC": 21,
    }
    assert getattr(pynvml, name) == expected[name]


def test_fake_constants_have_the_real_values():
    fake_constants = {
        n: v for n, v in vars(fake_nvml).items() if n.startswith(("NVML_", "nvmlMemory_v", "nvmlEventType"))
    }
    assert len(fake_constants) > 40
    wrong = {
        n: (v, getattr(pynvml, n, None)) for n, v in fake_constants.items() if getattr(pynvml, n, None) != v
    }
    assert wrong == {}


def test_fake_functions_have_the_real_names_and_parameters():
    fake_functions = {
        n: f for n, f in vars(fake_nvml.FakeNvml).items() if n.startswith("nvml") and callable(f)
    }
    assert len(fake_functions) > 40
    for name, fn in fake_functions.items():
        real = getattr(pynvml, name, None)
        assert real is not None, f"pynvml has no {name}"
        fake_params = list(inspect.signature(fn).parameters)[1:]  # drop self
        real_params = list(inspect.signature(real).parameters)
        assert fake_params == real_params, f"{name}: fake {fake_params} vs real {real_params}"


def test_real_gpm_request_structure_has_the_fields_the_backend_sets():
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 2
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    assert request.metrics[0].metricId == 1 and hasattr(request.metrics[0], "nvmlReturn")
    assert {"sample1", "sample2"} <= {f[0] for f in pynvml.c_nvmlGpmMetricsGet_t._fields_}


def test_real_errors_carry_the_codes_the_backend_compares():
    err = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert err.value == 15 and isinstance(err, pynvml.NVMLError)
    assert isinstance(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED), pynvml.NVMLError_NotSupported)
