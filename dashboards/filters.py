"""The ``$cluster`` and ``$job`` variables of every dashboard, put into each panel's PromQL.

Every metric selector of a query gets ``cluster=~"$cluster"`` (a series without the label matches
``All``, whose value is ``.*``: one cluster without external labels is unaffected). Selectors of the
exporter's own series (``DCGM_*`` and ``gpupilot_`` families other than the adapter's and the
rightsizer's) also get ``job=~"$job"``: during a migration dcgm-exporter and gpupilot both publish
``DCGM_FI_*``, and a dashboard that sums both counts every GPU twice. Recording rules (names with a
``:``) aggregate the raw series by device with ``max``, so they carry no ``job`` and count each GPU
once whatever the variable says.

The rewriter knows only what our queries use: metric names with or without ``{…}`` matchers, function
and aggregation calls, ``by``/``without``/``on``/``ignoring``/``group_left``/``group_right`` label
lists, binary operators and keywords, strings, numbers, durations and Grafana's ``$variables``."""

from __future__ import annotations

import re

CLUSTER = 'cluster=~"$cluster"'
JOB = 'job=~"$job"'
LABEL_LISTS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "Inf", "NaN"})
AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
     "quantile", "limitk", "limit_ratio"}
)  # fmt: skip
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>\w+)\)$", re.S)


def exporter_series(name: str) -> bool:
    """A series the exporters (ours and dcgm-exporter) publish: it gets the ``job`` filter too."""
    if ":" in name:
        return False
    if name.startswith("DCGM_"):
        return True
    return name.startswith("gpupilot_") and not name.startswith(
        ("gpupilot_adapter_", "gpupilot_rightsizer_", "gpupilot_build_info")
    )


def matchers_for(name: str) -> list[str]:
    return [CLUSTER, JOB] if exporter_series(name) else [CLUSTER]


def _skip_string(expr: str, i: int) -> int:
    quote = expr[i]
    i += 1
    while i < len(expr) and expr[i] != quote:
        i += 2 if expr[i] == "\\" else 1
    return i + 1


def _skip_group(expr: str, i: int, open_: str, close: str) -> int:
    """From ``expr[i] == open_`` to just past its matching ``close`` (strings skipped)."""
    depth = 0
    while i < len(expr):
        c = expr[i]
        if c in "\"'`":
            i = _skip_string(expr, i)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced {open_!r} in {expr!r}")


def _next_non_space(expr: str, i: int) -> int:
    while i < len(expr) and expr[i].isspace():
        i += 1
    return i


def add_filters(expr: str) -> str:
    """``expr`` with the cluster (and, for exporter series, job) matchers in every metric selector."""
    out: list[str] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c in "\"'`":
            j = _skip_string(expr, i)
            out.append(expr[i:j])
            i = j
        elif c == "[":  # a range or subquery duration
            j = _skip_group(expr, i, "[", "]")
            out.append(expr[i:j])
            i = j
        elif c == "$":  # a Grafana variable
            m = _NAME.match(expr, i + 1)
            j = m.end() if m else i + 1
            out.append(expr[i:j])
            i = j
        elif c.isdigit() or (c == "." and i + 1 < len(expr) and expr[i + 1].isdigit()):
            j = i
            while j < len(expr) and (expr[j].isalnum() or expr[j] in "._"):
                j += 1
            out.append(expr[i:j])
            i = j
        elif (m := _NAME.match(expr, i)) is not None:
            name, j = m.group(), m.end()
            k = _next_non_space(expr, j)
            following = expr[k] if k < len(expr) else ""
            if name in LABEL_LISTS and following == "(":
                end = _skip_group(expr, k, "(", ")")
                out.append(expr[i:end])
                i = end
            elif following == "(" or name in KEYWORDS or name in AGGREGATIONS:
                out.append(name)
                i = j
            elif following == "{":
                end = _skip_group(expr, k, "{", "}")
                inner = expr[k + 1 : end - 1].strip()
                matchers = ", ".join([*matchers_for(name), *([inner] if inner else [])])
                out.append(f"{name}{{{matchers}}}")
                i = end
            else:
                out.append(f"{name}{{{', '.join(matchers_for(name))}}}")
                i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def variable_query(query: str) -> str:
    """A variable's ``label_values(selector, label)`` with the selector filtered by cluster (and job)."""
    m = _LABEL_VALUES.match(query.strip())
    if m is None:
        return query
    return f"label_values({add_filters(m['selector'].strip())}, {m['label']})"
