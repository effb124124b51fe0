"""History backfill: the simulator's values over a time range → OpenMetrics → TSDB blocks (promtool).

Streams: the range is cut into windows aligned on one of Prometheus' block ranges (2 h, 6 h or 18 h:
the longest that holds at most :data:`MAX_WINDOW_POINTS` timestamps at the step), and each window's
series into batches of nodes holding at most ``batch_samples`` samples together (the cluster series
last, batched alike); each batch's samples are computed at once (NumPy over the window's timestamps),
written to a temporary OpenMetrics file grouped by family, and handed to ``promtool tsdb
create-blocks-from openmetrics`` (one block per batch: a window of a large fleet is several blocks
side by side, which Prometheus reads as one) while the next batch is computed. promtool maps its
whole input file into memory, so its memory follows the batch, not the fleet: the backfill's memory
depends on the batch size, the scenario and ``jobs``, not on the number of days or series. The device series go through
:func:`exporter.expose.exposition.device_families` on a snapshot whose values are tags, so names and labels
are exactly the live exporter's; the tags are then replaced by the window's value arrays. This is the
only module of the simulator that runs ``promtool``.
"""

from __future__ import annotations

import itertools
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TextIO

import numpy as np

from exporter.attribute.podresources import dra
from exporter.contract import counters, fields
from exporter.contract.layout import SeriesLayout
from exporter.errors import ConfigError
from exporter.expose.exposition import LabelPairs, device_families
from gpupilot_common.timefmt import format_time
from simulator import cluster, service_series
from simulator.backend import SimBackend
from simulator.model import Scenario
from simulator.patterns import Array
from simulator.values import NodeModel

BLOCK_S = 7200
"""Prometheus' shortest block range (a head block): windows never straddle one."""
BLOCK_RANGES_S = (7200, 6 * 3600, 18 * 3600)
"""Prometheus' compaction ranges (2 h, then ×3) up to 18 h: a window is one of them, aligned on it."""
MAX_WINDOW_POINTS = 1080
"""Timestamps a window may hold: 18 h at a 60 s step. Longer windows mean fewer promtool runs (each
parses its whole file twice) and fewer, larger blocks for Prometheus to open: for the demo's two
weeks, 18 h windows cost 41 s of CPU against 57 s for 2 h ones. The bound keeps a window's arrays the
size of a 2 h window at a 7 s step."""


def window_seconds(step: float) -> int:
    """The longest of :data:`BLOCK_RANGES_S` holding at most :data:`MAX_WINDOW_POINTS` steps."""
    fitting = [r for r in BLOCK_RANGES_S if r / step <= MAX_WINDOW_POINTS]
    return max(fitting, default=BLOCK_RANGES_S[0])


DEFAULT_BATCH_SAMPLES = 1_000_000
"""About 250 MB of OpenMetrics text (a DCGM sample with its labels is ~250 bytes), which promtool
maps whole: measured 0.4-0.6 GiB per promtool process; with the default 2 jobs and the Python side
the backfill stays under 2 GiB whatever the fleet (docs/benchmarks.md). The demo fleet's windows are
one batch each."""

_TAG_BASE = float(2**52)
"""Device values are replaced by ``_TAG_BASE + i`` to find which array feeds which series."""


class BackfillError(ConfigError):
    """promtool is missing or failed; one line."""


@dataclass(frozen=True)
class BackfillSettings:
    start: float
    """First timestamp (Unix seconds), rounded up to a multiple of ``step``."""
    end: float
    """Last timestamp (inclusive)."""
    step: float
    """Seconds between samples (a scrape interval)."""
    out_dir: Path
    keep_openmetrics: bool = False
    """Keep the OpenMetrics files in ``out_dir/openmetrics`` (Prometheus ignores that folder)."""
    jobs: int = 2
    """promtool processes running at once (promtool's parser is the bottleneck: ~170k samples/s each)."""
    layout: SeriesLayout | None = None
    """Fields, MIG series and host label, as the live exporter's flags; None = its defaults."""
    batch_samples: int = DEFAULT_BATCH_SAMPLES
    """Samples one OpenMetrics file (one promtool run, one block) holds at most, give or take a
    node's series: what bounds memory (see :data:`DEFAULT_BATCH_SAMPLES`)."""


WINDOWED = frozenset(f.name for f in fields.EXP_FIELDS)
"""dcgm-exporter's own series are computed across collections; history is not backfilled for them."""


