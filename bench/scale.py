"""Rightsizer at fleet scale, end to end on a real VictoriaMetrics: history import, ``plan``, ``report``.

For each fleet size (default 1,000 nodes; ``GPUPILOT_BENCH_SCALE_NODES=1000,10000`` adds the
80,000-GPU fleet, which takes the better part of an hour on two cores, nearly all of it import):
a fresh ``victoria-metrics`` with its default query limits, 14 days of the fleet's history streamed
into ``/api/v1/import`` (:mod:`devkit.scale_history`, one sample every 900 s: the analysis's
15-minute rolling mean then holds one sample), then ``gpupilot-rightsizer plan`` and
``gpupilot-rightsizer report --plan`` as subprocesses. Wall time and peak RSS of each rightsizer
process, and VictoriaMetrics' peak RSS, side by side per fleet size.

Goals (per run): plan and report together ≤ 5 min and each ≤ 2 GiB RSS. The rightsizer's processes
run with bytecode caches allowed (``PYTHONDONTWRITEBYTECODE`` dropped), as an install has them.
``python -m bench.scale [--nodes 1000,10000] [--days 14] [--step 900] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from devkit import scale_history
from devkit.victoriametrics import VictoriaMetricsServer
from gpupilot_common import numbers

GOAL_S = 300.0
GOAL_RSS_MIB = 2048.0


@dataclass(frozen=True)
class Step:
    seconds: float
    rss_mib: float
    note: str = ""


@dataclass(frozen=True)
class Run:
    nodes: int
    gpus: int
    series: int
    samples: int
    gib_sent: float
    generate: Step
    plan: Step
    report: Step
    vm_rss_mib: float
    load: str


def _hwm_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _run(cmd: list[str], log: Path) -> Step:
    """Run ``cmd``, stderr to ``log`` (and the last progress line to our stderr); wall time and peak RSS."""
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - started
    text = log.read_text(errors="replace")
    if proc.returncode != 0:
        tail = text.strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"bench.scale: {' '.join(cmd[2:4])} failed (exit {proc.returncode}): {tail[0]}")
    queries = re.findall(r"(\d+) queries answered", text)
    groups = re.findall(r"in (\d+) node groups", text)
    note = (f"{queries[-1]} queries" if queries else "") + (f", {groups[0]} node groups" if groups else "")
    return Step(seconds, usage.ru_maxrss / 1024, note)


def run_once(nodes: int, *, days: float, step: float, seed: int, work: Path, reuse: bool = False) -> Run:
    """Import (or, with ``reuse``, keep what an earlier run with ``--keep`` imported), plan, report."""
    work.mkdir(parents=True, exist_ok=True)
    saved = work / "import.json"
    with VictoriaMetricsServer(work / "vm-data", log_file=work / "victoria-metrics.log") as vm:
        if reuse and saved.exists():
            kept = json.loads(saved.read_text())
            end, imported, gen = (
                kept["end"],
                scale_history.ImportResult(**kept["imported"]),
                Step(**kept["generate"]),
            )
        else:
            now = time.time()
            end = now - now % 3600 - 3600
            t0 = time.monotonic()
            c0 = os.times()
            imported = scale_history.import_fleet(
                vm.url,
                nodes=nodes,
                end=end,
                days=days,
                step=step,
                seed=seed,
                progress=lambda m: print(f"\r… {m}", end="", file=sys.stderr, flush=True),
            )
            print(file=sys.stderr)
            gen = Step(
                time.monotonic() - t0,
                _hwm_mib(os.getpid()),
                f"generator CPU {os.times().user - c0.user:.0f} s",
            )
            saved.write_text(json.dumps({"end": end, "imported": asdict(imported), "generate": asdict(gen)}))
        rs = [sys.executable, "-m", "rightsizer"]
        common = ["--prometheus-url", vm.url, "--window", f"{days:g}d", "--at", str(end)]
        print(f"… plan on {nodes:,} nodes", file=sys.stderr, flush=True)
        plan = _run([*rs, "plan", *common, "--out", str(work / "plan.json")], work / "plan.log")
        print(f"… report on {nodes:,} nodes", file=sys.stderr, flush=True)
        report = _run(
            [*rs, "report", *common, "--plan", str(work / "plan.json"), "--out", str(work / "report")],
            work / "report.log",
        )
        vm_rss = _hwm_mib(vm.pid)
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return Run(
        nodes,
        nodes * 8,
        imported.series,
        imported.samples,
        imported.bytes_sent / 2**30,
        gen,
        plan,
        report,
        vm_rss,
        load,
    )


def _table(runs: list[Run]) -> str:
    head = f"{'fleet':<22} {'step':<9} {'seconds':>8} {'peak RSS MiB':>13}  note"
    lines = [head, "-" * len(head)]
    for r in runs:
        fleet = f"{r.nodes:,} nodes / {r.gpus:,} GPUs"
        lines.append(
            f"{fleet:<22} {'import':<9} {r.generate.seconds:>8.0f} {r.generate.rss_mib:>13.0f}  "
            f"{r.series:,} series, {r.samples / 1e9:.2f} G samples, {r.gib_sent:.1f} GiB JSON; "
            f"{r.generate.note}; VictoriaMetrics peak RSS {r.vm_rss_mib:,.0f} MiB"
        )
        lines.append(f"{'':<22} {'plan':<9} {r.plan.seconds:>8.0f} {r.plan.rss_mib:>13.0f}  {r.plan.note}")
        lines.append(
            f"{'':<22} {'report':<9} {r.report.seconds:>8.0f} {r.report.rss_mib:>13.0f}  {r.report.note}"
        )
        lines.append(f"{'':<22} {'load avg':<9} {r.load}")
    if len(runs) > 1:
        a, b = runs[0], runs[-1]
        k = b.nodes / a.nodes
        lines.append(
            f"\n×{k:g} nodes: plan ×{b.plan.seconds / a.plan.seconds:.1f} time, ×{b.plan.rss_mib / a.plan.rss_mib:.1f} "
            f"RSS; report ×{b.report.seconds / a.report.seconds:.1f} time, "
            f"×{b.report.rss_mib / a.report.rss_mib:.1f} RSS; import ×{b.generate.seconds / a.generate.seconds:.1f}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nodes",
        default=os.environ.get("GPUPILOT_BENCH_SCALE_NODES", "1000"),
        help="comma-separated fleet sizes in nodes of 8 GPUs (default 1000, or $GPUPILOT_BENCH_SCALE_NODES)",
    )
    parser.add_argument(
        "--days",
        type=numbers.real(low=0, low_open=True, high=366),
        default=14.0,
        help="days of history (default 14)",
    )
    parser.add_argument(
        "--step",
        type=numbers.real(low=1, high=86400, unit="seconds"),
        default=900.0,
        help="seconds between samples (default 900)",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the synthetic fleet (default 7)")
    parser.add_argument("--keep", type=Path, default=None, help="keep data, plans, reports and logs here")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="with --keep: plan and report on what an earlier run there imported",
    )
    args = parser.parse_args(argv)
    if args.reuse and args.keep is None:
        parser.error("--reuse needs --keep DIR (where an earlier run imported)")
    try:
        sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--nodes: expected comma-separated whole numbers, got {args.nodes!r}")
    if not sizes or any(n < 1 or n > 100_000 for n in sizes):
        parser.error("--nodes: each size must be between 1 and 100000")
    base = args.keep or Path(tempfile.mkdtemp(prefix="gpupilot-bench-scale-"))
    runs = []
    try:
        for n in sizes:
            work = base / f"nodes-{n}"
            runs.append(
                run_once(n, days=args.days, step=args.step, seed=args.seed, work=work, reuse=args.reuse)
            )
            print(_table(runs), flush=True)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    ok = all(r.plan.seconds + r.report.seconds <= GOAL_S for r in runs) and all(
        max(r.plan.rss_mib, r.report.rss_mib) <= GOAL_RSS_MIB for r in runs
    )
    print(
        f"goals: plan + report ≤ {GOAL_S / 60:.0f} min and ≤ {GOAL_RSS_MIB / 1024:.0f} GiB each: "
        + ("met" if ok else "MISSED")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
