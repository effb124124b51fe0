"""scripts/gpu-check: exposition and nvidia-smi parsing, tolerances, exit codes, read-only commands."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.exposition import device_families
from exporter.nvml import NvmlBackend
from exporter.render import render_text
from exporter.visibility import ProcessVisibility
from tests.exporter import fake_nvml as fk

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check"


def load_script():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


gc = load_script()


@pytest.fixture(scope="module")
def exposition() -> str:
    """What `--once` prints for an H100 (MIG, GPM) and an L4, produced by the real backend code."""
    lib = fk.FakeNvml([fk.h100_mig(0), fk.l4(1)])
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
    return render_text(device_families(snap, hostname="gpu-node"))


H100 = "GPU-h100-0000-0000-0000-000000000000"
L4 = "GPU-l4-0001-0000-0000-000000000000"
SMI_AGREE = f"0, {H100}, 41, 35100, 262.40\n1, {L4}, 40, 6010, [N/A]\n"


def test_script_is_executable():
    assert SCRIPT.stat().st_mode & 0o111


def test_parses_the_exporters_exposition(exposition):
    gpus = gc.exporter_gpus(exposition)
    h100, l4 = gpus[H100], gpus[L4]
    assert (h100.mig_mode, h100.gpm, h100.instances, h100.instances_with_activity) == (
        "enabled",
        "supported",
        5,
        5,
    )
    assert h100.temperature == 40 and h100.power == 250
    assert h100.memory_used == 30000 + 5000 + 3 * 13, "MIG GPU: the instances' framebuffer summed"
    assert (l4.mig_mode, l4.gpm, l4.memory_used, l4.power) == ("disabled", "unsupported", 6000, 41.5)


def test_parses_nvidia_smi_with_not_available_values():
    (a, b) = gc.parse_nvidia_smi(SMI_AGREE + "garbage line\n")
    assert (a.index, a.uuid, a.temperature, a.memory_used, a.power) == ("0", H100, 41, 35100, 262.4)
    assert b.power is None


def test_tolerances():
    assert gc.within(40, 43, fraction=0, absolute=3) is True
    assert gc.within(40, 44, fraction=0, absolute=3) is False
    assert gc.within(70000, 71300, fraction=0.02, absolute=64) is True  # 2 % of 71300 = 1426
    assert gc.within(100, 170, fraction=0.02, absolute=64) is False
    assert gc.within(250, 285, fraction=0.15, absolute=15) is True
    assert gc.within(50, 70, fraction=0.15, absolute=15) is False
    assert gc.within(None, 70, fraction=0.15, absolute=15) is None


class FakeRunner:
    def __init__(
        self, *, smi: str, once_stdout: str = "", once_rc: int = 0, once_stderr: str = "", smi_rc: int = 0
    ):
        self.smi, self.once_stdout, self.once_rc, self.once_stderr, self.smi_rc = (
            smi,
            once_stdout,
            once_rc,
            once_stderr,
            smi_rc,
        )
        self.argvs: list[list[str]] = []

    def __call__(self, argv, **kwargs):
        self.argvs.append(list(argv))
        if "nvidia-smi" in argv[0]:
            return subprocess.CompletedProcess(argv, self.smi_rc, self.smi, "")
        return subprocess.CompletedProcess(argv, self.once_rc, self.once_stdout, self.once_stderr)


def run_main(runner, which=lambda name: "/usr/bin/nvidia-smi"):
    lines: list[str] = []
    rc = gc.main([], run=runner, which=which, out=lines.append)
    return rc, "\n".join(lines)


def test_agreement_exits_0_and_prints_a_table(exposition):
    runner = FakeRunner(smi=SMI_AGREE, once_stdout=exposition)
    rc, text = run_main(runner)
    assert rc == 0, text
    assert "2 GPU(s), driver 570.124.06" in text
    assert "enabled (5 inst.)" in text and "supported" in text and "OK" in text
    once = [a for a in runner.argvs if "nvidia-smi" not in a[0]]
    assert once and once[0][1:] == ["-m", "exporter", "--backend", "nvml", "--once"]


def test_disagreement_exits_1_naming_the_value(exposition):
    runner = FakeRunner(smi=f"0, {H100}, 41, 40000, 400.0\n1, {L4}, 60, 6010, 40\n", once_stdout=exposition)
    rc, text = run_main(runner)
    assert rc == 1
    assert "power: exporter 250 vs nvidia-smi 400" in text
    assert "temperature: exporter 40 vs nvidia-smi 60" in text
    assert "FAILED" in text


def test_gpu_missing_from_exporter_is_a_disagreement(exposition):
    other = "GPU-ffff-0000-0000-0000-000000000000"
    runner = FakeRunner(smi=SMI_AGREE + f"2, {other}, 30, 0, 60\n", once_stdout=exposition)
    rc, text = run_main(runner)
    assert rc == 1 and "missing from the exporter" in text


def test_once_failure_exits_1_with_its_last_line():
    runner = FakeRunner(
        smi=SMI_AGREE,
        once_rc=1,
        once_stderr="Traceback…\ngpupilot-exporter: NVML init failed: Driver Not Loaded\n",
    )
    rc, text = run_main(runner)
    assert rc == 1 and "NVML init failed: Driver Not Loaded" in text and text.count("\n") == 0


def test_no_gpu_exits_2_with_one_line():
    rc, text = run_main(FakeRunner(smi=""), which=lambda name: None)
    assert rc == 2 and "no NVIDIA GPU here" in text and "\n" not in text
    rc, text = run_main(FakeRunner(smi="", smi_rc=9))
    assert rc == 2 and "no NVIDIA GPU here" in text


def test_only_read_only_nvidia_smi_queries_are_run(exposition):
    runner = FakeRunner(smi=SMI_AGREE, once_stdout=exposition)
    run_main(runner)
    smi_calls = [a for a in runner.argvs if "nvidia-smi" in a[0]]
    assert len(smi_calls) == 2
    for argv in smi_calls:
        assert argv[1:] == [
            "--query-gpu=index,uuid,temperature.gpu,memory.used,power.draw",
            "--format=csv,noheader,nounits",
        ]
    source = SCRIPT.read_text()
    for forbidden in ('"-mig"', '"-pm"', '"-r"', '"--gpu-reset"', '"-pl"', '"-ac"', '"-e"', '"-c"'):
        assert forbidden not in source