def backfill_layout(layout: SeriesLayout) -> SeriesLayout:
    """``layout`` without the ``DCGM_EXP_*`` series (see :data:`WINDOWED`)."""
    sel = layout.selection
    kept = tuple(m for m in sel.metrics if m.name not in WINDOWED)
    if len(kept) == len(sel.metrics):
        return layout
    dropped = tuple(m.name for m in sel.metrics if m.name in WINDOWED)
    selection = counters.Selection(kept, sel.labels, (*sel.unreadable, *dropped), sel.source)
    return SeriesLayout(
        selection=selection,
        mig_series=layout.mig_series,
        hostname_label=layout.hostname_label,
        xid_window_s=layout.xid_window_s,
        clock_events_window_s=layout.clock_events_window_s,
    )


@dataclass(frozen=True)
class BackfillStats:
    samples: int
    series: int
    """Series of the window that held most."""
    windows: int
    seconds: float
    blocks: int = 0
    """Blocks written: one per batch of each window."""


@dataclass
class _Run:
    """One family's chunk output: prefix (``name{labels} ``) → (value array or constant, index range)."""

    kind: str
    help: str
    series: list[tuple[str, Array | float, int, int]]


def timestamps(start: float, end: float, step: float) -> Array:
    first = math.ceil(start / step) * step
    count = math.floor((end - first) / step + 1e-9) + 1
    return first + step * np.arange(max(count, 0), dtype=np.float64)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class _Formatter:
    def __init__(self) -> None:
        self._labels: dict[LabelPairs, str] = {}

    def prefix(self, name: str, labels: LabelPairs) -> str:
        text = self._labels.get(labels)
        if text is None:
            text = self._labels[labels] = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
        return f"{name}{{{text}}} " if text else f"{name} "


class Backfiller:
    """Computes windows of samples for every node of a scenario plus its cluster series."""

    def __init__(self, scenario: Scenario, *, layout: SeriesLayout | None = None) -> None:
        self.scenario = scenario
        self.layout = backfill_layout(layout or SeriesLayout())
        self.backends = [SimBackend(scenario, node=n.name) for n in scenario.nodes]
        self.cluster_series = cluster.series(scenario)
        self._fmt = _Formatter()

    def window(self, ts: Array) -> dict[str, _Run]:
        """Every series of the window at once (tests; the backfill goes by :meth:`batches`)."""
        merged: dict[str, _Run] = {}
        for runs in self.batches(ts, max_samples=None):
            for name, run in runs.items():
                merged.setdefault(name, _Run(run.kind, run.help, [])).series.extend(run.series)
        return merged

    def batches(self, ts: Array, *, max_samples: int | None) -> Iterator[dict[str, _Run]]:
        """The window's series in batches of whole nodes (then of cluster series) holding at most
        ``max_samples`` samples each, give or take one node's; the label cache goes with each batch,
        so memory follows the batch, not the fleet."""
        runs: dict[str, _Run] = {}
        samples = 0

        def full() -> bool:
            return max_samples is not None and samples >= max_samples

        for backend in self.backends:
            before = _samples(runs)
            self._node_window(backend, ts, runs)
            samples += _samples(runs) - before
            if full():
                yield runs
                runs, samples = {}, 0
                self._fmt = _Formatter()
        dynamic = service_series.window_series(self.scenario, float(ts[0]), float(ts[-1]))
        for s in self.cluster_series + dynamic:
            i0, i1 = 0, len(ts)
            if s.alive != (-math.inf, math.inf):  # a pod's series: only while it lives
                i0, i1 = (int(i) for i in np.searchsorted(ts, s.alive, side="left"))
                if i0 >= i1:
                    continue
            run = runs.setdefault(s.family, _Run(s.kind, s.help, []))
            value: Array | float = s.value if isinstance(s.value, float) else s.value(ts)
            run.series.append((self._fmt.prefix(s.family, s.labels), value, i0, i1))
            samples += i1 - i0
            if full():
                yield runs
                runs, samples = {}, 0
                self._fmt = _Formatter()
        if runs:
            yield runs
        self._fmt = _Formatter()

    def _node_window(self, backend: SimBackend, ts: Array, runs: dict[str, _Run]) -> None:
        base = backend.model
        layouts = [0]  # a MIG reconfiguration starts a new layout: values of its own devices
        for edge in base.layout_edges(float(ts[0]) - 1e-6, float(ts[-1])):
            i = int(np.searchsorted(ts, edge, side="left"))
            if layouts[-1] < i < len(ts):
                layouts.append(i)
        layouts.append(len(ts))
        for s0, s1 in itertools.pairwise(layouts):
            self._layout_window(backend, base.at(float(ts[s0])), ts, span=(s0, s1), runs=runs)

    def _layout_window(
        self,
        backend: SimBackend,
        model: NodeModel,
        ts: Array,
        *,
        span: tuple[int, int],
        runs: dict[str, _Run],
    ) -> None:
        s0, s1 = span
        values = model.continuous(ts)
        keys = list(values.keys())
        tag_of = {k: _TAG_BASE + i for i, k in enumerate(keys)}
        cuts = [s0]
        claim_edges: list[float] = []
        if model.node.dra == "dynamic":  # a new claim (new MIG UUIDs) every claim_every
            every, epoch = model.node.claim_every, self.scenario.epoch
            k = math.floor((float(ts[s0]) - epoch) / every) + 1
            while epoch + k * every <= float(ts[s1 - 1]):
                claim_edges.append(epoch + k * every)
                k += 1
        for edge in sorted({*model.edges(float(ts[s0]) - 1e-6, float(ts[s1 - 1])), *claim_edges}):
            i = int(np.searchsorted(ts, edge, side="left"))
            if cuts[-1] < i < s1:
                cuts.append(i)
        cuts.append(s1)
        for i0, i1 in itertools.pairwise(cuts):
            t0 = float(ts[i0])
            snap = model.build(t0, model.state(t0), tag_of.__getitem__, keys)
            allocs = backend.allocations(t0)
            if isinstance(allocs, dra.Attribution):
                allocs = allocs.resolve(snap).allocations
            fams = device_families(
                snap,
                hostname=backend.hostname,
                allocations=allocs,
                layout=self.layout,
            )
            for fam in fams:
                run = runs.setdefault(fam.name, _Run(fam.kind, fam.help, []))
                for labels, v in fam.samples:
                    src: Array | float = values[keys[int(v - _TAG_BASE)]] if v >= _TAG_BASE else v
                    run.series.append((self._fmt.prefix(fam.name, labels), src, i0, i1))


