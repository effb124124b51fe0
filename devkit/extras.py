"""``make extras``: each extra installed as users install it, then every command run for real.

For each install of :data:`devkit.walk.CALLS` (no extra; ``exporter``; ``exporter,simulator``;
``adapter``; ``rightsizer``): a fresh venv (``uv venv``) and ``gpupilot[EXTRA]`` from a wheel of
this checkout (not editable: what ``pip install`` gives, the checkout's own modules out of reach),
then the install's calls (:mod:`devkit.walk`) with the venv's ``bin`` first on ``PATH``, from a
scratch folder. A real Prometheus over a day of the demo fleet's history answers the calls that
need one. One line per call and per install; exit 1 when a call did something else than expected.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from devkit import walk
from devkit.prometheus import PrometheusServer

ROOT = walk.ROOT
UV = Path(sys.executable).with_name("uv")


class ExtrasError(RuntimeError):
    pass


def _run(step: str, cmd: Sequence[str], **kw: object) -> None:
    res = subprocess.run(list(cmd), capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    if res.returncode != 0:
        last = ((res.stdout or "") + (res.stderr or "")).strip().splitlines()[-1:] or ["(no output)"]
        raise ExtrasError(f"{step}: {' '.join(cmd[:3])} … exit {res.returncode}: {last[0]}")


def source_tree(into: Path) -> Path:
    """The checkout's files (tracked, and new ones git does not ignore) copied, so the wheel is built
    away from the working tree (no build/ or egg-info beside other builds)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, (n.decode() for n in listed)):
        source = ROOT / name
        if source.is_file() and not name.startswith("dist/"):
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def build_wheel(work: Path) -> Path:
    source = source_tree(work / "source")
    out = work / "wheel"
    _run("wheel (uv build)", [str(UV), "build", "--quiet", "--wheel", "--out-dir", str(out), str(source)])
    wheels = sorted(out.glob("gpupilot-*.whl"))
    if not wheels:
        raise ExtrasError(f"wheel: nothing in {out}")
    return wheels[-1]


def make_venv(install: str, wheel: Path, venvs: Path) -> Path:
    """A fresh venv with ``gpupilot[install]`` (``base``: no extra) from ``wheel``."""
    venv = venvs / install.replace(",", "+")
    if venv.exists():
        shutil.rmtree(venv)
    _run(f"{install} (uv venv)", [str(UV), "venv", "--quiet", "--python", sys.executable, str(venv)])
    requirement = str(wheel) if install == "base" else f"{wheel}[{install}]"
    _run(
        f"{install} (uv pip install)",
        [str(UV), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), requirement],
    )
    return venv


def venv_env(venv: Path, work: Path) -> dict[str, str]:
    """The venv first on PATH; nothing that would reach the checkout's modules (PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["MPLCONFIGDIR"] = str(work / "matplotlib")
    return env


def walk_venv(install: str, venv: Path, work: Path, prom: str) -> list[walk.Outcome]:
    place = walk.Place(work=str(work), prom=prom)
    env = venv_env(venv, work)

    def wrap(argv: Sequence[str]) -> list[str]:
        # the venv's own script, by path: what a user's PATH would find after activating it
        return [str(venv / "bin" / argv[0]), *argv[1:]] if argv[0].startswith("gpupilot-") else list(argv)

    cwd = Path.cwd()
    os.chdir(work)  # not the checkout: its packages must not shadow the installed ones
    try:
        return [walk.run_call(c, place, wrap=wrap, env=env, host_work=work) for c in walk.CALLS[install]]
    finally:
        os.chdir(cwd)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.extras", description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=list(walk.CALLS), help="walk only this install")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (printed)")
    args = parser.parse_args(argv)
    if not UV.is_file():
        print(f"error: {UV} not found: run 'make venv' (it installs uv)", file=sys.stderr)
        return 2
    installs = args.only or list(walk.CALLS)
    work = Path(tempfile.mkdtemp(prefix="gpupilot-extras-"))
    started = time.monotonic()
    rows: list[tuple[str, walk.Outcome]] = []
    times: list[str] = []
    server: PrometheusServer | None = None
    try:
        wheel = build_wheel(work)
        walk.prepare(work / "walk")
        if any(c.prometheus for i in installs for c in walk.CALLS[i]):
            data = walk.history(work / "history", python=sys.executable)
            server = PrometheusServer(data, log_file=work / "prometheus.log").start()
        for install in installs:
            t0 = time.monotonic()
            venv = make_venv(install, wheel, work / "venvs")
            t1 = time.monotonic()
            outcomes = walk_venv(install, venv, work / "walk", server.url if server else "")
            t2 = time.monotonic()
            rows += [(f"[{install}]", o) for o in outcomes]
            bad = sum(not o.ok for o in outcomes)
            times.append(
                f"{install:<20} venv {t1 - t0:5.1f} s  walk {t2 - t1:6.1f} s  "
                f"{len(outcomes)} calls{f', {bad} FAILED' if bad else ''}"
            )
    except (ExtrasError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for line in walk.summary(rows):
        print(walk.shorten(line, str(work / "walk")))
    print("\n".join(times))
    failed = sum(not o.ok for _, o in rows)
    print(
        f"{'FAILED' if failed else 'ok'}: {len(rows) - failed}/{len(rows)} calls as expected in "
        f"{len(installs)} installs, {time.monotonic() - started:.0f} s"
        + (f" (kept in {work})" if args.keep else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
