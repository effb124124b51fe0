"""devkit.debpkg: Debian packages installed with no service started and none left enabled, after one
line saying what; GPUPILOT_NO_APT=1 installs nothing. apt-get, systemctl and update-rc.d are small
scripts on PATH that record how they were called (and whether policy-rc.d forbade starts then)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fakes(tmp_path: Path, *, systemd: bool, update_rc: bool, apt_rc: int = 0) -> tuple[Path, Path, Path]:
    bin_dir, root, log = tmp_path / "bin", tmp_path / "root", tmp_path / "calls.log"
    bin_dir.mkdir(parents=True)
    root.mkdir()
    policy = root / "usr" / "sbin" / "policy-rc.d"
    tools = {
        # shell builtins only: PATH holds nothing but these scripts
        "apt-get": (
            f'last=; if [ -f {policy} ]; then while read -r l; do last="$l"; done < {policy}; fi\n'
            f'echo "apt-get $* policy=$last" >> {log}; exit {apt_rc}'
        ),
        "systemctl": f'echo "systemctl $*" >> {log}',
    }
    if update_rc:
        tools["update-rc.d"] = f'echo "update-rc.d $*" >> {log}'
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    if systemd:
        (root / "run" / "systemd" / "system").mkdir(parents=True)
    return bin_dir, root, log


def run(bin_dir: Path, root: Path, *args: str, opt_out: bool = False) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; from pathlib import Path; from devkit import debpkg; "
        f"sys.exit(debpkg.install({list(args)!r}, services=['prometheus'], root=Path({str(root)!r})))"
    )
    env = {"PATH": str(bin_dir), **({"GPUPILOT_NO_APT": "1"} if opt_out else {})}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=False
    )


def test_systemd_install_starts_nothing_and_leaves_the_service_disabled(tmp_path: Path) -> None:
    bin_dir, root, log = fakes(tmp_path, systemd=True, update_rc=True)
    res = run(bin_dir, root, "prometheus")
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0].startswith("==> installing Debian packages prometheus (")
    assert log.read_text().splitlines() == [
        "apt-get update -qq policy=exit 101",
        "apt-get install -y -qq --no-install-recommends prometheus policy=exit 101",
        "systemctl disable --now --quiet prometheus",
    ]
    assert not (root / "usr" / "sbin" / "policy-rc.d").exists(), "our policy-rc.d is removed"


def test_without_systemd_the_start_links_go(tmp_path: Path) -> None:
    bin_dir, root, log = fakes(tmp_path, systemd=False, update_rc=True)
    assert run(bin_dir, root, "prometheus").returncode == 0
    assert log.read_text().splitlines()[-1] == "update-rc.d prometheus disable"
    bin_dir2, root2, _ = fakes(tmp_path / "bare", systemd=False, update_rc=False)
    (root2 / "etc" / "rc2.d").mkdir(parents=True)
    (root2 / "etc" / "rc2.d" / "S01prometheus").symlink_to("../init.d/prometheus")
    (root2 / "etc" / "rc2.d" / "S01other").symlink_to("../init.d/other")
    assert run(bin_dir2, root2, "prometheus").returncode == 0
    assert sorted(p.name for p in (root2 / "etc" / "rc2.d").iterdir()) == ["S01other"]


def test_opt_out_installs_nothing_and_says_what_to_run(tmp_path: Path) -> None:
    bin_dir, root, log = fakes(tmp_path, systemd=True, update_rc=True)
    res = run(bin_dir, root, "prometheus", opt_out=True)
    assert res.returncode == 1 and not log.exists()
    assert res.stderr.strip() == (
        "GPUPILOT_NO_APT=1: not installing prometheus; as root, run: apt-get update && "
        "apt-get install --no-install-recommends prometheus && systemctl disable --now prometheus"
    )


def test_a_policy_of_the_machines_own_is_kept_and_a_failure_is_one_line(tmp_path: Path) -> None:
    bin_dir, root, log = fakes(tmp_path, systemd=True, update_rc=True, apt_rc=100)
    policy = root / "usr" / "sbin" / "policy-rc.d"
    policy.parent.mkdir(parents=True)
    policy.write_text("#!/bin/sh\nexit 0\n")
    res = run(bin_dir, root, "prometheus")
    assert res.returncode == 1
    assert len(res.stderr.strip().splitlines()) == 1 and "apt-get install prometheus failed" in res.stderr
    assert policy.read_text() == "#!/bin/sh\nexit 0\n"
    assert "systemctl" not in log.read_text()
