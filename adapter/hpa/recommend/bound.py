"""The service bound a recommendation must hold: ``SELECTOR OP NUMBER`` on an application signal.

``SELECTOR`` is a series name with optional matchers, published per pod (label ``pod``) or once for
the service: ``inference_queue_wait_seconds{quantile="0.95"} <= 2``,
``inference_queue_wait_seconds:p95 <= 2`` (a recording rule), ``inference_queue_depth <= 8``. ``OP``
is ``<=``, ``<``, ``>=`` or ``>`` (the strict forms are read as their closed forms: the samples
are real numbers). Per step the signal is the mean over the Ready pods (or the service's one
series); the bound holds on a day when it is broken in at most ``--bound-budget`` of that day's
steps.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from adapter.errors import ConfigError
from adapter.hpa.recommend.model import Bound
from adapter.provider.selectors import promql_escape

_BOUND = re.compile(
    r"^\s*(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?P<sel>\{[^{}]*\})?\s*(?P<op><=|<|>=|>)\s*(?P<value>\S+)\s*$"
)
_MATCHER = re.compile(r'^\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*$')


@dataclass(frozen=True)
class BoundSpec:
    name: str
    matchers: tuple[str, ...]
    bound: Bound

    def query(self, namespace: str) -> str:
        """One series per pod (``max`` over any other labels: the worst of them), in ``namespace``."""
        inner = ", ".join((*self.matchers, f'namespace="{promql_escape(namespace)}"'))
        return f"max by (pod) ({self.name}{{{inner}}})"

    @property
    def selector(self) -> str:
        return f"{self.name}{{{', '.join(self.matchers)}}}" if self.matchers else self.name


def parse(text: str, *, budget: str) -> BoundSpec:
    m = _BOUND.match(text)
    if m is None:
        raise ConfigError(
            f"--bound {text!r}: expected SELECTOR OP NUMBER, e.g. 'inference_queue_wait_seconds{{quantile=\"0.95\"}} <= 2'"
        )
    try:
        value = float(m["value"])
    except ValueError:
        raise ConfigError(f"--bound {text!r}: {m['value']!r} is not a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"--bound {text!r}: the limit must be a finite number")
    matchers: tuple[str, ...] = ()
    if m["sel"]:
        parts = [p for p in _split(m["sel"][1:-1]) if p.strip()]
        for p in parts:
            if not _MATCHER.match(p):
                raise ConfigError(f'--bound {text!r}: {p.strip()!r} is not a label matcher (label="value")')
        matchers = tuple(p.strip() for p in parts)
    return BoundSpec(
        m["name"],
        matchers,
        Bound(m["name"] + (m["sel"] or ""), m["op"] in ("<=", "<"), value, parse_budget(budget)),
    )


def parse_budget(text: str) -> float:
    raw = text.strip().removesuffix("%")
    try:
        share = float(raw) / 100.0
    except ValueError:
        raise ConfigError(
            f"--bound-budget {text!r}: expected a percentage of each day's minutes, e.g. 1%"
        ) from None
    if not (math.isfinite(share) and 0.0 <= share < 1.0):
        raise ConfigError(f"--bound-budget {text!r}: must be at least 0 % and below 100 %")
    return share


def _split(inner: str) -> list[str]:
    """Matchers separated by commas outside quotes."""
    out, cur, quoted, escaped = [], [], False, False
    for ch in inner:
        if escaped:
            cur.append(ch)
            escaped = False
        elif ch == "\\":
            cur.append(ch)
            escaped = True
        elif ch == '"':
            cur.append(ch)
            quoted = not quoted
        elif ch == "," and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out
