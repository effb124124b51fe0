"""The rightsizer on a trace-shaped cluster (:mod:`bench.tracefleet`: 930 nodes of 8 H100 80GB, a
little over 7,000 tasks at the end of a day, sharing tasks on MIG slices, whole-GPU tasks on MIG-off
GPUs, arrivals and departures), each plan beside the exact optimum.

Part one, the optimiser on the fleet's snapshot (each plan in its own process: wall time and peak
RSS): ``plan``, ``plan --allow-moves`` and ``plan --keep-profiles --allow-moves``; GPUs freed, the
printed LP bound, the exact fleet optimum (the pools' packing MILP solved to proven optimality, plus
the GPUs whole-GPU pods hold), the gap to it, pods disrupted and nodes changed.

Part two (``--full``), the path a capacity planner takes: the fleet written as ordinary scenarios
(the snapshot, and the whole day with pod lifetimes), each loaded, backfilled for the day at a
900 s step into TSDB blocks (the process tree's peak RSS), a Prometheus started on the blocks and
``gpupilot-rightsizer plan`` run against it with and without moves; plus a 100,000-pod snapshot
loaded. Goals: every plan with moves within 0.5 % of the optimum with a bound that never exceeds
it; each backfill within 2 GiB.

``python -m bench.trace [--nodes 930] [--tasks 7500] [--full] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench import tracefleet
from devkit.prometheus import PrometheusServer
from gpupilot_common.table import Column, render
from rightsizer.optimise import consolidate, packing
from rightsizer.optimise.fleet import OptimiserSettings, optimise
from rightsizer.optimise.node import propose_node
from rightsizer.plan import build as planning

MODES = {
    "plan": OptimiserSettings(),
    "--allow-moves": OptimiserSettings(allow_moves=True),
    "--keep-profiles --allow-moves": OptimiserSettings(allow_moves=True, keep_profiles=True),
}
EPOCH = 1796083200.0
"""2026-12-01T00:00:00Z: the day the scenarios replay."""
GOAL_GAP = 0.005
GOAL_BACKFILL_MIB = 2048.0


def exact_optimum(analysis: Any, settings: OptimiserSettings) -> tuple[int, str]:
    """GPUs holding pods in the fleet's best plan with pods free to move: each pool's packing MILP
    solved to proven optimality (HiGHS, no time limit), plus GPUs held by whole-GPU pods."""
    workloads = {p: w for w in analysis.workloads for p in w.pods}
    props = [
        propose_node(n, analysis, settings=settings, workloads=workloads, time_limit=0.0)
        for n in analysis.nodes
    ]
    demand: dict[str, Counter[str]] = {}
    models = {}
    fixed = 0
    for p in props:
        if not consolidate.in_pool(p) or p.model is None:
            fixed += p.used_after
            continue
        models[p.model.key] = p.model
        items = consolidate.pool_items(p, analysis)
        demand.setdefault(p.model.key, Counter()).update(
            packing.meet(p.model, i.klass, i.profile_now) for i in items
        )
        pool = set(consolidate.pool_gpus(p, analysis))
        fixed += p.used_now - sum(1 for g in p.current if g.index in pool and g.items)
    status = "optimal"
    total = fixed
    for key, d in demand.items():
        res = packing._milp(
            models[key], dict(d), gpus=sum(d.values()), time_limit=3600.0, exact=settings.keep_profiles
        )
        status = status if res.status == "optimal" else res.status
        total += res.gpus
    return total, status


def one_case(mode: str, *, nodes: int, tasks: int, seed: int) -> dict[str, Any]:
    fleet = tracefleet.generate(nodes=nodes, tasks=tasks, seed=seed)
    at = fleet.horizon - 1
    analysis = tracefleet.analysis_at(fleet, at)
    settings = MODES[mode]
    t0, c0 = time.perf_counter(), time.process_time()
    proposal = optimise(analysis, settings=settings)
    plan = planning.build_plan(analysis, proposal, context=planning.PlanContext(window="1d", settings={}))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    moved = sum(1 for n in plan.nodes for p in n.pods_disrupted for t in p.targets if t.node != n.name)
    optimum, status = exact_optimum(analysis, OptimiserSettings(keep_profiles=settings.keep_profiles))
    return {
        "mode": mode,
        "tasks": len(fleet.running(at)),
        "pending": len(fleet.pending(at)),
        "gpus": plan.totals.gpus,
        "used_now": plan.totals.gpus_needed + plan.totals.gpus_freed,
        "needed": plan.totals.gpus_needed,
        "bound": plan.solver.lower_bound_gpus,
        "scope": plan.solver.bound_scope,
        "optimum": optimum,
        "optimum_status": status,
        "disrupted": plan.totals.pods_disrupted,
        "moved": moved,
        "changed": plan.totals.nodes_changed,
        "seconds": seconds,
        "cpu": cpu,
        "status": plan.solver.status,
    }


def _child(cmd: list[str], *, log: Path | None = None) -> tuple[float, float, str]:
    """Run ``cmd`` (bytecode caches allowed, as in an install); (wall seconds, peak RSS MiB of the
    process, its stdout). Its stderr goes to ``log``, or is shown when it fails."""
    started = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryFile() if log is None else log.open("w+b") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
        assert proc.stdout is not None
        out = proc.stdout.read().decode()
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-3:]
            raise SystemExit(f"bench.trace: {' '.join(cmd[2:5])} failed: {' / '.join(tail)}")
    return time.monotonic() - started, usage.ru_maxrss / 1024, out


def _tree_peak(cmd: list[str], log: Path) -> tuple[float, float]:
    """Run ``cmd``; (wall seconds, peak summed RSS of it and its children, sampled every 0.2 s)."""
    started = time.monotonic()
    with log.open("wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, sum(_rss_kib(p) for p in _tree(proc.pid)))
            time.sleep(0.2)
    if proc.returncode != 0:
        raise SystemExit(f"bench.trace: {' '.join(cmd[2:5])} failed; see {log}")
    return time.monotonic() - started, peak / 1024


def _tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def part_one(args: argparse.Namespace) -> tuple[list[dict[str, Any]], bool]:
    rows = []
    for mode in MODES:
        cmd = [sys.executable, "-m", "bench.trace", f"--case={mode}", *_sizes(args)]
        wall, rss, out = _child(cmd)
        res = json.loads(out)
        res["rss"] = rss
        res["wall"] = wall
        rows.append(res)
        print(f"… {mode}: {res['needed']} GPUs, optimum {res['optimum']} ({wall:.0f} s)", file=sys.stderr)
    first = rows[0]
    print(
        f"\ntrace-shaped fleet: {args.nodes} nodes, {first['gpus']:,} GPUs, {first['tasks']:,} tasks running "
        f"({first['pending']} pending) at the end of the day; {first['used_now']:,} GPUs in use now"
    )
    table = []
    ok = True
    for r in rows:
        gap = r["needed"] - r["optimum"]
        share = gap / r["optimum"] if r["optimum"] else 0.0
        if r["scope"] == "fleet":
            ok = ok and share <= GOAL_GAP and r["bound"] <= r["optimum"] and r["optimum_status"] == "optimal"
        table.append(
            [
                r["mode"],
                f"{r['used_now'] - r['needed']:,}",
                f"{r['needed']:,}",
                f"{r['bound']:,} ({'fleet' if r['scope'] == 'fleet' else 'per node'})",
                f"{r['optimum']:,}",
                f"{gap:+d} ({share:+.2%})",
                f"{r['disrupted']:,} ({r['moved']:,} to another node), {r['changed']} nodes",
                f"{r['seconds']:.1f} s ({r['cpu']:.1f} s CPU), {r['rss']:.0f} MiB",
            ]
        )
    columns = (
        Column("plan"),
        Column("GPUs freed", right=True),
        Column("GPUs in use", right=True),
        Column("printed LP bound"),
        Column("exact optimum, moves", right=True),
        Column("gap to optimum"),
        Column("pods disrupted", wrap=True),
        Column("optimise + plan, peak RSS", wrap=True),
    )
    print(render(columns, table))
    return rows, ok


def _sizes(args: argparse.Namespace) -> list[str]:
    return ["--nodes", str(args.nodes), "--tasks", str(args.tasks), "--seed", str(args.seed)]


def part_two(args: argparse.Namespace, work: Path) -> bool:
    fleet = tracefleet.generate(nodes=args.nodes, tasks=args.tasks, seed=args.seed)
    files = {
        "snapshot": tracefleet.scenario_yaml(fleet, epoch=EPOCH, at=fleet.horizon - 1),
        "lifetimes": tracefleet.scenario_yaml(fleet, epoch=EPOCH),
    }
    big = tracefleet.generate(
        nodes=round(args.nodes * 100_000 / 7_000), tasks=round(args.tasks * 100_000 / 7_000), seed=args.seed
    )
    files["100,000 pods"] = tracefleet.scenario_yaml(big, epoch=EPOCH, at=big.horizon - 1)
    del big
    ok = True
    rows = []
    end = EPOCH + 86400 - 900
    for name, text in files.items():
        path = work / f"{name.replace(',', '').replace(' ', '-')}.yaml"
        path.write_text(text)
        load = [
            sys.executable,
            "-c",
            "import sys; from simulator import scenario; s = scenario.load(sys.argv[1]); print(len(s.pods))",
            str(path),
        ]
        wall, rss, out = _child(load, log=work / f"{path.stem}-load.log")
        row = [name, f"{int(out):,} pods, {len(text) / 2**20:.1f} MiB", f"{wall:.0f} s, {rss:.0f} MiB"]
        if name == "100,000 pods":
            rows.append([*row, "-", "-"])
            continue
        data = work / f"{path.stem}-data"
        shutil.rmtree(data, ignore_errors=True)
        bf = [
            sys.executable,
            "-m",
            "exporter",
            "backfill",
            "--scenario",
            str(path),
            "--start",
            str(EPOCH),
            "--end",
            str(end),
            "--step",
            "900s",
            "--out",
            str(data),
        ]
        wall, tree = _tree_peak(bf, work / f"{path.stem}-backfill.log")
        said = (work / f"{path.stem}-backfill.log").read_text().strip().splitlines()[-1]
        series = said.split(" samples of ")[1].split(" series")[0] if " samples of " in said else "?"
        ok = ok and tree <= GOAL_BACKFILL_MIB
        plans = []
        with PrometheusServer(data, log_file=work / f"{path.stem}-prometheus.log") as prom:
            for mode in ("", "--allow-moves", "--keep-profiles --allow-moves"):
                out_file = work / f"{path.stem}-plan{mode.replace(' ', '')}.json"
                cmd = [
                    sys.executable,
                    "-m",
                    "rightsizer",
                    "plan",
                    "--prometheus-url",
                    prom.url,
                    "--window",
                    "1d",
                    "--at",
                    str(end),
                    "--out",
                    str(out_file),
                    "--quiet",
                    *mode.split(),
                ]
                pw, pr, _ = _child(cmd, log=work / f"{path.stem}-plan.log")
                plan = json.loads(out_file.read_text())
                solver, totals = plan["solver"], plan["totals"]
                gap = totals["gpus_needed"] - solver["lower_bound_gpus"]
                plans.append(
                    f"{mode or 'plan'}: {totals['gpus_needed']:,} GPUs, bound {solver['lower_bound_gpus']:,} (gap {gap}), {pw:.0f} s, {pr:.0f} MiB"
                )
        rows.append([*row, f"{series} series, {wall:.0f} s, {tree:.0f} MiB (tree)", "\n".join(plans)])
    columns = (
        Column("scenario"),
        Column("size"),
        Column("load", wrap=True),
        Column("backfill 1 day at 900 s", wrap=True),
        Column("plan on Prometheus", wrap=True),
    )
    print("\n" + render(columns, rows, wide=True))
    return ok


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trace", description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=930, help="nodes of 8 GPUs (default 930)")
    parser.add_argument(
        "--tasks", type=int, default=7500, help="tasks running at the start of the day (default 7500)"
    )
    parser.add_argument("--seed", type=int, default=50, help="seed of the synthetic trace (default 50)")
    parser.add_argument("--full", action="store_true", help="also scenarios, backfill and plan on Prometheus")
    parser.add_argument("--keep", type=Path, default=None, help="keep scenarios, data and logs here")
    parser.add_argument("--case", choices=sorted(MODES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(one_case(args.case, nodes=args.nodes, tasks=args.tasks, seed=args.seed)))
        return 0
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    _, ok = part_one(args)
    if args.full:
        work = args.keep or Path(tempfile.mkdtemp(prefix="gpupilot-bench-trace-"))
        work.mkdir(parents=True, exist_ok=True)
        try:
            ok = part_two(args, work) and ok
        finally:
            if args.keep is None:
                shutil.rmtree(work, ignore_errors=True)
    print(
        f"\nload average at the start {load}, at the end {' '.join(Path('/proc/loadavg').read_text().split()[:3])}"
    )
    print(
        f"goals: plans with moves within {GOAL_GAP:.1%} of the exact optimum, bound ≤ optimum"
        + (f"; backfills ≤ {GOAL_BACKFILL_MIB / 1024:.0f} GiB" if args.full else "")
        + (": met" if ok else ": MISSED")
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
