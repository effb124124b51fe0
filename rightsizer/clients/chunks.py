"""Fleet-wide queries cut into node groups, so that no single query exceeds a server's limits.

A query over every GPU of a large fleet selects hundreds of thousands of series and, over a day, a
few hundred million raw samples: past VictoriaMetrics' defaults (``-search.maxUniqueTimeseries``
300,000, ``-search.maxSamplesPerQuery`` 10⁹, ``-search.maxQueryLen`` 16 KiB) and Prometheus'
(``--query.max-samples`` 50,000,000). Every query the rightsizer sends groups its result by
``Hostname`` (or by labels that include it), so the same query restricted to a set of nodes answers
for exactly those nodes, and the answers of disjoint node sets put together are the fleet's answer.

:func:`node_groups` cuts the node list into groups under :class:`QueryLimits` (series, raw samples
and query length, each well below the engines' defaults) and :func:`scoped` adds a
``Hostname=~"a|b|…"`` matcher to every selector of a query. A fleet that fits in one group is queried
exactly as before (no matcher at all).

Queries with one series per pod (``kube_pod_owner``, ``kube_pod_labels``) have no node label to cut
by: :func:`by_pod_name` asks them whole and, when the answer is over the client's series or byte
limit, in parts by the last characters of the pods' names.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from rightsizer.clients.prometheus import PrometheusAnswerTooLarge, PrometheusClient, Sample

# the series the rightsizer reads that carry a Hostname label
SCOPED_METRICS = (
    "gpupilot:slice_activity:avg5m",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "gpupilot_device_compute_processes",
    "gpupilot_device_pod_info",
    "gpupilot_exporter_process_visibility",
    "gpupilot_mig_instance_info",
    "gpupilot_gpu_info",
)
_SELECTOR = re.compile(
    r"(?<![\w:])(" + "|".join(re.escape(m) for m in SCOPED_METRICS) + r")(?![\w:])(\{[^}]*\})?"
)
_REGEX_SPECIAL = set(r"\.+*?()|[]{}^$")

SERIES_PER_DEVICE = 2
"""Series a query may select per device: the MIG and whole-GPU activity metrics together (``INST or
WHOLE``), or one series and a restart's successor with other target labels within a chunk."""


ASSUMED_INTERVAL_S = 10.0
"""Scrape interval assumed before the history is asked (shorter than the usual 15-60 s)."""


@dataclass(frozen=True)
class QueryLimits:
    """What one query may cost at most; the defaults stay well below every engine's defaults."""

    max_series: int = 50_000
    """Series one query selects (VictoriaMetrics ``-search.maxUniqueTimeseries``: 300,000)."""
    max_samples: int = 20_000_000
    """Raw samples one query reads (Prometheus ``--query.max-samples``: 50,000,000; VictoriaMetrics
    ``-search.maxSamplesPerQuery``: 1,000,000,000)."""
    max_query_bytes: int = 12_000
    """Length of one query's expression (VictoriaMetrics ``-search.maxQueryLen``: 16 KiB). Long
    queries go in a POST body, so no URL limit applies."""
    concurrency: int = 2
    """Node groups asked at the same time (VictoriaMetrics runs ``-search.maxConcurrentRequests``
    at once, by default twice its CPUs; Prometheus ``--query.max-concurrency``: 20)."""


def _quote(node: str) -> str:
    """``node`` as a literal inside a double-quoted PromQL regex string."""
    out = []
    for ch in node:
        if ch in _REGEX_SPECIAL:
            out.append("\\\\" + ch)  # a backslash in the regex, written \\ in the string
        elif ch == '"':
            out.append('\\"')
        else:
            out.append(ch)
    return "".join(out)


def matcher(nodes: Sequence[str]) -> str:
    """The label matcher selecting exactly ``nodes`` (anchored: PromQL regexes match whole values)."""
    if len(nodes) == 1:
        return 'Hostname="' + nodes[0].replace("\\", "\\\\").replace('"', '\\"') + '"'
    return 'Hostname=~"' + "|".join(_quote(n) for n in nodes) + '"'


def scoped(query: str, nodes: Sequence[str] | None) -> str:
    """``query`` with every selector of :data:`SCOPED_METRICS` restricted to ``nodes``; unchanged for
    ``None`` (one group: the whole fleet)."""
    if nodes is None:
        return query
    m = matcher(nodes)

    def add(found: re.Match[str]) -> str:
        name, braces = found.group(1), found.group(2)
        if not braces or braces == "{}":
            return f"{name}{{{m}}}"
        return f"{name}{{{braces[1:-1]}, {m}}}"

    return _SELECTOR.sub(add, query)


