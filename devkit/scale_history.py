"""A large synthetic GPU fleet's history streamed straight into VictoriaMetrics' ``/api/v1/import``.

For the rightsizer at scale (``bench/scale.py``, the chunking tests): ``nodes`` nodes of 8 GPUs
(A100 40GB, H100 80GB, H200; 5 % whole GPUs held by training pods, 10 % of nodes under
``mig.strategy=single``, the rest a mix of MIG layouts; 60 % of instances held by Deployment pods),
from a seed, over ``days`` days at one sample every ``step`` seconds (default 300 s: the analysis's
15-minute rolling mean then averages three samples, the report's 5-minute means one).

Series, with the labels the exporter and kube-state-metrics publish (what ``plan`` and ``report``
read): ``gpupilot_gpu_info``, ``gpupilot_mig_instance_info``, ``gpupilot_device_pod_info``,
``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (MIG instances of Hopper GPUs), ``DCGM_FI_DEV_GPU_UTIL`` (whole
GPUs), ``DCGM_FI_DEV_FB_USED`` and ``gpupilot_device_compute_processes`` (every device),
``gpupilot_exporter_process_visibility`` and ``kube_node_labels`` (nodes), ``kube_pod_owner`` (pods).
A100 MIG instances have no profiling series (as in the small test history): their idleness comes
from compute processes.

Each series is one JSON line holding all its timestamps and values (VictoriaMetrics' fastest text
import); lines are produced node by node into a chunked POST, so memory stays flat whatever the
fleet size. Activity comes from a pool of precomputed daily patterns (idle, light, medium, heavy,
bursty), picked per device from the seed: the fleet is varied but the generator spends its time on
writing, not on arithmetic.
"""

from __future__ import annotations

import json
import math
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mig_geometry.catalogue import GpuModel, find_model
from mig_geometry.placement import place

MODELS = (("A100 40GB", 0.4), ("H100 80GB", 0.4), ("H200", 0.2))
MIXED_LAYOUTS = (
    ((1, 1, 2, 3), 0.5),
    ((1,) * 7, 0.2),
    ((2, 2, 2), 0.1),
    ((3, 3), 0.1),
    ((3, 1, 1, 1, 1), 0.1),
)
SINGLE_LAYOUTS = (((1,) * 7, 0.6), ((2, 2, 2), 0.4))
PATTERNS = 96
"""Distinct activity patterns per class."""
NODES_PER_REQUEST = 200


@dataclass(frozen=True)
class ImportResult:
    nodes: int
    series: int
    samples: int
    bytes_sent: int
    seconds: float
    per_metric: dict[str, int]
    """Series of each metric name."""


def _pick(rng: random.Random, table: tuple[tuple[object, float], ...]) -> object:
    return rng.choices([t for t, _ in table], weights=[w for _, w in table])[0]


def _by_compute(model: GpuModel, compute: int) -> str:
    for p in model.profiles:
        if (
            p.compute_slices == compute
            and (compute != 1 or p.memory_slices == 1)
            and not p.name.endswith("+me")
        ):
            return p.name
    raise ValueError(f"{model.key}: no {compute}g profile")


class _Patterns:
    """Value strings (comma-joined, shared by many series) for ``n`` samples ``step`` seconds apart."""

    def __init__(self, n: int, step: float, first: float, seed: int) -> None:
        self.n = n
        rng = random.Random(seed ^ 0x5CA1E)
        hours = [((first + i * step) % 86400) / 3600.0 for i in range(n)]
        self.activity: dict[str, list[str]] = {}
        for klass, (lo, hi) in {
            "idle": (0.0, 0.03),
            "light": (0.05, 0.2),
            "medium": (0.2, 0.6),
            "heavy": (0.6, 0.95),
        }.items():
            self.activity[klass] = [self._diurnal(rng, hours, rng.uniform(lo, hi)) for _ in range(PATTERNS)]
        self.activity["bursty"] = [self._bursty(rng, hours, step) for _ in range(PATTERNS)]
        self._const: dict[str, str] = {}

    def _diurnal(self, rng: random.Random, hours: list[float], level: float) -> str:
        phase = rng.uniform(0, 24)
        vals = (level * (0.75 + 0.25 * math.sin(2 * math.pi * (h - phase) / 24)) for h in hours)
        return ",".join(f"{min(1.0, max(0.0, v + rng.uniform(-0.01, 0.01))):.2f}" for v in vals)

    def _bursty(self, rng: random.Random, hours: list[float], step: float) -> str:
        """Nearly idle, but a 30-minute burst at 90 % once a day: sized for the burst, never idle."""
        at = rng.uniform(0, 23)
        span = 0.5
        return ",".join("0.90" if at <= h < at + span else "0.01" for h in hours)

    def const(self, value: str) -> str:
        out = self._const.get(value)
        if out is None:
            out = self._const[value] = ",".join([value] * self.n)
        return out


