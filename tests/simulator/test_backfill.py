"""Backfill: OpenMetrics equal to live snapshots, TSDB blocks a real Prometheus reads, bad ranges, flat memory."""

from __future__ import annotations

import io
import json
import time
import tracemalloc
import urllib.parse
import urllib.request
from collections import defaultdict
from pathlib import Path

import pytest

from devkit.prometheus import PrometheusServer
from exporter.expose.exposition import device_families
from simulator import backfill, cluster, scenario
from simulator import cli as sim_cli
from simulator.backend import SimBackend
from simulator.cli import backfill_main
from simulator.model import Scenario
from tests.support.exporter.allocations import plugin_allocations

EPOCH = 1_767_225_600.0
SMALL = """
seed: 3
epoch: 2026-01-01T00:00:00Z
nodes:
  - name: n1
    gpus: [{model: H100 80GB}, {model: H100 80GB, mig: {"3g.40gb": 1, "1g.10gb": 2}}]
  - name: n2
    labels: {nvidia.com/mig.strategy: single}
    gpus: [{model: A100 40GB, mig: all-3g.20gb}]
workloads:
  - {namespace: ai-serving, deployment: llm-inference, replicas: 1, container: vllm, labels: {app: llm-inference},
     devices: [n1/0], utilization: {pattern: daily, base: 30, peak: 90, noise: 5}, memory_mib: 60000,
     app_metrics: {inference_queue_depth: {pattern: daily, base: 1, peak: 12, noise: 1}}}
  - {namespace: team, pod: nb, devices: [n1/1/1g.10gb], utilization: idle}
  - {namespace: team, pod: job, devices: [n1/1/3g.40gb], utilization: {pattern: bursty, base: 5, peak: 90, every: 1h, duration: 10m}}
  - {namespace: batch, pod: scorer, devices: [n2/0/3g.20gb], utilization: 40, memory_mib: 9000}
hpas:
  - {namespace: ai-serving, name: llm-inference-hpa, target: llm-inference, min_replicas: 1, max_replicas: 4,
     metrics: [{name: DCGM_FI_DEV_GPU_UTIL, value: 75}]}
faults:
  - {kind: gpu_lost, node: n1, gpu: 0, at: 300d2h10m, duration: 10m}
  - {kind: xid, node: n1, gpu: 1, code: 31, at: 300d2h30m}
  - {kind: nvml_error, node: n2, gpu: 0, field: DCGM_FI_DEV_POWER_USAGE, at: 300d2h40m, duration: 5m}
"""
WINDOW_START = EPOCH + 300 * 86400 + 2 * 3600  # a 2-hour block holding every fault edge


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Scenario]:
    path = tmp_path_factory.mktemp("scenario") / "small.yaml"
    path.write_text(SMALL)
    return path, scenario.load(path)


def _parse(text: str) -> dict[float, dict[str, float]]:
    """``{timestamp: {'name{labels}': value}}`` from OpenMetrics lines."""
    out: dict[float, dict[str, float]] = defaultdict(dict)
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, value, ts = line.rsplit(" ", 2)
        out[float(ts)][series] = float(value)
    return out


def _expected(s: Scenario, t: float) -> dict[str, float]:
    fmt = backfill._Formatter()
    want: dict[str, float] = {}
    for node in s.nodes:
        b = SimBackend(s, node=node.name)
        for fam in device_families(b.snapshot_at(t), hostname=node.name, allocations=plugin_allocations(b)):
            for labels, v in fam.samples:
                want[fmt.prefix(fam.name, labels).rstrip()] = v
    for fam in cluster.families(s, t):
        for labels, v in fam.samples:
            want[fmt.prefix(fam.name, labels).rstrip()] = v
    return want


@pytest.mark.slow
def _block_span_s(block: Path) -> float:
    meta = json.loads((block / "meta.json").read_text())
    return (int(meta["maxTime"]) - int(meta["minTime"])) / 1000.0


