"""Search on the first days, validate on the held-out ones, and score every printed figure with the
replay engine itself.

The window's days are 24-hour blocks counted back from its end; the last ``held_out`` are held out.
Each stage (:mod:`adapter.hpa.recommend.candidates`) runs through the vectorised replay
(:mod:`adapter.hpa.recommend.kernel`) over the training days, split over ``jobs`` processes; a candidate is **feasible** when the
bound is broken in at most the budget on every training day, and candidates are ranked by their
training replica-hours. The cheapest feasible candidates are then replayed one by one with
:func:`adapter.hpa.replay.replay` (the engine replay-hpa runs) until one also holds the bound on every
held-out day: that one is recommended, and its held-out figures are the engine's.

The current configuration is replayed the same way; on the training days its replayed replicas and
broken-bound minutes are compared with what was recorded: the model's own error.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from adapter.hpa.recommend import candidates as cands
from adapter.hpa.recommend import workers
from adapter.hpa.recommend.candidates import Candidate
from adapter.hpa.recommend.model import ServiceModel
from adapter.hpa.timeline import Timeline
from hpa_controller import decide as hpa

DAY_S = 86400.0
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
ENGINE_TRIES = 8
"""Candidates replayed by the engine, cheapest first, looking for one that holds on held-out days."""


@dataclass(frozen=True)
class Days:
    index: I64
    """Day of each step (0 = the window's first day)."""
    held_out: npt.NDArray[np.bool_]
    """Per day."""
    steps: I64
    """Steps per day."""

    @property
    def training(self) -> npt.NDArray[np.bool_]:
        return ~self.held_out


def split(times: F64, *, held_out: int) -> Days:
    end = float(times[-1])
    span_days = max(1, int(np.floor((end - float(times[0])) / DAY_S + 1e-9)))
    back = np.minimum(
        np.floor((end - times) / DAY_S).astype(np.int64), span_days - 1
    )  # a last step joins its day
    ndays = int(back.max()) + 1
    index = (ndays - 1) - back
    held = np.zeros(ndays, dtype=bool)
    held[ndays - held_out :] = True
    return Days(index, held, np.bincount(index, minlength=ndays).astype(np.int64))


@dataclass
class Score:
    """One configuration's figures per day (engine or kernel)."""

    replica_steps: F64
    broken_steps: F64
    ups: int
    downs: int
    extrapolated: int = 0

    def replica_hours(self, days: Days, which: npt.NDArray[np.bool_], step: float) -> float:
        return float(self.replica_steps[which].sum()) * step / 3600.0

    def broken_share(self, days: Days) -> F64:
        return np.asarray(self.broken_steps / np.maximum(days.steps, 1), dtype=np.float64)

    def holds(self, days: Days, which: npt.NDArray[np.bool_], budget: float) -> bool:
        return bool(np.all(self.broken_share(days)[which] <= budget + 1e-12))


@dataclass
class Outcome:
    current: Score
    current_replicas: I64
    recommended: Candidate | None
    recommended_score: Score | None
    targets_only: Candidate | None
    targets_only_score: Score | None
    candidates: int
    best_failed: tuple[Candidate, Score] | None = None
    engine_runs: int = 0


Scored = tuple[Candidate, Score, int]
"""A candidate, its figures, and its steps at maxReplicas."""


def _score(f: workers.Figures) -> Score:
    return Score(f.replica_steps, f.broken, f.ups, f.downs, f.extrapolated)


def search(
    model: ServiceModel,
    current: hpa.HpaModel,
    line: Timeline,
    days: Days,
    *,
    first: int,
    budget: float,
    changes: Sequence[str],
    requests: dict[str, int],
    jobs: int = 1,
    progress: Callable[[str], None] = lambda _: None,
) -> Outcome:
    step = model.step
    train, held = days.training, days.held_out

    def ranked(scored: Sequence[Scored]) -> list[Scored]:
        feasible = [cs for cs in scored if cs[1].holds(days, train, budget)]
        return sorted(feasible, key=lambda cs: cs[1].replica_hours(days, train, step))

    def holds(score: Score) -> bool:
        return score.holds(days, train, budget) and score.holds(days, held, budget)

    widest = max(first, math.ceil(current.max_replicas * 1.5) + 1) + 1
    training_steps = int(np.sum(days.training[days.index]))
    shared = workers.Shared(
        model,
        line,
        days.index,
        len(days.steps),
        first,
        requests,
        training_steps,
        replace(model, demand=model.demand[:training_steps], cache={}),
    )
    workers.warm(shared, [widest])
    with workers.Workers(shared, jobs=jobs) as pool:
        tried: list[Scored] = []

        def run(stage: str, batch: list[Candidate]) -> list[Scored]:
            if not batch:
                return []
            progress(f"{stage}: {len(batch)} candidates")
            figs = pool.kernel([c.model for c in batch])
            scored = [(c, _score(f), f.at_max) for c, f in zip(batch, figs, strict=True)]
            tried.extend(scored)
            return scored

        stage1 = run("targets", cands.stage_targets(model, current, changes))
        leaders = _distinct_targets(ranked(stage1), 3)
        best = [c for c, _, _ in leaders]
        if best:
            best += cands.nudged(best[0], changes)
        second = cands.stage_behaviour(best, current, changes)
        if leaders:  # the leading target set's behaviours with maxReplicas raised, other tolerances
            lead = [c for c in second if c.model.metrics == best[0].model.metrics] or best[:1]
            second += cands.stage_bounds(lead, current, changes, at_max=leaders[0][2] > 0)
        run("behaviour, bounds and tolerance", second)
        order = ranked(tried)
        own = ranked([cs for cs in stage1 if cs[0].model.behavior == current.behavior])
        progress("replaying the cheapest with the replay engine")
        # the current configuration, the cheapest candidate and the cheapest with the HPA's own
        # behaviour side by side; then further candidates one by one, only when those fail
        firsts = pool.engine(
            [current, *[recommended_model(c) for c, _, _ in order[:1]], *[c.model for c, _, _ in own[:1]]]
        )
        cur = firsts[0]
        outcome = Outcome(
            _score(cur),
            cur.replicas if cur.replicas is not None else np.zeros(0, dtype=np.int64),
            None,
            None,
            None,
            None,
            len(tried),
            engine_runs=len(firsts),
        )
        for k, (cand, _, _) in enumerate(order[:ENGINE_TRIES]):
            fig = firsts[1] if k == 0 else pool.engine([recommended_model(cand)])[0]
            outcome.engine_runs += k > 0
            if holds(_score(fig)):
                outcome.recommended, outcome.recommended_score = cand, _score(fig)
                break
        for k, (cand, _, _) in enumerate(own[:ENGINE_TRIES]):
            fig = firsts[-1] if k == 0 else pool.engine([cand.model])[0]
            outcome.engine_runs += k > 0
            if holds(_score(fig)):
                outcome.targets_only, outcome.targets_only_score = cand, _score(fig)
                break
        if outcome.recommended is None and tried:
            closest = min(tried, key=lambda cs: float(cs[1].broken_share(days).max()))[0]
            outcome.best_failed = (closest, _score(pool.engine([closest.model])[0]))
            outcome.engine_runs += 1
    return outcome


def _distinct_targets(scored: Sequence[Scored], n: int) -> list[Scored]:
    out: list[Scored] = []
    seen: set[tuple[float, ...]] = set()
    for cs in scored:
        key = tuple(s.target for s in cs[0].model.metrics)
        if key in seen:
            continue
        seen.add(key)
        out.append(cs)
        if len(out) == n:
            break
    return out


def recommended_model(candidate: Candidate) -> hpa.HpaModel:
    """The recommendation as users would write it: metrics set out of the way left out."""
    kept = tuple(s for s in candidate.model.metrics if s.name not in candidate.dropped)
    return replace(candidate.model, metrics=kept)


def progress_to_stderr(prefix: str) -> Callable[[str], None]:
    """Progress lines on stderr when it is a terminal; none otherwise, so a script or a CronJob
    reading stderr sees only the one line of a failure."""
    shown = sys.stderr.isatty()

    def say(text: str) -> None:
        if shown:
            print(f"{prefix}: {text}…", file=sys.stderr, flush=True)

    return say