def _samples(runs: dict[str, _Run]) -> int:
    return sum(i1 - i0 for run in runs.values() for _p, _v, i0, i1 in run.series)


def _type_line(name: str, kind: str) -> str:
    if kind == "counter" and name.endswith("_total"):
        return f"# TYPE {name.removesuffix('_total')} counter\n"
    return f"# TYPE {name} {'gauge' if kind != 'counter' else 'unknown'}\n"


def write_window(out: IO[str], runs: dict[str, _Run], ts: Array) -> int:
    """Write one window as OpenMetrics (families grouped, timestamps in seconds); returns samples."""
    integral = bool(np.all(ts == np.floor(ts)))
    stamps = [f" {int(t)}\n" for t in ts] if integral else [f" {t!r}\n" for t in ts.tolist()]
    samples = 0
    for name, run in runs.items():
        base = name.removesuffix("_total") if run.kind == "counter" and name.endswith("_total") else name
        out.write(f"# HELP {base} {run.help}\n")
        out.write(_type_line(name, run.kind))
        for prefix, src, i0, i1 in run.series:
            if isinstance(src, float):
                head = prefix + repr(src)
                out.write("".join([head + s for s in stamps[i0:i1]]))
                samples += i1 - i0
                continue
            part = src[i0:i1]
            finite = np.isfinite(part)
            if finite.all():
                vals = part.tolist()
                out.write("".join([prefix + repr(v) + s for v, s in zip(vals, stamps[i0:i1], strict=True)]))
                samples += i1 - i0
            else:  # a series absent part of the window (an autoscaled service's pod): no sample there
                kept = [
                    (v, s)
                    for v, s, ok in zip(part.tolist(), stamps[i0:i1], finite.tolist(), strict=True)
                    if ok
                ]
                out.write("".join([prefix + repr(v) + s for v, s in kept]))
                samples += len(kept)
    return samples


def _promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        raise BackfillError(
            "promtool not found: install Debian's prometheus package ('sudo apt-get install prometheus') or run 'make test'"
        )
    return tool