def test_windows_are_the_longest_block_range_within_the_point_bound() -> None:
    """18 h (Prometheus' third block range) at the demo's 120 s and the history's 60 s steps; shorter
    at finer steps, so that a window never holds more than 1,080 timestamps; 2 h at the finest."""
    assert backfill.window_seconds(120.0) == backfill.window_seconds(60.0) == 18 * 3600
    assert backfill.window_seconds(30.0) == 6 * 3600
    assert backfill.window_seconds(15.0) == backfill.window_seconds(1.0) == 2 * 3600


@pytest.mark.slow
def test_window_equals_live_snapshots_at_every_timestamp(small: tuple[Path, Scenario]) -> None:
    _, s = small
    ts = backfill.timestamps(WINDOW_START, WINDOW_START + 7199, 60.0)
    buf = io.StringIO()
    n = backfill.write_window(buf, backfill.Backfiller(s).window(ts), ts)
    got = _parse(buf.getvalue())
    assert n == sum(len(v) for v in got.values())
    for t in ts.tolist():
        assert got[t] == _expected(s, t), t
    lost_at = WINDOW_START + 600
    assert any(k.startswith("gpupilot_gpu_lost{") for k in got[lost_at])
    assert not any(k.startswith("gpupilot_gpu_lost{") for k in got[lost_at + 600])
    # families are grouped: each TYPE line once per file
    types = [ln for ln in buf.getvalue().splitlines() if ln.startswith("# TYPE")]
    assert len(types) == len(set(types))


@pytest.mark.prometheus
def test_cli_backfill_blocks_read_by_real_prometheus(small: tuple[Path, Scenario], tmp_path: Path) -> None:
    path, s = small
    out = tmp_path / "data"
    start, end = WINDOW_START - 3600, WINDOW_START + 7170  # end is inclusive
    argv = [
        "--scenario",
        str(path),
        "--start",
        str(start),
        "--end",
        str(end),
        "--step",
        "30s",
        "--out",
        str(out),
    ]
    # Batches of at most 20,000 samples: each window is several blocks side by side.
    assert backfill_main([*argv, "--keep-openmetrics", "--quiet", "--batch-samples", "20000"]) == 0
    blocks = [p for p in out.iterdir() if p.is_dir() and len(p.name) == 26]
    span = backfill.window_seconds(30.0)  # 6 h at a 30 s step
    assert len(blocks) > len({int(t // span) for t in (start, end)})
    assert all(_block_span_s(b) <= span for b in blocks)
    assert backfill_main([*argv, "--quiet"]) == 2  # never twice into the same directory
    kept = sorted((out / "openmetrics").glob("*.om"))
    assert kept and all(p.read_text().endswith("# EOF\n") for p in kept)
    t = WINDOW_START + 1800.0
    snap = SimBackend(s, node="n1").snapshot_at(t)
    with PrometheusServer(out, log_file=tmp_path / "prom.log") as prom:

        def query(q: str) -> list[dict[str, object]]:
            url = f"{prom.url}/api/v1/query?" + urllib.parse.urlencode({"query": q, "time": t})
            with urllib.request.urlopen(url, timeout=30) as r:
                return list(json.load(r)["data"]["result"])

        power = query('DCGM_FI_DEV_POWER_USAGE{Hostname="n1",gpu="1"}')
        assert float(power[0]["value"][1]) == snap.gpus[1].values["DCGM_FI_DEV_POWER_USAGE"]  # type: ignore[index]
        util = query('DCGM_FI_DEV_GPU_UTIL{Hostname="n1",gpu="0",namespace="ai-serving"}')
        assert util[0]["metric"]["pod"].startswith("llm-inference-")  # type: ignore[index]
        assert float(util[0]["value"][1]) == snap.gpus[0].values["DCGM_FI_DEV_GPU_UTIL"]  # type: ignore[index]
        inst = next(i for i in snap.gpus[1].instances if i.profile == "3g.40gb")
        act = query(f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{GPU_I_ID="{inst.gpu_instance_id}",pod="job"}}')
        assert float(act[0]["value"][1]) == inst.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]  # type: ignore[index]
        assert len(query('kube_pod_status_phase{phase="Running"} == 1')) == 4
        joined = query("DCGM_FI_DEV_GPU_UTIL * on (namespace, pod) group_left (label_app) kube_pod_labels")
        assert joined and joined[0]["metric"]["label_app"] == "llm-inference"  # type: ignore[index]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--start", "2026-11-02T00:00:00Z", "--end", "2026-11-01T00:00:00Z"], "is not after --start"),
        (["--days", "1", "--step", "0s"], "--step: '0s' is zero"),
        (["--days", "1", "--step", "fast"], "--step: 'fast' is not a duration"),
        (["--start", "now-1d", "--end", "now+1d"], "is in the future"),
        (["--days", "120"], "more than 90; add --force"),
        (["--start", "yesterday"], "--start: 'yesterday' is not a time"),
        (["--start", "now-2d", "--days", "1"], "either --start or --days"),
        ([], "give --start (e.g. now-7d) or --days N"),
    ],
)
def test_bad_ranges_are_refused_in_one_line(
    small: tuple[Path, Scenario],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    message: str,
) -> None:
    path, _ = small
    code = backfill_main(["--scenario", str(path), "--out", str(tmp_path / "d"), *args])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "d").exists()


