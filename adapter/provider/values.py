"""Metric values for API objects: config rule + request → PromQL → checked values keyed by object.

The one code path behind both the HTTP API and ``explain-hpa``: one call per request
(:meth:`MetricValues.for_objects`, :meth:`MetricValues.external`) returns the values that answer
it, checked (``adapter.provider.valuecheck``), picked and sorted; the caller only renders them. With a :class:`RefreshingCache`
(``serve``), a request is answered from memory: the namespace-wide query for (metric, resource,
namespace, ``metricLabelSelector``) is kept fresh in the background and indexed by object name, and
the request picks its objects from that index (``adapter.provider.refresh``). Without one (``explain-hpa``)
each call queries Prometheus directly, as follows. A ``pods/*`` request with a label
selector never puts pod names into the query: it asks Prometheus for the namespace's series (plus
``metricLabelSelector`` matchers), asks the pod source which pods the selector picks, and matches
in process — or, when the selected pods are a small part of the namespace, names them in a
set matcher sent as a POST body (never a URL). Values older than ``max_value_age`` are filtered by
the query itself (``last_over_time(…[max_value_age])``).
"""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from adapter.clients.prometheus import PrometheusClient, Sample
from adapter.config import resources
from adapter.config.mapping import AdapterConfig, ExternalRule, MetricRule
from adapter.config.resources import Resource
from adapter.errors import BadRequest, NotFound
from adapter.provider import nowait
from adapter.provider.podsource import Pod, PodSource
from adapter.provider.refresh import RefreshingCache
from adapter.provider.selectors import Selector, promql_escape, regex_alternatives, to_promql_matchers
from adapter.provider.valuecheck import ValueCheck


class ObjectValue(NamedTuple):
    """One object's value. A named tuple, not a dataclass: a refresh builds one per object of the
    namespace (5,000 in 3 ms, where a frozen dataclass took 13-18 ms)."""

    resource: Resource
    namespace: str
    """Empty for cluster-scoped objects."""
    name: str
    value: float
    timestamp: float
    window_seconds: int


@dataclass(frozen=True)
class ExternalValue:
    labels: Mapping[str, str]
    value: float
    timestamp: float
    window_seconds: int


class Memo(dict[Hashable, bytes]):
    """Scratch space that lives as long as one evaluation of a query served from memory: the API
    caches each item's JSON here, so a request joins bytes instead of encoding. ``generation`` is
    unique to the evaluation (a refresh makes a new one), so it tells whether an answer encoded from
    an earlier evaluation still holds. ``picks`` keeps, per label selector (None: every object), the
    values picked from the evaluation for the pod list the selector gave, so a repeated request
    reads the list instead of picking it again."""

    __slots__ = ("generation", "picks")

    def __init__(self) -> None:
        super().__init__()
        self.generation = next(_generations)
        self.picks: dict[Selector | None, tuple[list[Pod] | None, list[ObjectValue]]] = {}


_generations = itertools.count(1)

MAX_PICKS = 256
"""Selections kept per evaluation (``Memo.picks``); past that they are dropped and picked again."""


class CustomValues(NamedTuple):
    """A custom metrics request's answer, checked and complete: what the API renders and explain-hpa
    reads. A named tuple: one is built per request, the cheapest to build."""

    values: Sequence[ObjectValue]
    """One per object, sorted by name, each value served as is (refusals already left out). Served
    from memory the list is shared by the requests of one evaluation: read it, never change it."""
    pods: list[Pod] | None
    """The pods the selector picked (None when no selector was given); while the pod source is
    unchanged, the same list object for the same selector."""
    memo: Memo | None
    """The evaluation the values were served from (None: queried for this call alone)."""


_SELECTOR = re.compile(r"(?<![A-Za-z0-9_:])([A-Za-z_:][A-Za-z0-9_:]*)\{<<matchers>>\}(?!\s*\[)")


