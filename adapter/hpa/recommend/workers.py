"""Replays spread over worker processes: a kernel batch split in parts, engine replays side by side.

The workers are forked once the history is read (the Prometheus client closed), so they inherit the
service model and the timeline instead of receiving them; each job sends back only its figures.
With one job, or where ``fork`` is unavailable, everything runs in this process.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import numpy as np

from adapter.hpa import replay
from adapter.hpa.recommend import kernel
from adapter.hpa.recommend.model import ModelledLoad, ServiceModel, tables
from adapter.hpa.timeline import Timeline
from hpa_controller import decide as hpa


@dataclass(frozen=True)
class Shared:
    model: ServiceModel
    line: Timeline
    days: np.ndarray
    """Day index of each step."""
    ndays: int
    first: int
    requests: dict[str, int]
    search_steps: int
    """The kernel replays the first this many steps (the training days: the search never looks
    further; the engine replays the whole window)."""
    search_model: ServiceModel


@dataclass(frozen=True)
class Figures:
    replica_steps: np.ndarray
    broken: np.ndarray
    ups: int
    downs: int
    extrapolated: int
    at_max: int
    replicas: np.ndarray | None = None
    """Replicas after each step (engine replays only)."""


_SHARED: dict[str, Shared] = {}
"""The run's inputs, set before the workers fork (they inherit it)."""


def _kernel(models: Sequence[hpa.HpaModel]) -> list[Figures]:
    s = _SHARED["run"]
    res = kernel.run(
        s.search_model, models, first=s.first, days=s.days[: s.search_steps], requests=s.requests
    )
    pad = s.ndays - res.replica_steps.shape[1]
    if pad > 0:  # the held-out days: not replayed by the search
        res.replica_steps = np.pad(res.replica_steps, ((0, 0), (0, pad)))
        res.broken = np.pad(res.broken, ((0, 0), (0, pad)))
    return [
        Figures(
            res.replica_steps[k],
            res.broken[k],
            int(res.ups[k]),
            int(res.downs[k]),
            int(res.extrapolated[k]),
            int(res.at_max[k]),
        )
        for k in range(len(models))
    ]


def _engine(model: hpa.HpaModel) -> Figures:
    s = _SHARED["run"]
    load = ModelledLoad(s.model, model, width=max(model.max_replicas, s.first) + 1)
    result = replay.replay(model, s.line, label="", requests=s.requests, startup=s.model.startup, load=load)
    reps = np.array([st.replicas for st in result.steps], dtype=np.int64)
    broken = np.array([st.broken for st in result.steps])
    return Figures(
        np.bincount(s.days, weights=reps.astype(np.float64), minlength=s.ndays),
        np.bincount(s.days, weights=broken, minlength=s.ndays),
        int(np.sum(np.diff(reps) > 0)),
        int(np.sum(np.diff(reps) < 0)),
        load.extrapolated,
        int(np.sum(reps >= model.max_replicas)),
        reps,
    )


class Workers:
    def __init__(self, shared: Shared, *, jobs: int) -> None:
        _SHARED["run"] = shared
        self.jobs = jobs if "fork" in multiprocessing.get_all_start_methods() else 1
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        if self.jobs > 1:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.jobs, mp_context=multiprocessing.get_context("fork")
            )

    def __enter__(self) -> Workers:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
        _SHARED.clear()

    def kernel(self, models: Sequence[hpa.HpaModel]) -> list[Figures]:
        if not models:
            return []
        if self._pool is None or len(models) < 2 * self.jobs:
            return _kernel(models)
        parts = [list(models[k :: self.jobs]) for k in range(self.jobs)]
        results = list(self._pool.map(_kernel, parts))
        out: list[Any] = [None] * len(models)
        for k, part in enumerate(results):
            out[k :: self.jobs] = part
        return out

    def engine(self, models: Sequence[hpa.HpaModel]) -> list[Figures]:
        if self._pool is None or len(models) < 2:
            return [_engine(m) for m in models]
        return list(self._pool.map(_engine, models))


def warm(shared: Shared, widths: Sequence[int]) -> None:
    """Build the models' lookup tables before forking, so every worker shares them."""
    for w in widths:
        tables(shared.model, w)
        tables(shared.search_model, w)
