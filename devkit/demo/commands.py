"""Running the project's own command-line tools from the demo, as a user would type them."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from devkit.demo.console import StepFailed

TOOLS = {"gpupilot-exporter": "exporter", "gpupilot-adapter": "adapter", "gpupilot-rightsizer": "rightsizer"}


@dataclass(frozen=True)
class Result:
    shown: str
    """The command line as a user would type it (console-script name, repo-relative paths)."""
    stdout: str
    stderr: str
    code: int


def argv(tool: str, *args: str) -> list[str]:
    """``gpupilot-x …`` run as ``<this python> -m x …`` so the demo's own venv is always used."""
    return [sys.executable, "-m", TOOLS[tool], *args]


def shown(tool: str, args: Sequence[str], *, root: Path) -> str:
    def rel(a: str) -> str:
        try:
            return str(Path(a).relative_to(root)) if a.startswith(str(root)) else a
        except ValueError:
            return a

    return shlex.join([tool, *(rel(a) for a in args)])


def run(
    tool: str, args: Sequence[str], *, root: Path, timeout: float = 120.0, ok_codes: Sequence[int] = (0,)
) -> Result:
    line = shown(tool, args, root=root)
    try:
        proc = subprocess.run(
            argv(tool, *args), capture_output=True, text=True, timeout=timeout, check=False, cwd=root
        )
    except subprocess.TimeoutExpired as err:
        raise StepFailed(f"'{line}' did not finish within {timeout:.0f}s") from err
    if proc.returncode not in ok_codes:
        text = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        reason = text[-1] if text else f"exit status {proc.returncode}"
        if "No module named" in reason or "invalid choice" in reason:
            reason = f"not available in this checkout yet ({reason})"
        raise StepFailed(f"'{line}' failed: {reason}")
    return Result(line, proc.stdout, proc.stderr, proc.returncode)


def kubectl(args: Sequence[str], *, kubeconfig: Path, timeout: float = 30.0) -> Result:
    cmd = ["kubectl", f"--kubeconfig={kubeconfig}", *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as err:
        raise StepFailed("kubectl is not on PATH: install it to see the raw custom.metrics answer") from err
    except subprocess.TimeoutExpired as err:
        raise StepFailed(f"kubectl {' '.join(args)} did not answer within {timeout:.0f}s") from err
    line = shlex.join(["kubectl", *args])
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise StepFailed(f"'{line}' failed: {reason}")
    return Result(line, proc.stdout, proc.stderr, proc.returncode)