def test_bad_scenario_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "fleet.yaml"
    bad.write_text("nodes: [{name: a, gpus: [{model: H100 80GB, mig: {'4g.40gb': 2}}]}]\n")
    assert backfill_main(["--scenario", str(bad), "--days", "1", "--out", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}:1: nodes[0].gpus[0].mig:" in err


class _DoneProcess:
    """Stands in for promtool so the test measures the backfill's own memory, quickly."""

    returncode = 0

    def communicate(self) -> tuple[bytes, bytes]:
        return b"", b""


@pytest.mark.slow
def test_memory_stays_flat_as_days_grow(
    small: tuple[Path, Scenario], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, s = small
    monkeypatch.setattr(backfill, "_start_promtool", lambda *a: _DoneProcess())
    now = time.time()
    peaks = []
    for days in (3, 9):  # full 18 h windows in both
        end = now - now % 600
        settings = backfill.BackfillSettings(
            start=end - days * 86400, end=end, step=600.0, out_dir=tmp_path / f"d{days}"
        )
        tracemalloc.start()
        stats = backfill.run(s, settings, progress=None)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert stats.windows >= days * 86400 / backfill.window_seconds(600.0)
    assert peaks[1] < peaks[0] * 1.25 + 256 * 1024, peaks


def _fleet_of(copies: int) -> Scenario:
    """``copies`` nodes like SMALL's n1 (a whole GPU and a MIG GPU, three pods each)."""
    nodes = "".join(
        f"  - {{name: n{i}, gpus: [{{model: H100 80GB}}, {{model: H100 80GB, mig: {{'3g.40gb': 1, '1g.10gb': 2}}}}]}}\n"
        for i in range(copies)
    )
    pods = "".join(
        f"  - {{namespace: t, pod: w{i}, devices: [n{i}/0], utilization: 40}}\n"
        f"  - {{namespace: t, pod: a{i}, devices: [n{i}/1/3g.40gb], utilization: 20}}\n"
        f"  - {{namespace: t, pod: b{i}, devices: [n{i}/1/1g.10gb], utilization: 5, start: 1h, end: 2h}}\n"
        for i in range(copies)
    )
    return scenario.loads(f"seed: 1\nnodes:\n{nodes}workloads:\n{pods}")


def test_batches_cut_a_window_by_samples_and_keep_every_sample() -> None:
    s = _fleet_of(12)
    ts = backfill.timestamps(EPOCH, EPOCH + 4 * 3600 - 1, 600.0)
    filler = backfill.Backfiller(s)
    batches = list(filler.batches(ts, max_samples=2000))
    per_node = max(
        backfill._samples(b) for b in backfill.Backfiller(_fleet_of(1)).batches(ts, max_samples=None)
    )
    assert len(batches) > 3 and all(backfill._samples(b) < 2000 + per_node for b in batches)
    whole = io.StringIO()
    backfill.write_window(whole, backfill.Backfiller(s).window(ts), ts)
    cut = io.StringIO()
    for b in batches:
        backfill.write_window(cut, b, ts)
    assert _parse(cut.getvalue()) == _parse(whole.getvalue())


@pytest.mark.slow
def test_memory_follows_the_batch_not_the_series(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backfill, "_start_promtool", lambda *a: _DoneProcess())
    end = EPOCH + 18 * 3600 - 600  # one window
    peaks, sizes = [], []
    for run, copies in enumerate(
        (8, 8, 32)
    ):  # four times the series, the same batch (the first run warms caches)
        s = _fleet_of(copies)
        settings = backfill.BackfillSettings(
            start=EPOCH,
            end=end,
            step=600.0,
            out_dir=tmp_path / f"d{run}",
            batch_samples=10_000,
            keep_openmetrics=True,
        )
        tracemalloc.start()
        stats = backfill.run(s, settings, progress=None)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        files = list((tmp_path / f"d{run}" / "openmetrics").glob("*.om"))
        sizes.append(max(f.stat().st_size for f in files))
        assert stats.blocks == len(files) > stats.windows == 1
    # Four times the series, about the same peak: what a batch holds does not grow with them.
    print("PEAKS", peaks)
    assert peaks[1] < peaks[0] * 1.35, peaks  # without batches: 2.9 times
    assert sizes[1] < sizes[0] * 1.25, sizes


def test_progress_reports_percent_rate_and_eta() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    bar = backfill._Progress(out, 4)
    bar.update(1, 1000)
    bar.update(4, 4000, final=True)
    text = out.getvalue()
    assert " 25.0%" in text and "100.0%" in text and "samples/s" in text and "ETA" in text


def test_window_follows_the_live_exporters_layout(small: tuple[Path, Scenario], tmp_path: Path) -> None:
    _, s = small
    mine = tmp_path / "c.csv"
    mine.write_text("DCGM_FI_DEV_POWER_USAGE, gauge, p\nDCGM_EXP_GPU_HEALTH_STATUS, gauge, h\n")
    _, settings, _ = sim_cli.parse_backfill(
        [
            "--scenario",
            "x",
            "--days",
            "1",
            "--out",
            str(tmp_path),
            "-f",
            str(mine),
            "--mig-series",
            "per-instance",
            "--hostname-label",
            "hostname",
        ],
        now=WINDOW_START + 86400,
    )
    assert settings.layout is not None
    ts = backfill.timestamps(WINDOW_START, WINDOW_START + 600, 60.0)
    buf = io.StringIO()
    backfill.write_window(buf, backfill.Backfiller(s, layout=settings.layout).window(ts), ts)
    got = _parse(buf.getvalue())[ts[0]]
    layout = backfill.backfill_layout(settings.layout)
    fmt = backfill._Formatter()
    want = {}
    for node in s.nodes:
        b = SimBackend(s, node=node.name)
        snap = b.snapshot_at(float(ts[0]))
        for fam in device_families(
            snap, hostname=node.name, allocations=plugin_allocations(b), layout=layout
        ):
            for labels, v in fam.samples:
                want[fmt.prefix(fam.name, labels).rstrip()] = v
    devices = {k: v for k, v in got.items() if k.startswith(("DCGM_", "gpupilot_"))}
    assert devices == want
    power = [k for k in devices if k.startswith("DCGM_FI_DEV_POWER_USAGE{")]
    assert power and all('hostname="' in k and "Hostname=" not in k for k in power)
    assert any('GPU_I_ID="' in k for k in power)  # per-instance: the MIG GPU's power on each instance
    assert not any(k.startswith("DCGM_EXP_") for k in devices)  # windowed series are not backfilled
    assert layout.selection.unreadable == ("DCGM_EXP_GPU_HEALTH_STATUS",)