def _line(name: str, labels: dict[str, str], values: str, timestamps: str) -> bytes:
    metric = json.dumps({"__name__": name, **labels}, separators=(",", ":"))
    return f'{{"metric":{metric},"values":[{values}],"timestamps":[{timestamps}]}}\n'.encode()


def node_lines(n: int, rng: random.Random, pat: _Patterns, timestamps: str) -> Iterator[bytes]:
    """Every series of node ``n`` as JSON lines."""
    model = find_model(str(_pick(rng, MODELS)))
    assert model is not None
    name = f"node-{n:05d}"
    single = rng.random() < 0.1
    node_shape = _pick(rng, SINGLE_LAYOUTS)
    one = pat.const("1")
    zero = pat.const("0")
    yield _line("gpupilot_exporter_process_visibility", {"Hostname": name}, one, timestamps)
    yield _line(
        "kube_node_labels",
        {
            "node": name,
            "label_nvidia_com_mig_strategy": "single" if single else "mixed",
            "label_nvidia_com_mig_config": "",
        },
        one,
        timestamps,
    )
    deployment = 0
    owned: set[tuple[str, str]] = set()
    for g in range(8):
        base = {
            "Hostname": name,
            "gpu": str(g),
            "UUID": f"GPU-{n:05d}-{g}",
            "modelName": f"NVIDIA {model.key}",
            "device": f"nvidia{g}",
        }
        whole = not single and rng.random() < 0.05
        info = {
            **base,
            "pci_device_id": f"0x{model.device_id:04x}",
            "mig_mode": "disabled" if whole else "enabled",
            "memory_total_mib": str(model.memory_mib),
        }
        yield _line("gpupilot_gpu_info", info, one, timestamps)
        if whole:
            pod = {"namespace": "train", "pod": f"{name}-whole-{g}", "container": "main"}
            yield _line("gpupilot_device_pod_info", {**base, **pod}, one, timestamps)
            util = rng.choice(pat.activity[rng.choice(("light", "medium", "heavy"))])
            # DCGM_FI_DEV_GPU_UTIL is a percentage: the same pattern scaled (0.37 → 37).
            pct = ",".join(str(round(float(v) * 100)) for v in util.split(","))
            yield _line("DCGM_FI_DEV_GPU_UTIL", {**base, **pod}, pct, timestamps)
            yield _line(
                "DCGM_FI_DEV_FB_USED",
                {**base, **pod},
                pat.const(str(round(model.memory_mib * 0.6))),
                timestamps,
            )
            yield _line("gpupilot_device_compute_processes", {**base, **pod}, one, timestamps)
            owned.add(("train", pod["pod"]))
            continue
        shape = node_shape if single else _pick(rng, MIXED_LAYOUTS)
        assert isinstance(shape, tuple)
        counts: dict[str, int] = {}
        for c in shape:
            counts[_by_compute(model, c)] = counts.get(_by_compute(model, c), 0) + 1
        placed = place(model, counts).placed
        assert placed is not None
        for gi, pl in enumerate(placed, 1):
            inst = {**base, "GPU_I_PROFILE": pl.profile.name, "GPU_I_ID": str(gi)}
            yield _line(
                "gpupilot_mig_instance_info",
                {
                    **inst,
                    "compute_instance_id": "0",
                    "placement_start": str(pl.start),
                    "placement_size": str(pl.size),
                    "mig_uuid": f"MIG-{n:05d}-{g}-{gi}",
                },
                one,
                timestamps,
            )
            labels = dict(inst)
            allocated = rng.random() < 0.6
            if allocated:
                if rng.random() < 0.5:
                    deployment += 1
                pod_name = f"{name}-d{deployment}-{g}{gi}-x{rng.randrange(36**5):05x}"
                labels |= {"namespace": "serve", "pod": pod_name, "container": "main"}
                yield _line("gpupilot_device_pod_info", labels, one, timestamps)
                owned.add(("serve", pod_name))
                klass = str(
                    _pick(
                        rng,
                        (("idle", 0.25), ("light", 0.3), ("medium", 0.2), ("heavy", 0.15), ("bursty", 0.1)),
                    )
                )
            else:
                klass = "idle"
            activity = rng.choice(pat.activity[klass]) if allocated else pat.const("0")
            if model.key != "A100 40GB":
                yield _line("DCGM_FI_PROF_GR_ENGINE_ACTIVE", labels, activity, timestamps)
            fb = round(pl.profile.memory_mib * (rng.uniform(0.1, 0.75) if allocated else 0.0))
            yield _line("DCGM_FI_DEV_FB_USED", labels, pat.const(str(fb)), timestamps)
            busy = allocated and klass != "idle"
            yield _line("gpupilot_device_compute_processes", labels, one if busy else zero, timestamps)
    for ns, pod_name in sorted(owned):
        owner = pod_name.rsplit("-", 2)[0] if ns == "serve" else pod_name
        yield _line(
            "kube_pod_owner",
            {
                "namespace": ns,
                "pod": pod_name,
                "owner_kind": "ReplicaSet" if ns == "serve" else "Job",
                "owner_name": f"{owner}-7d9c5b" if ns == "serve" else owner,
                "owner_is_controller": "true",
            },
            one,
            timestamps,
        )


