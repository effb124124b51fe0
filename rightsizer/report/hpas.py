"""The report's autoscaling section: one line per HPA from ``gpupilot-adapter recommend-hpa -o json``.

The rightsizer does not replay HPAs itself: the adapter holds the metrics' PromQL (its config) and
the controller replay, so the report reads what recommend-hpa wrote — files, or folders of
``*.json`` files — checked at the door (every field it shows, with its type and range; one
:class:`HpaRecommendationError` line naming the file, line and field otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupilot_common import checked
from gpupilot_common.section import Section
from rightsizer.errors import InputError

MAX_BYTES = 16 * 2**20
MAX_FILES = 500


class HpaRecommendationError(InputError):
    """A recommend-hpa document the report was given is unreadable or not one."""


@dataclass(frozen=True)
class HpaLine:
    hpa: str
    """``namespace/name``."""
    target: str
    start: str
    end: str
    held_out_days: tuple[str, ...]
    bound: str
    current_gpu_hours: float
    """On the held-out days, the current configuration replayed."""
    recommended_gpu_hours: float | None
    saving_percent: float | None
    changes: str
    """``inference_queue_depth 3 → 2.4; scale-down window 900s → 60s; …``."""
    bound_minutes: tuple[float, ...]
    """Minutes the bound was broken on each held-out day, under the recommendation (or the current
    configuration when nothing met it)."""
    trusted: bool
    model_error_percent: float


def paths(given: Sequence[Path]) -> list[Path]:
    """The files: each given file, and the ``*.json`` of each given folder (sorted)."""
    out: list[Path] = []
    for p in given:
        if p.is_dir():
            out += sorted(q for q in p.glob("*.json") if q.is_file())
        else:
            out.append(p)
    if len(out) > MAX_FILES:
        raise HpaRecommendationError(f"{len(out)} recommend-hpa files given; at most {MAX_FILES} are read")
    return out


def load(given: Sequence[Path]) -> tuple[HpaLine, ...]:
    return tuple(read(p) for p in paths(given))


def read(path: Path) -> HpaLine:
    doc = checked.load_json(
        path, error=HpaRecommendationError, what="recommend-hpa output", max_bytes=MAX_BYTES
    )
    top = doc.root("a recommend-hpa -o json document")
    h = _section(top, "hpa")
    bound = _section(top, "bound")
    current = _section(top, "current")
    error = _section(top, "replay_error")
    held = tuple(str(d) for d in _list(top, "held_out_days"))
    op = bound.text("op")
    if op not in ("<=", ">="):
        raise bound.fail("op", f"{op!r} is not <= or >=")
    bound_text = (
        f"{bound.text('signal')} {op} {bound.number('value', minimum=None):g}, broken at most "
        f"{bound.number('budget_share', maximum=1.0) * 100:g} % of each day"
    )
    cur_held = _section(current, "held_out")
    cur_hours = cur_held.number("gpu_hours", maximum=1e12)
    rec_raw = top.raw("recommended")
    recommended = None if rec_raw is None else top.at(rec_raw, "recommended")
    if recommended is None:
        rec_hours = saving = None
        minutes = _minutes(cur_held, held)
        changes = "no configuration met the bound on every day"
    else:
        rec_held = _section(recommended, "held_out")
        rec_hours = rec_held.number("gpu_hours", maximum=1e12)
        saving = recommended.number("saving_percent", minimum=-1e6, maximum=100.0)
        minutes = _minutes(rec_held, held)
        changes = _changes(_section(current, "configuration"), _section(recommended, "configuration"))
    return HpaLine(
        hpa=f"{h.text('namespace')}/{h.text('name')}",
        target=h.text("target"),
        start=top.text("start"),
        end=top.text("end"),
        held_out_days=held,
        bound=bound_text,
        current_gpu_hours=cur_hours,
        recommended_gpu_hours=rec_hours,
        saving_percent=saving,
        changes=changes,
        bound_minutes=minutes,
        trusted=error.boolean("trusted", False),
        model_error_percent=error.number("replica_hours_percent", minimum=-1e6, maximum=1e6),
    )


def _section(parent: Section, key: str) -> Section:
    found = parent.section(key)
    if found is None:
        raise parent.fail(key, "required (is this recommend-hpa -o json output?)")
    return found


def _list(parent: Section, key: str) -> list[object]:
    return parent.sequence(key, required=True)


def _minutes(held: Section, days: tuple[str, ...]) -> tuple[float, ...]:
    per = held.named("bound_broken_minutes")
    if per is None:
        raise held.fail("bound_broken_minutes", "required: minutes per held-out day")
    return tuple(per.number(d, 0.0, maximum=1440.0) for d in days)


def _changes(current: Section, recommended: Section) -> str:
    out = []
    cur_t, rec_t = current.named("targets"), recommended.named("targets")
    cur_targets = {k: cur_t.number(k, minimum=None) for k in cur_t.data} if cur_t else {}
    rec_targets = {k: rec_t.number(k, minimum=None) for k in rec_t.data} if rec_t else {}
    for name, value in cur_targets.items():
        if name not in rec_targets:
            out.append(f"{name} left out")
        elif not math.isclose(rec_targets[name], value):
            out.append(f"{name} {value:g} → {rec_targets[name]:g}")
    for key, what in (("minReplicas", "minReplicas"), ("maxReplicas", "maxReplicas")):
        a, b = current.integer(key, minimum=0), recommended.integer(key, minimum=0)
        if a != b:
            out.append(f"{what} {a} → {b}")
    cur_b, rec_b = current.raw("behavior"), recommended.raw("behavior")
    if cur_b != rec_b:
        out.append("behaviour: " + _behaviour(recommended))
    return "; ".join(out) or "as written"


def _behaviour(configuration: Section) -> str:
    raw = configuration.raw("behavior")
    if raw is None:
        return "the controller's defaults"
    b = configuration.at(raw, "behavior")
    parts = []
    for key, what in (("scaleUp", "up"), ("scaleDown", "down")):
        r = _section(b, key)
        window = r.integer("stabilizationWindowSeconds", 0, maximum=3600)
        pols = []
        for p in r.sections("policies"):
            kind, value, period = (
                p.text("type"),
                p.integer("value", minimum=1),
                p.integer("periodSeconds", minimum=1),
            )
            pols.append(f"{value}{'%' if kind == 'Percent' else ' pods'}/{period}s")
        parts.append(f"{what} {window}s window, {' or '.join(pols) or 'no policy'}")
    return "; ".join(parts)
