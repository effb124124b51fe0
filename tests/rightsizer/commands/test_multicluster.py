"""Several clusters in one store (a Thanos/VictoriaMetrics global view): ``plan``/``report`` per cluster
by the ``cluster`` label, and ``apply --cluster`` against one API server (the API double).

The stores holding both clusters also hold a recording-rule series without the cluster label
(:func:`merged_rule`), as one rule evaluator over both clusters would write it. Two clusters whose
series carry ``cluster``: ``east`` is the hand-built small history
(:mod:`tests.support.rightsizer.small_history`: node-a … node-e), ``west`` the burst history
(:mod:`tests.support.rightsizer.burst_history`) with its nodes renamed ``node-a`` and ``node-b``, so both
clusters have a ``node-a`` and a ``node-b`` (GPU UUIDs ``GPU-node-a-0`` too) with different GPUs,
layouts and pods. The fleet's plan must hold, per cluster, exactly the plan of that cluster's history
alone, on Prometheus and on VictoriaMetrics.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devkit.prometheus import PrometheusServer, backfill_openmetrics
from devkit.victoriametrics import VictoriaMetricsServer
from gpupilot_common.text import plural
from rightsizer.analysis import history as analysis
from rightsizer.apply import protocol as proto
from rightsizer.apply.plancheck import check_plan
from rightsizer.cli import main
from rightsizer.clients.chunks import QueryLimits
from rightsizer.clients.prometheus import PrometheusClient
from rightsizer.optimise.proposal import OptimiserSettings
from rightsizer.plan import clusters
from rightsizer.plan.model import Plan, PlanError, load_plan, plan_from_dict, plan_to_dict
from rightsizer.plan.pipeline import make_plan
from rightsizer.plan.settings import PlanSettings
from rightsizer.report import data as report_data
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer import burst_history, small_history
from tests.support.rightsizer.apply_support import Change, seed_node, write_plan
from tests.support.rightsizer.apply_support import make_plan as synthetic_plan

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]

WINDOW_S = 2 * 86400.0
SETTINGS = PlanSettings(window_s=WINDOW_S, optimiser=OptimiserSettings(time_limit_s=5))
SERIES = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (.*)$")


def labelled(source: Path, out: Path, *, cluster: str, rename: dict[str, str] | None = None) -> Path:
    """``source`` (OpenMetrics) with ``cluster="<cluster>"`` on every series, names replaced by ``rename``."""
    text = source.read_text()
    for old, new in (rename or {}).items():
        text = text.replace(old, new)
    lines = []
    for line in text.splitlines():
        m = SERIES.match(line) if not line.startswith("#") else None
        if m is None:
            lines.append(line)
            continue
        name, labels, rest = m.groups()
        lines.append(f'{name}{{cluster="{cluster}"{"," + labels if labels else ""}}} {rest}')
    out.write_text("\n".join(lines) + "\n")
    return out


def prometheus_text(source: Path) -> bytes:
    """OpenMetrics (seconds) → Prometheus text with millisecond timestamps, for VictoriaMetrics' import."""
    out = []
    for line in source.read_text().splitlines():
        if line.startswith("#"):
            continue
        head, value, ts = line.rsplit(" ", 2)
        out.append(f"{head} {value} {round(float(ts) * 1000)}")
    return ("\n".join(out) + "\n").encode()


def merged_rule(out: Path, *, start: float, end: float) -> Path:
    """``gpupilot:slice_activity:avg5m`` as one store evaluating rules/ over both clusters would write
    it: no cluster label, devices of the same name merged, here 100 % busy. A fleet plan that used it
    would size east's and west's node-a by it; the plans must ignore it (compared with stores alone)."""
    name = "gpupilot:slice_activity:avg5m"
    lines = [f"# TYPE {name} gauge"]
    labels = 'Hostname="node-a",gpu="0",UUID="GPU-node-a-0",GPU_I_PROFILE="3g.40gb",GPU_I_ID="1"'
    t = start - start % 300
    while t <= end:
        lines.append(f"{name}{{{labels}}} 1.0 {t:.0f}")
        t += 300
    out.write_text("\n".join([*lines, "# EOF"]) + "\n")
    return out


