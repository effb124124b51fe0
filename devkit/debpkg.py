"""Debian packages the Makefile needs, installed so the machine is left as it was found.

``python3 -m devkit.debpkg [--service NAME]... PACKAGE...`` (stdlib only: it runs before the venv):

- says first, in one line, what it will install and how to do it yourself instead;
- with ``GPUPILOT_NO_APT=1`` installs nothing: prints the commands to run and exits 1;
- installs with a ``policy-rc.d`` that forbids starting services (only when the machine has none of
  its own; it is removed afterwards), so a package's daemon never starts;
- then leaves each ``--service`` disabled and stopped: ``systemctl disable --now`` where systemd
  runs, else ``update-rc.d NAME disable``, else its ``/etc/rc?.d/S*`` links removed.

Debian's ``prometheus`` and ``victoria-metrics`` would otherwise listen, unauthenticated, on
0.0.0.0:9090 and :8428 after every boot. The tests start their own servers on loopback ports.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

OPT_OUT = "GPUPILOT_NO_APT"
POLICY = "#!/bin/sh\n# gpupilot (devkit.debpkg): no service starts while it installs packages\nexit 101\n"


def _commands(packages: Sequence[str], services: Sequence[str]) -> str:
    text = f"apt-get update && apt-get install --no-install-recommends {' '.join(packages)}"
    if services:
        text += f" && systemctl disable --now {' '.join(services)}"
    return text


def disable(service: str, *, root: Path) -> str:
    """Leave ``service`` disabled and stopped; returns how."""
    if (root / "run" / "systemd" / "system").is_dir() and shutil.which("systemctl"):
        subprocess.run(["systemctl", "disable", "--now", "--quiet", service], check=False)
        return "systemctl disable --now"
    if shutil.which("update-rc.d"):
        subprocess.run(["update-rc.d", service, "disable"], check=False, capture_output=True)
        return "update-rc.d disable"
    for link in sorted(root.glob(f"etc/rc?.d/S??{service}")):
        link.unlink()
    return "rc.d start links removed"


def _apt(args: list[str], env: dict[str, str]) -> bool:
    return subprocess.run(["apt-get", *args], check=False, env=env, stdout=subprocess.DEVNULL).returncode == 0


def install(packages: Sequence[str], *, services: Sequence[str], root: Path = Path("/")) -> int:
    todo = _commands(packages, services)
    if os.environ.get(OPT_OUT) == "1":
        print(f"{OPT_OUT}=1: not installing {' '.join(packages)}; as root, run: {todo}", file=sys.stderr)
        return 1
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        print(f"error: {' '.join(packages)} needed; as root on Debian/Ubuntu, run: {todo}", file=sys.stderr)
        return 1
    print(
        f"==> installing Debian packages {' '.join(packages)} (apt-get update, apt-get install); "
        f"services left disabled and stopped: {' '.join(services) or 'none'}; {OPT_OUT}=1 to do it yourself"
    )
    policy = root / "usr" / "sbin" / "policy-rc.d"
    ours = not policy.exists()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        if ours:
            policy.parent.mkdir(parents=True, exist_ok=True)
            policy.write_text(POLICY)
            policy.chmod(0o755)
        ok = _apt(["update", "-qq"], env) and _apt(
            ["install", "-y", "-qq", "--no-install-recommends", *packages], env
        )
    finally:
        if ours:
            policy.unlink(missing_ok=True)
    if not ok:
        print(
            f"error: apt-get install {' '.join(packages)} failed; install by hand ({todo}) and rerun",
            file=sys.stderr,
        )
        return 1
    for service in services:
        print(f"==> {service}: {disable(service, root=root)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m devkit.debpkg", description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="+", help="Debian packages to install")
    parser.add_argument(
        "--service",
        action="append",
        default=[],
        help="a service the packages bring: left disabled and stopped",
    )
    args = parser.parse_args(argv)
    return install(args.packages, services=args.service)


if __name__ == "__main__":
    raise SystemExit(main())