def node_groups(
    devices: Mapping[str, int],
    *,
    limits: QueryLimits,
    samples_per_series: float,
    selectors: int = 3,
) -> list[tuple[str, ...] | None]:
    """Nodes (name → devices: GPUs and MIG instances) cut into consecutive groups, in name order, each
    under ``limits`` for a query reading ``samples_per_series`` raw samples of each series it selects
    and repeating the node matcher in up to ``selectors`` selectors. ``[None]`` when the whole fleet
    fits in one query (it is then sent unscoped)."""
    names = sorted(devices)
    cost = [max(1, devices[n]) * SERIES_PER_DEVICE for n in names]
    samples = max(1.0, samples_per_series)
    if len(names) <= 1 or (sum(cost) <= limits.max_series and sum(cost) * samples <= limits.max_samples):
        return [None]
    budget_len = max(200, limits.max_query_bytes - 1500) // max(1, selectors)
    groups: list[tuple[str, ...] | None] = []
    current: list[str] = []
    series = 0
    length = 0
    for name, c in zip(names, cost, strict=True):
        add_len = len(_quote(name)) + 1
        if current and (
            series + c > limits.max_series
            or (series + c) * samples > limits.max_samples
            or length + add_len > budget_len
        ):
            groups.append(tuple(current))
            current, series, length = [], 0, 0
        current.append(name)
        series += c
        length += add_len
    if current:
        groups.append(tuple(current))
    return groups


def fleet_groups(
    client: PrometheusClient,
    devices: Mapping[str, int],
    *,
    limits: QueryLimits,
    span_s: float,
    at: float,
    selectors: int = 3,
) -> list[tuple[str, ...] | None]:
    """:func:`node_groups` for queries reading ``span_s`` seconds of raw samples per series.

    The samples per series come from the history itself when they matter: a fleet that fits in one
    query even at one sample every :data:`ASSUMED_INTERVAL_S` is not probed (no extra query); a larger
    one is asked once how many ``DCGM_FI_DEV_FB_USED`` samples one node's series hold in the hour
    before ``at`` (every device has that series)."""
    guess = span_s / ASSUMED_INTERVAL_S
    groups = node_groups(devices, limits=limits, samples_per_series=guess, selectors=selectors)
    if groups == [None] or not devices:
        return groups
    per_hour = samples_per_hour(client, sorted(devices)[:1], at)
    measured = per_hour * span_s / 3600.0 if per_hour > 0 else guess
    return node_groups(devices, limits=limits, samples_per_series=measured, selectors=selectors)


def samples_per_hour(client: PrometheusClient, nodes: Sequence[str] | None, at: float) -> float:
    """The most samples one ``DCGM_FI_DEV_FB_USED`` series (every device has one) of ``nodes``
    (``None``: every node) holds in the hour before ``at``; 0 when there are none."""
    selector = "DCGM_FI_DEV_FB_USED" + (f"{{{matcher(nodes)}}}" if nodes else "")
    # 3599 s: the same count whether the engine's range is open (Prometheus 3) or closed (2.x) at its start
    probe = client.instant(f"max(count_over_time({selector}[3599s]))", at)
    return max((s.value for s in probe if math.isfinite(s.value)), default=0.0)


# Every character a pod name may end in falls in exactly one class: answers split by them add up to
# the whole answer, each holding about a seventh of the pods (names end in a random suffix).
_LAST_CHAR = ("[0-4]", "[5-9]", "[a-f]", "[g-l]", "[m-r]", "[s-z]", "[^0-9a-z]")
_MAX_SPLITS = 2
"""Two levels: 49 parts, each about 1/49 of the pods (a fleet's pods over 49 times the series limit
is refused in one line naming the limit to raise)."""


def by_pod_name(
    client: PrometheusClient, query: Callable[[str], str], at: float, *, _suffix: str = "", _depth: int = 0
) -> list[Sample]:
    """``query(matcher)`` at ``at``, asked in parts when its answer is over the client's series or byte
    limit: the pods are split by the last characters of their names (``pod=~".*[0-4]"`` …), each part
    asked alone and split again if needed. ``matcher`` is ``""`` for the whole answer, else one label
    matcher to put in the selector's braces."""
    selector = f'pod=~".*{_suffix}"' if _suffix else ""
    try:
        return client.instant(query(selector), at)
    except PrometheusAnswerTooLarge:
        if _depth >= _MAX_SPLITS:
            raise
    out: list[Sample] = []
    for cls in _LAST_CHAR:
        out += by_pod_name(client, query, at, _suffix=cls + _suffix, _depth=_depth + 1)
    if _suffix:  # a name as long as the suffix is not matched by ".*<class><suffix>"
        out += client.instant(query(f'pod=~"{_suffix}"'), at)
    return out