@dataclass(frozen=True)
class Stores:
    end: float
    both: dict[str, str]
    """Engine → URL of a store holding both clusters."""
    alone: dict[tuple[str, str], str]
    """(engine, cluster) → URL of a store holding that cluster's history only (the engines differ in
    the last digits of some statistics, so each engine's fleet is compared with its own)."""


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    base = tmp_path_factory.mktemp("multicluster")
    now = time.time()
    end = now - now % 3600 - 3600
    start = small_history.write_history(base / "small.om", end=end)
    burst_history.write_history(base / "burst.om", end=end)
    files = {
        "east": labelled(base / "small.om", base / "east.om", cluster="east"),
        "west": labelled(
            base / "burst.om",
            base / "west.om",
            cluster="west",
            rename={"burst-a": "node-a", "tight": "node-b"},
        ),
    }
    rule = merged_rule(base / "rule.om", start=start, end=end)
    for name, path in files.items():
        backfill_openmetrics(path, base / "both", block_duration="96h")
        backfill_openmetrics(path, base / name, block_duration="96h")
    backfill_openmetrics(rule, base / "both", block_duration="96h")
    servers = [
        PrometheusServer(base / d, log_file=base / f"prometheus-{d}.log") for d in ("both", "east", "west")
    ]
    vms = [
        VictoriaMetricsServer(base / f"vm-{d}", log_file=base / f"vm-{d}.log")
        for d in ("both", "east", "west")
    ]
    try:
        for s in servers:
            s.start()
        for vm, paths in zip(vms, ([*files.values(), rule], [files["east"]], [files["west"]]), strict=True):
            vm.start()
            for path in paths:
                vm.import_prometheus(prometheus_text(path))
            vm.force_flush()
        yield Stores(
            end,
            both={"prometheus": servers[0].url, "victoriametrics": vms[0].url},
            alone={
                ("prometheus", "east"): servers[1].url,
                ("prometheus", "west"): servers[2].url,
                ("victoriametrics", "east"): vms[1].url,
                ("victoriametrics", "west"): vms[2].url,
            },
        )
    finally:
        for vm in vms:
            vm.stop()
        for s in servers:
            s.stop()


def plan_of(url: str, end: float, settings: PlanSettings = SETTINGS) -> Plan:
    with PrometheusClient(url) as client:
        return make_plan(client, end=end, settings=settings)


def comparable(plan: Plan) -> dict[str, Any]:
    """What a plan proposes, without when it was made, how long the solver took or what it read."""
    d = plan_to_dict(plan)
    return {k: d[k] for k in ("plan_id", "totals", "mig_parted_config", "nodes", "time_slicing")}


@pytest.fixture(scope="module")
def alone(stores: Stores) -> dict[tuple[str, str], Plan]:
    return {key: plan_of(url, stores.end) for key, url in stores.alone.items()}


@pytest.mark.parametrize("engine", ["prometheus", "victoriametrics"])
def test_each_cluster_is_planned_as_if_alone(
    stores: Stores, alone: dict[tuple[str, str], Plan], engine: str
) -> None:
    mine = {name: plan for (e, name), plan in alone.items() if e == engine}
    fleet = plan_of(stores.both[engine], stores.end)
    assert fleet.cluster_names == ("east", "west")
    assert fleet.cluster_label == "cluster"
    # Both clusters have a node-a and a node-b; neither merged with the other's.
    assert sorted((n.cluster, n.name) for n in fleet.nodes if n.name in ("node-a", "node-b")) == [
        ("east", "node-a"),
        ("east", "node-b"),
        ("west", "node-a"),
        ("west", "node-b"),
    ]
    assert len(fleet.node("node-a", "west").current) == 3  # type: ignore[union-attr]  # burst-a's 3 GPUs
    assert len(fleet.node("node-a", "east").current) == 2  # type: ignore[union-attr]  # small node-a's 2
    for name, own in mine.items():
        assert comparable(clusters.select(fleet, name)) == comparable(own), name
        assert own.changed_nodes, f"{name}: a plan that changes nothing would prove little"
    assert [(c.name, c.totals) for c in fleet.clusters] == [(n, p.totals) for n, p in sorted(mine.items())]
    assert fleet.totals.gpus_freed == sum(p.totals.gpus_freed for p in mine.values())
    assert fleet.totals.nodes == sum(p.totals.nodes for p in mine.values())
    # The fleet plan round-trips through plan.json and passes apply's checks.
    written = plan_to_dict(fleet)
    again = plan_from_dict(json.loads(json.dumps(written)))
    assert plan_to_dict(again) == written and again.clusters == fleet.clusters
    check_plan(again)