def render_query(template: str, *, series: str, matchers: list[str], by: str, max_age: float) -> str:
    """Fill the template. With ``max_age`` > 0 each selector the request scopes
    (``name{<<matchers>>}``) becomes ``last_over_time(name{…}[max_age])``: a series without a sample
    in that window is simply absent, at no extra cost (no second selection). Range selectors
    (``rate(x{<<matchers>>}[5m])``) are left alone: their own window already bounds the age."""
    text = template.replace("<<series>>", series).replace("<<by>>", by)
    if max_age > 0:
        text = _SELECTOR.sub(lambda m: f"last_over_time({m.group(1)}{{<<matchers>>}}[{max_age:g}s])", text)
    return text.replace("<<matchers>>", ", ".join(matchers))


class MetricValues:
    def __init__(
        self,
        *,
        config: Callable[[], AdapterConfig],
        prometheus: PrometheusClient,
        pods: PodSource | None,
        max_value_age: float,
        cache: RefreshingCache[object] | None = None,
        checks: ValueCheck | None = None,
    ) -> None:
        self._config = config
        self._checks = checks or ValueCheck()
        self._prometheus = prometheus
        self._pods = pods
        self.max_value_age = max_value_age
        self._cache = cache
        self._queries: dict[
            tuple[object, ...],
            tuple[AdapterConfig, Hashable, Callable[[], tuple[dict[str, ObjectValue], Memo]]],
        ] = {}
        """The refreshing cache's key and loader per (metric, resource, namespace, metric selector),
        kept with the config they came from: every request served from memory needs them, and
        rendering the template (a regex substitution, escaping, joining) is most of a lookup."""

    # -- custom metrics ----------------------------------------------------------------------
    def rule(self, metric: str, resource: Resource) -> tuple[MetricRule, str]:
        rule = self._config().metric(metric)
        label = rule.label_for(resource) if rule else None
        if rule is None or label is None:
            raise NotFound(f"the server could not find the metric {metric} for {resource.qualified}")
        return rule, label

    def object_query(
        self,
        *,
        metric: str,
        resource: Resource,
        namespace: str,
        name: str,
        metric_selector: Selector,
        names: list[str] | None = None,
    ) -> tuple[MetricRule, str, str]:
        """(rule, object label, PromQL) for one object (``name``) or all (``*``) in scope; ``names``
        restricts ``*`` to those objects with one set matcher (sent in a POST body, never a URL)."""
        rule, label = self.rule(metric, resource)
        matchers: list[str] = []
        by = label
        if resource.namespaced:
            ns_label = rule.labels[resources.NAMESPACES]
            matchers.append(f'{ns_label}="{promql_escape(namespace)}"')
            by = f"{ns_label}, {label}"
        if name != "*":
            matchers.append(f'{label}="{promql_escape(name)}"')
        elif names:
            matchers.append(_pod_set_matcher(label, tuple(names)))
        matchers += to_promql_matchers(metric_selector)
        query = render_query(
            rule.query, series=rule.series, matchers=matchers, by=by, max_age=self.max_value_age
        )
        return rule, label, query

    def for_objects(
        self,
        *,
        metric: str,
        resource: Resource,
        namespace: str,
        name: str,
        selector: Selector,
        metric_selector: Selector,
    ) -> CustomValues:
        """The checked values that answer one custom metrics request (``name`` ``*``: every object in
        scope, narrowed to the pods ``selector`` picks); NotFound for a named object without one."""
        picked = self._selected(resource=resource, namespace=namespace, name=name, selector=selector)
        if picked is not None and not picked:
            return CustomValues((), picked, None)
        memo: Memo | None = None
        if self._cache is not None:
            values, memo = self._from_memory(
                metric=metric,
                resource=resource,
                namespace=namespace,
                name=name,
                metric_selector=metric_selector,
                selector=selector if picked is not None else None,
                picked=picked,
            )
        else:
            values = self._queried(
                metric=metric,
                resource=resource,
                namespace=namespace,
                name=name,
                metric_selector=metric_selector,
                picked=picked,
            )
        if name != "*" and not values:
            raise self._not_found(metric, resource, namespace, name)
        return CustomValues(values, picked, memo)

    def _selected(
        self, *, resource: Resource, namespace: str, name: str, selector: Selector
    ) -> list[Pod] | None:
        """The pods a label selector picks (None without one); BadRequest where it cannot apply."""
        if selector.empty:
            return None
        if name != "*":
            raise BadRequest("labelSelector applies only to '*' (all objects), not to a named object")
        if resource != resources.PODS:
            raise BadRequest(
                f"labelSelector is supported for pods only, not {resource.qualified}; "
                "ask for a named object or leave the selector out"
            )
        if self._pods is None:
            raise BadRequest("labelSelector needs a pod source; start the adapter with --pod-source")
        return self._pods.select(namespace, selector)

    def _from_memory(
        self,
        *,
        metric: str,
        resource: Resource,
        namespace: str,
        name: str,
        metric_selector: Selector,
        selector: Selector | None,
        picked: list[Pod] | None,
    ) -> tuple[Sequence[ObjectValue], Memo]:
        """The values picked from the refreshing cache's evaluation of the namespace-wide query; a
        selection is picked once per evaluation and pod list (``Memo.picks``)."""
        index, memo = self._index(metric=metric, resource=resource, namespace=namespace, msel=metric_selector)
        if name != "*":
            hit = index.get(name)
            return ([hit] if hit is not None else []), memo
        known = memo.picks.get(selector)
        if known is not None and known[0] is picked:
            return known[1], memo
        nowait.check()  # picking thousands of pods takes up to milliseconds: a worker thread's job
        if picked is None:
            values = list(index.values())  # the index is in name order
        else:
            hits = (index.get(n) for n in sorted(p.name for p in picked))
            values = [v for v in hits if v is not None]
        if len(memo.picks) >= MAX_PICKS:  # many distinct selectors within one evaluation: bounded
            memo.picks.clear()
        memo.picks[selector] = (picked, values)
        return values, memo

    def _queried(
        self,
        *,
        metric: str,
        resource: Resource,
        namespace: str,
        name: str,
        metric_selector: Selector,
        picked: list[Pod] | None,
    ) -> list[ObjectValue]:
        """The values of a query sent for this call alone (explain-hpa): a selection of at most half
        the namespace is named in the query; the samples of pods it did not pick are left out before
        the checks, so only the selection's refusals are logged and counted."""
        nowait.check()  # a query per request: not on the event loop
        names: list[str] = []
        pods = self._pods
        if (
            picked is not None
            and pods is not None
            and _name_pods(len(picked), pods.namespace_size(namespace))
        ):
            names = sorted(p.name for p in picked)
        rule, label, query = self.object_query(
            metric=metric,
            resource=resource,
            namespace=namespace,
            name=name,
            metric_selector=metric_selector,
            names=names,
        )
        samples = self._prometheus.query(query)
        if picked is not None:
            wanted = {p.name for p in picked}
            samples = [s for s in samples if s.labels.get(label) in wanted]
        checked = self._checks.per_object(samples, label=label, metric=metric, value_range=rule.value_range)
        return _object_values(
            checked,
            resource=resource,
            namespace=namespace if resource.namespaced else "",
            window=rule.window_seconds,
        )

    def _not_found(self, metric: str, resource: Resource, namespace: str, name: str) -> NotFound:
        return NotFound(
            f"the server could not find the metric {metric} for {resource.qualified} {name}"
            + (f" in namespace {namespace}" if resource.namespaced else "")
            + (f" (no value newer than {self.max_value_age:g}s)" if self.max_value_age > 0 else "")
        )

    def _index(
        self, *, metric: str, resource: Resource, namespace: str, msel: Selector
    ) -> tuple[dict[str, ObjectValue], Memo]:
        """Every object's value for (metric, resource, namespace, metricLabelSelector), by name, from
        the refreshing cache: one namespace-wide query, re-evaluated in the background."""
        assert self._cache is not None
        config = self._config()
        key = (metric, resource, namespace, msel, self.max_value_age)
        known = self._queries.get(key)
        if known is None or known[0] is not config:  # a reloaded config renders afresh
            known = (config, *self._refreshed_query(metric, resource, namespace, msel))
            if len(self._queries) >= 4096:  # namespaces × metrics × selectors seen: bounded
                self._queries.clear()
            self._queries[key] = known
        entry = self._cache.get(known[1], known[2], wait=self._wait)
        return entry.value  # type: ignore[return-value]

    def _refreshed_query(
        self, metric: str, resource: Resource, namespace: str, msel: Selector
    ) -> tuple[Hashable, Callable[[], tuple[dict[str, ObjectValue], Memo]]]:
        """The refreshing cache's key for a namespace-wide query and its loader, built once per
        config (a request then looks both up instead of rendering and building them)."""
        rule, label, query = self.object_query(
            metric=metric, resource=resource, namespace=namespace, name="*", metric_selector=msel
        )
        scope = namespace if resource.namespaced else ""
        window = rule.window_seconds

        def load() -> tuple[dict[str, ObjectValue], Memo]:
            samples = self._prometheus.query(query)
            picked = self._checks.per_object(
                samples, label=label, metric=metric, value_range=rule.value_range
            )
            values = _object_values(picked, resource=resource, namespace=scope, window=window)
            return {v.name: v for v in values}, Memo()

        return ("custom", query, label, resource, scope, window), load

    @property
    def _wait(self) -> float:
        return self._prometheus.timeout + 1.0

    # -- external metrics ----------------------------------------------------------------------
    def external_rule(self, metric: str) -> ExternalRule:
        rule = self._config().external_metric(metric)
        if rule is None:
            raise NotFound(f"the server could not find the external metric {metric}")
        return rule

    def external_query(self, *, metric: str, namespace: str, selector: Selector) -> tuple[ExternalRule, str]:
        rule = self.external_rule(metric)
        matchers: list[str] = []
        if rule.namespace_label:
            matchers.append(f'{rule.namespace_label}="{promql_escape(namespace)}"')
        matchers += to_promql_matchers(selector)
        query = render_query(
            rule.query, series=rule.series, matchers=matchers, by="", max_age=self.max_value_age
        )
        return rule, query

    def external(self, *, metric: str, namespace: str, selector: Selector) -> list[ExternalValue]:
        rule, query = self.external_query(metric=metric, namespace=namespace, selector=selector)

        def load() -> list[ExternalValue]:
            return [
                ExternalValue(
                    {k: v for k, v in s.labels.items() if k != "__name__"},
                    s.value,
                    s.timestamp,
                    rule.window_seconds,
                )
                for s in self._checks.external(
                    self._prometheus.query(query), metric=metric, value_range=rule.value_range
                )
            ]

        if self._cache is None:
            nowait.check()
            return load()
        entry = self._cache.get(("external", query, rule.window_seconds), load, wait=self._wait)
        return entry.value  # type: ignore[return-value]


@functools.lru_cache(maxsize=256)
def _pod_set_matcher(label: str, names: tuple[str, ...]) -> str:
    """``pod=~"a|b|…"`` for a selection; the same HPA asks for the same set every 15 s."""
    return f'{label}=~"{promql_escape(regex_alternatives(names))}"'


MAX_NAMED_PODS = 2000
"""Above this many selected pods the query stays namespace-wide (the body would pass ~80 KB)."""


def _name_pods(selected: int, in_namespace: int) -> bool:
    """Name the pods in the query when they are at most half of the namespace: Prometheus then
    returns only their series (its index resolves a set of literal alternatives directly)."""
    return 0 < selected <= MAX_NAMED_PODS and selected * 2 <= in_namespace


def _object_values(
    picked: Mapping[str, Sample], *, resource: Resource, namespace: str, window: int
) -> list[ObjectValue]:
    """The checked samples (one per object name) as served values, sorted by name."""
    return [
        ObjectValue(resource, namespace, name, picked[name].value, picked[name].timestamp, window)
        for name in sorted(picked)
    ]