def import_fleet(
    url: str,
    *,
    nodes: int,
    end: float,
    days: float = 14.0,
    step: float = 300.0,
    seed: int = 7,
    progress: Callable[[str], None] | None = None,
) -> ImportResult:
    """Stream the fleet's history over ``(end - days, end]`` into VictoriaMetrics at ``url``."""
    started = time.monotonic()
    n = int(days * 86400 // step)
    first = end - (n - 1) * step
    ts = ",".join(str(round((first + i * step) * 1000)) for i in range(n))
    pat = _Patterns(n, step, first, seed)
    rng = random.Random(seed)
    per_metric: dict[str, int] = {}
    counted = [0, 0]  # bytes, series

    def body(lo: int, hi: int) -> Iterator[bytes]:
        for k in range(lo, hi):
            lines = list(node_lines(k, rng, pat, ts))
            for line in lines:
                name = line[len(b'{"metric":{"__name__":"') :].split(b'"', 1)[0].decode()
                per_metric[name] = per_metric.get(name, 0) + 1
            buf = b"".join(lines)
            counted[0] += len(buf)
            counted[1] += len(lines)
            yield buf

    for lo in range(0, nodes, NODES_PER_REQUEST):
        hi = min(nodes, lo + NODES_PER_REQUEST)
        # an iterable body without Content-Length: urllib sends it chunked, one node at a time
        req = urllib.request.Request(
            f"{url}/api/v1/import",
            data=body(lo, hi),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                r.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace").strip().splitlines()[:1] or [str(exc.code)]
            raise RuntimeError(f"victoria-metrics refused an import: {detail[0]}") from None
        if progress is not None:
            el = time.monotonic() - started
            progress(
                f"import: {hi:,}/{nodes:,} nodes, {counted[1]:,} series, {counted[0] / 2**30:.1f} GiB, {el:.0f} s"
            )
    with urllib.request.urlopen(f"{url}/internal/force_flush", timeout=600) as r:
        r.read()
    sent, series = counted
    return ImportResult(nodes, series, series * n, sent, time.monotonic() - started, per_metric)