def test_node_groups_match_a_name_in_both_clusters_and_keep_them_apart(stores: Stores) -> None:
    """Cut into one node name per group, each group's ``Hostname`` matcher selects node-a (node-b) of
    both clusters at once; the analysis, plan and heatmap are still those of the whole-fleet queries."""
    url = stores.both["prometheus"]
    cut = dataclasses.replace(SETTINGS, query_limits=QueryLimits(max_series=1))
    with PrometheusClient(url) as client:
        whole = analysis.analyse(client, end=stores.end, settings=SETTINGS.analysis_settings())
        one_query = client.queries
    lines: list[str] = []
    with PrometheusClient(url) as client:
        parts = analysis.analyse(
            client, end=stores.end, settings=cut.analysis_settings(), progress=lines.append
        )
        assert client.queries > one_query
    names = sorted({n.name for n in whole.nodes})
    assert len(names) < len(whole.nodes)  # node-a and node-b are in both clusters
    assert any(f"in {len(names)} node groups" in line for line in lines)
    assert parts == whole
    assert {(d.cluster, d.node) for d in parts.devices if d.peak is not None} >= {
        ("east", "node-a"),
        ("west", "node-a"),
    }
    assert comparable(plan_of(url, stores.end, cut)) == comparable(plan_of(url, stores.end))
    with PrometheusClient(url) as client:
        span: dict[str, Any] = {"start": stores.end - WINDOW_S, "end": stores.end, "named": True}
        heat_whole = report_data.fetch_heatmap(client, **span)
        heat_cut = report_data.fetch_heatmap(client, **span, groups=[(n,) for n in names])
    assert "east · node-a" in heat_cut.nodes and "west · node-a" in heat_cut.nodes
    assert heat_cut.nodes == heat_whole.nodes and heat_cut.hours == heat_whole.hours
    for row_cut, row_whole in zip(heat_cut.values, heat_whole.values, strict=True):
        assert [v is None for v in row_cut] == [v is None for v in row_whole]
        assert [v or 0.0 for v in row_cut] == pytest.approx([v or 0.0 for v in row_whole], rel=1e-9)


