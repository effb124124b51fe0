"""The console scripts on an install without their extra: each command, ``--help`` included, ends
with one line naming the extra to install and exit status 2, never a traceback; ``--version``
answers on any install; a module of gpupilot itself missing is not dressed up as a missing extra.

The missing modules are simulated in a fresh interpreter (``sys.modules[name] = None`` makes its
import fail as an absent one would); ``make extras`` checks the same on real installs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.entry import wants_simulator
from gpupilot_common import entrypoint
from gpupilot_common.cli import package_version

ROOT = Path(__file__).resolve().parents[2]
ENTRIES = {"exporter": "exporter.entry", "adapter": "adapter.entry", "rightsizer": "rightsizer.entry"}


def run_without(service: str, blocked: list[str], *args: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None\n"
        f"from {ENTRIES[service]} import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def expected(service: str, module: str, extras: str = "") -> str:
    extras = extras or service
    whose = " and the ".join(f"{e}'s" for e in extras.split(","))
    return (
        f"gpupilot-{service}: the {whose} dependencies are not installed (no module {module!r}); "
        f"install them with: pip install 'gpupilot[{extras}]'"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("service", "blocked", "args", "extras"),
    [
        ("adapter", ["orjson"], ["--help"], ""),
        (
            "adapter",
            ["orjson"],
            ["explain-hpa", "-f", "examples/hpa-llm-inference.yaml", "--state", "examples/hpa-state.yaml"],
            "",
        ),
        ("adapter", ["orjson"], [], ""),
        ("rightsizer", ["orjson"], ["plan", "--help"], ""),
        ("rightsizer", ["urllib3"], ["validate", "examples/mig-configs/seed-002-mig-parted-config.yaml"], ""),
        (
            "rightsizer",
            ["apscheduler"],
            ["serve", "--config", "examples/rightsizer-serve.yaml", "--check"],
            "",
        ),
        ("exporter", ["google"], ["--once"], ""),
        ("exporter", ["google"], ["--backend", "sim", "--once"], "exporter,simulator"),
        ("exporter", ["google"], ["backfill", "--help"], "exporter,simulator"),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(service, blocked, args, extras):
    res = run_without(service, blocked, *args)
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines() == [expected(service, blocked[0].split(".")[0], extras)]
    assert res.stdout == ""


@pytest.mark.slow
@pytest.mark.parametrize("service", sorted(ENTRIES))
def test_version_needs_no_extra(service):
    blocked = ["orjson", "google", "urllib3", "aiohttp", "numpy", "yaml", "grpc", "kubernetes"]
    res = run_without(service, blocked, "--version")
    assert (res.returncode, res.stdout, res.stderr) == (0, f"gpupilot-{service} {package_version()}\n", "")


@pytest.mark.slow
def test_a_missing_module_of_gpupilot_itself_is_not_called_an_extra():
    res = run_without("rightsizer", ["rightsizer.commands.validate"], "validate", "x.yaml")
    assert res.returncode == 1 and "Traceback" in res.stderr and "pip install" not in res.stderr


def test_the_line_names_every_extra_wanted():
    assert entrypoint.missing_extra_line("gpupilot-exporter", ("exporter", "simulator"), "numpy") == (
        expected("exporter", "numpy", "exporter,simulator")
    )


@pytest.mark.parametrize(
    ("args", "wanted"),
    [
        (["--backend", "sim", "--once"], True),
        (["--once", "--backend=sim"], True),
        (["backfill", "--days", "1"], True),
        (["cluster"], True),
        (["--backend", "nvml", "--once"], False),
        (["--scenario", "sim"], False),
        ([], False),
    ],
)
def test_which_invocations_need_the_simulator(args, wanted):
    assert wants_simulator(args) is wanted