class _Progress:
    def __init__(self, stream: TextIO | None, total: int) -> None:
        self.stream, self.total, self.started = stream, max(total, 1), time.monotonic()
        self._last = 0.0
        self._tty = bool(stream is not None and stream.isatty())

    def update(self, done: int, samples: int, *, final: bool = False) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if not final and not self._tty and now - self._last < 5.0:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-9)
        frac = done / self.total
        eta = elapsed * (1 - frac) / frac if frac > 0 else 0.0
        line = (
            f"backfill: {100 * frac:5.1f}%  {samples / 1e6:8.2f}M samples  "
            f"{samples / elapsed / 1e3:7.0f}k samples/s  ETA {int(eta) // 60}:{int(eta) % 60:02d}"
        )
        end = "\n" if final or not self._tty else ""
        self.stream.write(("\r" if self._tty else "") + line + end)
        self.stream.flush()


def run(
    scenario: Scenario,
    settings: BackfillSettings,
    *,
    progress: TextIO | None = sys.stderr,
    on_window: Callable[[float], None] | None = None,
) -> BackfillStats:
    """Backfill ``settings.start``..``settings.end`` into ``settings.out_dir``."""
    tool = _promtool()
    ts_all_first = math.ceil(settings.start / settings.step) * settings.step
    if ts_all_first > settings.end:
        raise BackfillError(
            f"no sample between {format_time(settings.start)} and {format_time(settings.end)}"
        )
    existing = _blocks_in(settings.out_dir)
    if existing:
        raise BackfillError(
            f"{settings.out_dir} already holds {existing} TSDB blocks; remove it or choose another --out "
            "(a second backfill would duplicate every sample)"
        )
    keep_dir = settings.out_dir / "openmetrics"
    try:
        settings.out_dir.mkdir(parents=True, exist_ok=True)
        if settings.keep_openmetrics:
            keep_dir.mkdir(exist_ok=True)
    except OSError as exc:
        raise BackfillError(
            f"--out {settings.out_dir}: cannot create the data directory "
            f"({exc.strerror or exc}); give a directory path"
        ) from None
    filler = Backfiller(scenario, layout=settings.layout)
    span = window_seconds(settings.step)
    first_block = math.floor(ts_all_first / span) * span
    windows = list(range(int(first_block), int(settings.end) + 1, span))
    bar = _Progress(progress, len(windows))
    started = time.monotonic()
    total = 0
    series = 0
    blocks = 0
    pending: deque[tuple[subprocess.Popen[bytes], Path]] = deque()
    with tempfile.TemporaryDirectory(prefix="gpupilot-backfill-") as tmp:
        try:
            for n, w in enumerate(windows):
                ts = timestamps(
                    max(float(w), settings.start), min(float(w + span) - 1e-3, settings.end), settings.step
                )
                in_window = 0
                for b, runs in enumerate(filler.batches(ts, max_samples=settings.batch_samples)):
                    # distinct series: a series cut at a start, an end or a fault has several runs
                    in_window += len({prefix for r in runs.values() for prefix, *_ in r.series})
                    target = (keep_dir if settings.keep_openmetrics else Path(tmp)) / f"window-{w}-{b}.om"
                    with target.open("w", buffering=1 << 20) as fh:
                        total += write_window(fh, runs, ts)
                        fh.write("# EOF\n")
                    del runs
                    while len(pending) >= max(settings.jobs, 1):
                        _finish(pending.popleft(), settings.keep_openmetrics)
                    pending.append((_start_promtool(tool, target, settings.out_dir, span), target))
                    blocks += 1
                series = max(series, in_window)
                if on_window is not None:
                    on_window(float(w))
                bar.update(n + 1, total)
            while pending:
                _finish(pending.popleft(), settings.keep_openmetrics)
        finally:
            for proc, _ in pending:
                proc.kill()
                proc.wait()
    bar.update(len(windows), total, final=True)
    return BackfillStats(total, series, len(windows), time.monotonic() - started, blocks)


def _blocks_in(directory: Path) -> int:
    if not directory.is_dir():
        return 0
    return sum(
        1 for p in directory.iterdir() if p.is_dir() and len(p.name) == 26 and (p / "meta.json").exists()
    )


def _start_promtool(tool: str, source: Path, out_dir: Path, span: int) -> subprocess.Popen[bytes]:
    """One block for the window: promtool cuts at the longest block range within its maximum."""
    cmd = [
        tool,
        "tsdb",
        "create-blocks-from",
        "openmetrics",
        f"--max-block-duration={span // 3600}h",
        str(source),
        str(out_dir),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def _finish(pending: tuple[subprocess.Popen[bytes], Path], keep: bool) -> None:
    proc, source = pending
    _, err = proc.communicate()
    if proc.returncode != 0:
        tail = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        raise BackfillError(f"promtool create-blocks-from openmetrics {source.name} failed: {tail}")
    if not keep:
        source.unlink(missing_ok=True)