def test_plan_cli_groups_tables_per_cluster_and_restricts(
    stores: Stores, alone: dict[tuple[str, str], Plan], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", "--prometheus-url", stores.both["prometheus"], "--window", "2d", "--at", str(stores.end)]
    args += ["--time-limit", "5"]
    assert main([*args, "--out", str(tmp_path / "fleet.json")]) == 0
    out = capsys.readouterr().out
    fleet = load_plan(tmp_path / "fleet.json")
    east, west = fleet.clusters
    assert f"fleet: {fleet.totals.nodes_changed}/{plural(fleet.totals.nodes, 'node')} change" in out
    assert out.index("cluster east: ") < out.index("cluster west: ")
    assert f"cluster east: {east.totals.nodes_changed}/{plural(east.totals.nodes, 'node')} change" in out
    assert f"cluster west: {west.totals.nodes_changed}/{plural(west.totals.nodes, 'node')} change" in out
    raw = json.loads((tmp_path / "fleet.json").read_text())
    assert {n["cluster"] for n in raw["nodes"]} == {"east", "west"}
    assert [c["name"] for c in raw["clusters"]] == ["east", "west"]
    # --cluster: that cluster's plan only, the same as its history alone gives.
    assert main([*args, "--cluster", "west", "--out", str(tmp_path / "west.json")]) == 0
    only = load_plan(tmp_path / "west.json")
    assert "cluster east" not in capsys.readouterr().out
    assert comparable(only) == comparable(alone["prometheus", "west"])
    assert main([*args, "--cluster", "north", "--out", str(tmp_path / "x.json")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"error: --cluster 'north': no such cluster label value in the inventory at "
        f"{fleet.window.end} (clusters: east, west)"
    )
    assert not (tmp_path / "x.json").exists()
    with pytest.raises(SystemExit):
        main([*args, "--cluster-label", "0bad"])
    assert "'0bad' is not a Prometheus label name" in capsys.readouterr().err


def test_report_groups_per_cluster(
    stores: Stores, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = stores.both["prometheus"]
    args = [
        "report",
        "--prometheus-url",
        url,
        "--out",
        str(tmp_path),
        "--window",
        "2d",
        "--at",
        str(stores.end),
    ]
    code = main([*args, "--price-per-gpu-hour", "2"])
    assert code == 0, capsys.readouterr().err
    md = (tmp_path / "report.md").read_text()
    per_cluster = md.split("## Per cluster", 1)[1].split("##", 1)[0]
    rows = [line.split("|")[1].strip() for line in per_cluster.splitlines() if line.startswith("| ")]
    assert rows == ["cluster", "east", "west", "fleet"]
    east, west, fleet = (
        [c.strip() for c in line.split("|")[1:-1]]
        for line in per_cluster.splitlines()
        if line.startswith(("| east", "| west", "| fleet"))
    )
    for column in range(1, 5):  # nodes, changed, GPUs, GPUs freed: the fleet is the sum
        assert int(fleet[column]) == int(east[column]) + int(west[column])
    changes = md.split("## Proposed layout changes", 1)[1].split("## Top idle", 1)[0]
    assert "| cluster | node |" in changes
    assert "| east | node-a |" in changes and "| west | node-a |" in changes
    with PrometheusClient(url) as client:
        heat = report_data.fetch_heatmap(client, start=stores.end - WINDOW_S, end=stores.end, named=True)
    assert {"east · node-a", "west · node-a", "east · node-b", "west · node-b"} <= set(heat.nodes)
    assert list(heat.nodes) == sorted(heat.nodes)  # grouped: east's rows, then west's


GOOD = {"3g.40gb": 1, "1g.10gb": 4}
OTHER = {"3g.40gb": 2}


def two_cluster_plan() -> Plan:
    """east changes gpu-a and gpu-b, west changes gpu-a (another layout): one name, two clusters."""
    parts = []
    for name, changes in (
        ("east", [Change("gpu-a", "all-1g.10gb", OTHER), Change("gpu-b", "all-1g.10gb", OTHER)]),
        ("west", [Change("gpu-a", "all-1g.10gb", GOOD)]),
    ):
        p = synthetic_plan(changes)
        nodes = tuple(dataclasses.replace(n, cluster=name) for n in p.nodes)
        parts.append(dataclasses.replace(p, nodes=nodes, cluster_label="cluster"))
    return clusters.merge(parts)


def test_apply_acts_on_the_selected_cluster_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = two_cluster_plan()
    west = plan.node("gpu-a", "west")
    east = plan.node("gpu-a", "east")
    assert west is not None and east is not None and west.config_name != east.config_name
    path = write_plan(plan, tmp_path / "plan.json")
    with KubeDouble() as kube:  # the API server of cluster west
        seed_node(kube, "gpu-a")
        kube.add_node("gpu-c", mig_config="all-1g.10gb")
        cfg = kube.write_kubeconfig(tmp_path / "kc")
        args = ["apply", "--plan", str(path), "--kubeconfig", str(cfg), "--configmap-sync", "0"]
        args += ["--repoint-cluster-policy", "--yes"]
        before = kube.snapshot()
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"error: {path}: the plan covers 2 clusters (east, west); apply acts on the cluster its kubeconfig "
            "points at: pass --cluster NAME to apply that cluster's changes only"
        ]
        assert main([*args, "--cluster", "north"]) == 2
        assert capsys.readouterr().err.strip() == (
            f"error: {path}: --cluster 'north' is not in the plan (clusters: east, west)"
        )
        assert kube.snapshot() == before  # nothing touched by a refusal
        assert main([*args, "--cluster", "west"]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == west.config_name
        assert kube.labels("gpu-a")[proto.STATE_LABEL] == "success"
        assert kube.labels("gpu-c")[proto.CONFIG_LABEL] == "all-1g.10gb"
        touched = {a.name for a in kube.actions(resource="nodes") if a.verb in ("patch", "update")}
        assert touched == {"gpu-a"}
        written = [a for a in kube.actions(resource="configmaps") if a.verb in ("create", "update", "patch")]
        assert written
        text = json.dumps([kube.configmap(n) for n in {a.name for a in written}])
        assert west.config_name in text and east.config_name not in text
        rows = {line.split()[0] for line in out.splitlines()[3:] if line.strip() and not line.startswith(" ")}
        assert rows == {"gpu-a"}  # east's gpu-b is not this cluster's: not even skipped


def test_plan_file_with_one_node_name_in_two_clusters() -> None:
    plan = two_cluster_plan()
    check_plan(plan)  # gpu-a twice, in two clusters: fine
    west = clusters.select(plan, "west")
    assert [(n.cluster, n.name) for n in west.nodes] == [("west", "gpu-a")]
    assert west.totals.nodes == 1 and west.clusters == ()
    check_plan(west)
    doubled = dataclasses.replace(west, nodes=west.nodes * 2)
    with pytest.raises(PlanError, match="node gpu-a of cluster west is listed 2 times"):
        check_plan(doubled)
