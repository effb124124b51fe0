"""dcgm-exporter's counters file (``-f``/``--collectors``): which fields to publish, with which type.

The format is dcgm-exporter's ``etc/default-counters.csv``, as is: one ``DCGM field, type, help``
line per field; a line starting with ``#`` is a comment (that is how optional fields ship
disabled); blank lines and whitespace around the three parts are ignored; the help text may itself
contain commas. Types: ``gauge``, ``counter``, and ``label`` (the field's value becomes a label on
every series, e.g. ``DCGM_FI_DRIVER_VERSION``).

:func:`load` / :func:`parse` check every line (one :class:`ConfigError` naming file, line and
field); :func:`select` turns a :class:`CounterFile` into the :class:`Selection` the exposition uses,
listing the valid DCGM fields this exporter cannot read so the command line can name them once.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from exporter.contract import dcgm_names, fields
from exporter.errors import ConfigError
from gpupilot_common import yamlsafe

CounterType = Literal["gauge", "counter", "label"]
TYPES: tuple[CounterType, ...] = ("gauge", "counter", "label")
DEFAULT_FILE = "default-counters.csv"
"""The shipped copy of dcgm-exporter's default set, inside the ``exporter`` package."""
MAX_BYTES = 1 << 20
"""A counters file lists at most a few hundred fields; anything over 1 MiB is a wrong path."""


@dataclass(frozen=True)
class Counter:
    field: str
    type: CounterType
    help: str
    line: int


@dataclass(frozen=True)
class CounterFile:
    source: str
    """Where it came from, for messages (a path, or ``built-in default``)."""
    counters: tuple[Counter, ...]


@dataclass(frozen=True)
class Selection:
    """What the exposition publishes: metric fields with the file's type and help, label fields."""

    metrics: tuple[fields.FieldSpec, ...]
    labels: frozenset[str]
    unreadable: tuple[str, ...] = ()
    """Valid DCGM fields in the file this exporter cannot read (named once at start)."""
    source: str = ""


def parse(text: str, *, source: str) -> CounterFile:
    """Parse counters-file text; :class:`ConfigError` names ``source:line`` and the field."""
    out: list[Counter] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [p.strip() for p in line.split(",", 2)]
        name = parts[0]
        where = f"{source}:{number}: {name}"
        if len(parts) < 2 or not parts[1]:
            raise ConfigError(f"{where}: expected 'DCGM field, type, help' (type gauge, counter or label)")
        kind = parts[1].lower()
        if kind not in TYPES:
            raise ConfigError(f"{where}: unknown Prometheus type {parts[1]!r}; use gauge, counter or label")
        if not dcgm_names.is_dcgm_field(name) and name not in fields.RENAMED_IN_DCGM_4_6:
            raise ConfigError(
                f"{where}: unknown DCGM field; check the spelling against DCGM's field list "
                "(dcgm_fields.h) or comment the line out with '#'"
            )
        if name in seen:
            raise ConfigError(f"{where}: listed twice (first on line {seen[name]}); keep one line")
        other = _old_or_new(name)
        if other in seen:
            raise ConfigError(
                f"{where}: the same DCGM field as {other} on line {seen[other]} (DCGM 4.6 renamed it); "
                "keep one line"
            )
        seen[name] = number
        help_text = parts[2] if len(parts) > 2 and parts[2] else name
        out.append(Counter(name, kind, help_text, number))
    return CounterFile(source, tuple(out))


_NEW_BY_OLD = {old: new for new, old in fields.RENAMED_IN_DCGM_4_6.items()}


def _old_or_new(name: str) -> str:
    """The other name of a field DCGM 4.6 renamed (``""`` for any other field)."""
    return fields.RENAMED_IN_DCGM_4_6.get(name) or _NEW_BY_OLD.get(name, "")


def load(path: Path) -> CounterFile:
    try:
        size = path.stat().st_size
        if size > MAX_BYTES:
            raise ConfigError(f"{path}: {size} bytes is too large for a counters file (limit 1 MiB)")
        text = yamlsafe.read_text(path, max_bytes=MAX_BYTES)  # a regular file only, UTF-8
    except FileNotFoundError:
        raise ConfigError(f"{path}: counters file not found; check -f/--collectors") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the counters file: {exc.strerror}") from None
    return parse(text, source=str(path))


def default_text() -> str:
    return resources.files("exporter.contract").joinpath(DEFAULT_FILE).read_text(encoding="utf-8")


def default_file() -> CounterFile:
    return parse(default_text(), source=f"built-in {DEFAULT_FILE}")


def select(counter_file: CounterFile, *, extras: tuple[str, ...] = ()) -> Selection:
    """The fields to publish: the file's, in its order, then ``extras`` not already listed."""
    metrics: list[fields.FieldSpec] = []
    labels: set[str] = set()
    unreadable: list[str] = []
    for c in counter_file.counters:
        old = fields.RENAMED_IN_DCGM_4_6.get(c.field, c.field)
        if c.type == "label":
            if old in fields.LABEL_FIELDS:
                labels.add(old)  # a label's name is the one dcgm-exporter publishes
            else:
                unreadable.append(c.field)
            continue
        spec = fields.BY_NAME.get(old)
        if spec is None:
            unreadable.append(c.field)
            continue
        reads = spec.name if c.field != spec.name else ""
        metrics.append(fields.FieldSpec(c.field, c.type, spec.level, c.help, reads=reads))
    listed = {m.source for m in metrics}
    metrics.extend(fields.BY_NAME[name] for name in extras if name not in listed)
    return Selection(tuple(metrics), frozenset(labels), tuple(unreadable), counter_file.source)


def gpupilot_default() -> Selection:
    """No ``--collectors``: dcgm-exporter's default set plus :data:`fields.GPUPILOT_EXTRAS`."""
    return select(default_file(), extras=fields.GPUPILOT_EXTRAS)
