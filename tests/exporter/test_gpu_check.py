"""scripts/gpu-check: exposition and nvidia-smi parsing, tolerances, exit codes, read-only commands."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from exporter.attribute.visibility import ProcessVisibility
from exporter.expose.exposition import device_families
from exporter.expose.render import render_text
from exporter.nvml.backend import NvmlBackend
from tests.support.exporter import fake_nvml as fk

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check"


def load_script():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    loader.exec_module(module)
    return module


gc = load_script()


HOST_PID = ProcessVisibility(True, "host PID namespace")


def once_output(lib: fk.FakeNvml, visibility: ProcessVisibility = HOST_PID) -> str:
    """What `--once` prints for the fake NVML ``lib``, produced by the real backend code."""
    backend = NvmlBackend(library=lib, clock=lib.clock, sleep=lib.sleep, visibility=lambda: visibility)
    backend.open()
    try:
        snap = backend.read()
    finally:
        backend.close()
    return render_text(device_families(snap, hostname="gpu-node"))


@pytest.fixture(scope="module")
def exposition() -> str:
    """What `--once` prints for an H100 (MIG, GPM) and an L4."""
    return once_output(fk.FakeNvml([fk.h100_mig(0), fk.l4(1)]))


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


SMI_LIST = (
    f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {H100})\n"
    + "".join(
        f"  MIG {prof:<11} Device {n:>2}: (UUID: MIG-h100-0-gi{gi})\n"
        for n, (prof, gi) in enumerate(
            [("3g.40gb", 2), ("1g.10gb", 7), ("1g.10gb", 8), ("1g.10gb", 9), ("1g.10gb", 10)]
        )
    )
    + f"GPU 1: NVIDIA L4 (UUID: {L4})\n"
)
SMI_APPS = f"{H100}, 101\n{H100}, 102\n{H100}, 103\n{L4}, 201\n{L4}, 202\n"
SYS_ADMIN = f"{1 << 21:016x}"


class FakeRunner:
    def __init__(
        self,
        *,
        smi: str,
        once_stdout: str = "",
        once_rc: int = 0,
        once_stderr: str = "",
        smi_rc: int = 0,
        smi_list: str = SMI_LIST,
        smi_apps: str = SMI_APPS,
    ):
        self.smi, self.once_stdout, self.once_rc, self.once_stderr, self.smi_rc = (
            smi,
            once_stdout,
            once_rc,
            once_stderr,
            smi_rc,
        )
        self.smi_list, self.smi_apps = smi_list, smi_apps
        self.argvs: list[list[str]] = []

    def __call__(self, argv, **kwargs):
        self.argvs.append(list(argv))
        if "nvidia-smi" in argv[0]:
            out = {"-L": self.smi_list, "--query-compute-apps=gpu_uuid,pid": self.smi_apps}.get(
                argv[1], self.smi
            )
            return subprocess.CompletedProcess(argv, self.smi_rc, out, "")
        return subprocess.CompletedProcess(argv, self.once_rc, self.once_stdout, self.once_stderr)


def fake_proc(tmp_path: Path, *, cap_eff: str = SYS_ADMIN, nspid: str = "4242") -> Path:
    (tmp_path / "self").mkdir(parents=True, exist_ok=True)
    (tmp_path / "self" / "status").write_text(f"Name:\tpython\nCapEff:\t{cap_eff}\nNSpid:\t{nspid}\n")
    return tmp_path


def run_main(runner, which=lambda name: "/usr/bin/nvidia-smi", *, proc: Path | None = None, environ=None):
    lines: list[str] = []
    if proc is None:
        proc = fake_proc(Path(tempfile.mkdtemp()))
    rc = gc.main(
        [],
        run=runner,
        which=which,
        out=lines.append,
        proc=proc,
        environ={"NVIDIA_MIG_MONITOR_DEVICES": "all"} if environ is None else environ,
        euid=0,
    )
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
    last = text.splitlines()[-1]
    assert rc == 1 and "NVML init failed: Driver Not Loaded" in last and "Traceback" not in text


def test_no_gpu_exits_2_with_one_line():
    rc, text = run_main(FakeRunner(smi=""), which=lambda name: None)
    assert rc == 2 and "no NVIDIA GPU here" in text and "\n" not in text
    rc, text = run_main(FakeRunner(smi="", smi_rc=9))
    assert rc == 2 and "no NVIDIA GPU here" in text


def test_only_read_only_nvidia_smi_queries_are_run(exposition):
    runner = FakeRunner(smi=SMI_AGREE, once_stdout=exposition)
    run_main(runner)
    smi_calls = [a[1:] for a in runner.argvs if "nvidia-smi" in a[0]]
    assert len(smi_calls) == 4
    allowed = [list(q) for q in gc.READ_ONLY_QUERIES]
    assert all(call in allowed for call in smi_calls), smi_calls
    assert allowed == [
        ["--query-gpu=index,uuid,temperature.gpu,memory.used,power.draw", "--format=csv,noheader,nounits"],
        ["-L"],
        ["--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"],
    ]
    source = SCRIPT.read_text()
    for forbidden in ('"-mig"', '"-pm"', '"-r"', '"--gpu-reset"', '"-pl"', '"-ac"', '"-e"', '"-c"'):
        assert forbidden not in source


def test_environment_names_uid_capabilities_pid_namespace_and_versions(exposition, tmp_path):
    rc, text = run_main(FakeRunner(smi=SMI_AGREE, once_stdout=exposition), proc=fake_proc(tmp_path))
    assert rc == 0, text
    assert "effective uid 0; capabilities: CAP_SYS_ADMIN" in text
    assert "PID namespace: host" in text and "NVIDIA_MIG_MONITOR_DEVICES=all" in text
    assert "nvidia-ml-py " in text
    assert "MIG MIG-h100-0-gi2 on GPU-h100-0000-0000-0000-000000000000: 3g.40gb at slice 4 (size 4)" in text
    assert "processes on GPU-h100-0000-0000-0000-000000000000: exporter 3, nvidia-smi 3" in text
    prof = sum(1 for name, _, _ in gc.parse_exposition(exposition) if name.startswith("DCGM_FI_PROF_"))
    assert prof > 20 and f"profiling values: {prof} checked, 0 NaN or out of range" in text


def test_default_pod_without_privileges_is_told_what_is_not_checked(tmp_path):
    """The chart's default exporter pod (no CAP_SYS_ADMIN, no hostPID): unknown placements and
    withheld process counts are what it was granted, said as unchecked, not problems."""
    once = once_output(
        fk.FakeNvml([fk.h100_mig(0), fk.l4(1)], admin=False),
        ProcessVisibility(False, "own PID namespace (no hostPID)"),
    )
    proc = fake_proc(tmp_path, cap_eff="00000000a80425fb", nspid="4242\t17")
    rc, text = run_main(FakeRunner(smi=SMI_AGREE, once_stdout=once), proc=proc, environ={})
    assert rc == 0, text
    assert "at slice -1 (size 0)" in text, "the placements the pod cannot read are still listed"
    assert "capabilities: CAP_CHOWN, +" in text and "PID namespace: own (no hostPID)" in text
    assert "NVIDIA_MIG_MONITOR_DEVICES=(unset)" in text
    assert "not checked: MIG placements and the parent GPU's memory (no CAP_SYS_ADMIN" in text
    assert "not checked: process counts (own PID namespace: exporter.processes.enabled=false)" in text
    assert "placement unknown" not in text and "process counts withheld" not in text
    assert "PROBLEM: no CAP_SYS_ADMIN" not in text


def test_privileged_check_still_finds_unknown_placements_and_withheld_processes():
    once = 'gpupilot_exporter_process_visibility{Hostname="n",reason="own PID namespace (no hostPID)"} 0\n'
    d = gc.exporter_detail(once)
    _, problems = gc.detail_problems(d, {}, {}, [], admin=True, host_pid=True)
    assert "process counts withheld: own PID namespace (no hostPID)" in problems
    _, problems = gc.detail_problems(d, {}, {}, [], admin=True, host_pid=False)
    assert problems == []


def test_mig_uuids_placements_prof_and_processes_disagreeing(tmp_path):
    lib = fk.FakeNvml([fk.h100_mig(0), fk.l4(1)], admin=False)
    gpu = lib.gpus[0]
    gpu.migs[0].gpm = {1: float("nan"), 2: 70.0, 3: 50.0, 5: 45.0, 10: 60.0}
    text_once = once_output(lib)
    smi_list = SMI_LIST.replace("MIG-h100-0-gi10", "MIG-h100-0-gi11")
    runner = FakeRunner(smi=SMI_AGREE, once_stdout=text_once, smi_list=smi_list, smi_apps=f"{H100}, 101\n")
    rc, text = run_main(runner)
    assert rc == 1
    assert "PROBLEM: MIG device MIG-h100-0-gi11 (1g.10gb) is in nvidia-smi -L but not in the exporter" in text
    assert "PROBLEM: MIG device MIG-h100-0-gi10 is in the exporter but not in nvidia-smi -L" in text
    assert "PROBLEM: MIG MIG-h100-0-gi2: placement unknown" in text
    assert "PROBLEM: processes on GPU-h100-0000-0000-0000-000000000000: exporter 3 vs nvidia-smi 1" in text
    assert "0 NaN or out of range" in text, "NaN never reaches the exposition"
    assert "DISAGREE: GPM: activity on 4/5 MIG instances" in text, "the dropped NaN shows as missing activity"


def test_lost_gpus_errors_and_withheld_processes_are_reported():
    once = (
        'gpupilot_gpu_lost{gpu="1",UUID="GPU-x",pci_bus_id="0",Hostname="n",reason="GPU is lost (GPU is lost)"} 1\n'
        'gpupilot_exporter_collection_errors_total{kind="no_permission:memory_total"} 2\n'
        'gpupilot_exporter_process_visibility{Hostname="n",reason="own PID namespace (no hostPID)"} 0\n'
        'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-y",GPU_I_ID="3"} 1.7\n'
    )
    d = gc.exporter_detail(once)
    lines, problems = gc.detail_problems(d, {}, {}, ["GPU-y"])
    assert "lost GPU 1 GPU-x: GPU is lost (GPU is lost)" in problems
    assert "collection errors: no_permission:memory_total 2" in lines
    assert "process counts withheld: own PID namespace (no hostPID)" in problems
    assert "DCGM_FI_PROF_SM_ACTIVE on GPU-y/GI3 = 1.7" in problems


def test_capabilities_decode():
    assert gc.capabilities("0000000000000000") == "none"
    assert gc.capabilities(f"{1 << 21:x}") == "CAP_SYS_ADMIN"
    assert gc.capabilities("zz") == "unknown"
