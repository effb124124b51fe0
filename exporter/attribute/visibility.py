"""Can this process see other containers' GPU processes? The PID-namespace check.

NVML's process lists (``nvmlDeviceGetComputeRunningProcesses``) only name processes the caller's
PID namespace can see: in a pod without ``hostPID: true`` every other pod's CUDA process is
filtered out and a busy GPU reads "0 processes". ``NSpid`` in ``/proc/self/status`` (Linux ≥ 4.1)
lists this process's PID in each nested PID namespace, outermost first: one entry means the
process lives in the root (host) PID namespace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ProcessVisibility:
    visible: bool
    reason: str
    """One short line: why (for the ``reason`` label and ``scripts/gpu-check``)."""


def process_visibility(proc: Path = Path("/proc")) -> ProcessVisibility:
    """Visible only when this process is provably in the host's PID namespace."""
    try:
        status = (proc / "self" / "status").read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        return ProcessVisibility(False, f"cannot read {proc}/self/status ({exc.strerror or exc})")
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            depth = len(line.split()[1:])
            if depth == 1:
                return ProcessVisibility(True, "host PID namespace")
            return ProcessVisibility(
                False, "own PID namespace (no hostPID): NVML hides other containers' processes"
            )
    return ProcessVisibility(False, "kernel without NSpid (before 4.1): PID namespace unknown")
