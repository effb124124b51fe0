"""Paths → answers for custom.metrics.k8s.io (v1beta2, v1beta1) and external.metrics.k8s.io
(v1beta1), plus the endpoints every Kubernetes API server has (``/version``, ``/apis``, health).

Pure with respect to HTTP: :func:`request_info` parses a path (also used to build the
SubjectAccessReview), :meth:`MetricsApi.answer` returns (status, JSON body). Errors become
``metav1.Status`` objects. The values come from one call to the provider
(:class:`adapter.provider.values.MetricValues`), checked and picked; this module only renders them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote

import orjson

from adapter.config import resources
from adapter.config.resources import Resource
from adapter.errors import AdapterError, BadRequest, NotFound
from adapter.provider import nowait
from adapter.provider.discovery import Listing
from adapter.provider.selectors import Selector, parse_selector
from adapter.provider.values import ExternalValue, MetricValues, ObjectValue
from adapter.quantity import format_quantity
from adapter.serving.answers import AnswerCache
from gpupilot_common.cli import package_version
from gpupilot_common.timefmt import format_time

CUSTOM = "custom.metrics.k8s.io"
EXTERNAL = "external.metrics.k8s.io"
CUSTOM_VERSIONS = ("v1beta2", "v1beta1")
# /version as kubectl and the aggregator read it: the Kubernetes release whose aggregation layer the
# adapter is tested behind (tests/kube: a real v1.37 kube-apiserver), then the adapter's own version.
KUBERNETES_RELEASE = (1, 37)
VERSION_INFO = {
    "major": str(KUBERNETES_RELEASE[0]),
    "minor": str(KUBERNETES_RELEASE[1]),
    "gitVersion": f"v{KUBERNETES_RELEASE[0]}.{KUBERNETES_RELEASE[1]}.0-gpupilot-adapter-{package_version()}",
    "gitCommit": "",
    "gitTreeState": "",
    "buildDate": "",
    "goVersion": "python",
    "compiler": "cpython",
    "platform": "linux/amd64",
}
Json = dict[str, Any]


class RequestInfo(NamedTuple):
    """The Kubernetes view of a request path, as a SubjectAccessReview wants it (a named tuple: it
    keys the authorisation cache on every request, and hashes in C)."""

    path: str
    is_resource: bool
    group: str = ""
    version: str = ""
    namespace: str = ""
    resource: str = ""
    name: str = ""
    subresource: str = ""

    def resource_attributes(self) -> dict[str, str]:
        attrs = {"verb": "get", "group": self.group, "version": self.version, "resource": self.resource}
        for key in ("namespace", "name", "subresource"):
            if getattr(self, key):
                attrs[key] = getattr(self, key)
        return attrs


@functools.lru_cache(maxsize=1024)
def _segments(path: str) -> tuple[str, ...]:
    """(memoised: routing splits and unquotes the same few paths on every request)"""
    return tuple(unquote(p) for p in path.strip("/").split("/") if p)


@functools.lru_cache(maxsize=1024)
def request_info(path: str) -> RequestInfo:
    """(memoised: the HPA asks the same few paths over and over; the value is immutable)"""
    parts = _segments(path)
    if len(parts) < 4 or parts[0] != "apis" or parts[1] not in (CUSTOM, EXTERNAL):
        return RequestInfo(path, False)
    group, version, rest = parts[1], parts[2], parts[3:]
    if group == EXTERNAL:
        if len(rest) == 3 and rest[0] == "namespaces":
            return RequestInfo(path, True, group, version, rest[1], rest[2])
        return RequestInfo(path, False)
    if len(rest) == 5 and rest[0] == "namespaces":
        return RequestInfo(path, True, group, version, rest[1], rest[2], rest[3], rest[4])
    if len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "metrics":
        return RequestInfo(path, True, group, version, rest[1], "metrics", rest[3])
    if len(rest) == 3:
        return RequestInfo(path, True, group, version, "", rest[0], rest[1], rest[2])
    return RequestInfo(path, False)


def status(code: int, reason: str, message: str, *, details: Json | None = None) -> Json:
    body: Json = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


_selector = functools.lru_cache(maxsize=1024)(parse_selector)
"""Parsed selectors are immutable; a refused one raises and is not kept."""


@functools.lru_cache(maxsize=64)
def _rfc3339(second: int) -> str:
    return format_time(second)


def rfc3339(ts: float) -> str:
    """All items of an answer share one evaluation time: format each second once."""
    return _rfc3339(int(ts))


def label_selector_object(selector: Selector) -> Json | None:
    """A parsed selector as ``metav1.LabelSelector`` (None when empty, as the reference shows)."""
    if selector.empty:
        return None
    labels: dict[str, str] = {}
    exprs: list[Json] = []
    ops = {"in": "In", "notin": "NotIn", "exists": "Exists", "!": "DoesNotExist", "!=": "NotIn"}
    for r in selector.requirements:
        if r.op == "=":
            labels[r.key] = r.values[0]
        else:
            expr: Json = {"key": r.key, "operator": ops[r.op]}
            if r.values:
                expr["values"] = list(r.values)
            exprs.append(expr)
    out: Json = {}
    if labels:
        out["matchLabels"] = labels
    if exprs:
        out["matchExpressions"] = exprs
    return out


@dataclass(frozen=True, slots=True)
class _CustomRequest:
    """A custom metrics request resolved from its path and selectors: all but the values."""

    metric: str
    resource: Resource
    namespace: str
    name: str
    selector: Selector
    metric_selector: Selector
    key: Hashable
    """The encoded answer's key in :class:`AnswerCache`."""


@functools.lru_cache(maxsize=1024)
def _custom_request(
    info: RequestInfo, label_selector: str | None, metric_label_selector: str | None
) -> _CustomRequest:
    """(memoised: an HPA sends the same request every sync; a refused one raises and is not kept)"""
    selector = _selector(label_selector)
    metric_selector = _selector(metric_label_selector)
    if info.resource == "metrics":  # namespaces/{ns}/metrics/{metric}: the namespace object
        resource, namespace, name, metric = resources.NAMESPACES, "", info.namespace, info.name
    else:
        found = resources.lookup(info.resource)
        if found is None:
            raise NotFound(f"the server could not find the metric {info.subresource} for {info.resource}")
        resource, namespace, name, metric = found, info.namespace, info.name, info.subresource
        if resource.namespaced and not namespace:
            raise BadRequest(
                f"{resource.qualified} are namespaced: use namespaces/<ns>/{resource.qualified}/…"
            )
        if not resource.namespaced and namespace:
            raise BadRequest(f"{resource.qualified} are cluster-scoped: drop the namespaces/<ns>/ prefix")
    key = (info.version, metric, resource, namespace, name, selector, metric_selector)
    return _CustomRequest(metric, resource, namespace, name, selector, metric_selector, key)


def _item_template(
    version: str, metric: bytes, selector: bytes, v: ObjectValue
) -> tuple[bytes, bytes, bytes]:
    """(before the name, between name and value, after the value) of one item's JSON: the one place
    a custom metrics item's shape is written (``MetricValue`` of v1beta2 and v1beta1)."""
    head = b'{"describedObject":{"kind":' + orjson.dumps(v.resource.kind)
    if v.namespace:
        head += b',"namespace":' + orjson.dumps(v.namespace)
    head += b',"name":'
    described_end = b',"apiVersion":' + orjson.dumps(v.resource.api_version) + b"}"
    stamp = orjson.dumps(rfc3339(v.timestamp))
    if version == "v1beta2":
        middle = (
            described_end
            + b',"metric":{"name":'
            + metric
            + b',"selector":'
            + selector
            + b'},"timestamp":'
            + stamp
            + b',"windowSeconds":'
            + str(v.window_seconds).encode()
            + b',"value":"'
        )
        return head, middle, b'"}'
    middle = (
        described_end
        + b',"metricName":'
        + metric
        + b',"timestamp":'
        + stamp
        + b',"window":'
        + str(v.window_seconds).encode()
        + b',"value":"'
    )
    return head, middle, b'","selector":' + selector + b"}"


class MetricsApi:
    def __init__(
        self,
        *,
        values: MetricValues,
        listing: Callable[[], Listing],
        external_enabled: bool,
        ready: Callable[[], list[tuple[str, bool]]],
        answers: AnswerCache | None = None,
    ) -> None:
        self._values = values
        self.answers = AnswerCache() if answers is None else answers
        """Encoded answers, valid while their evaluation and pod selection are current."""
        self._listing = listing
        self.external_enabled = external_enabled
        self._ready = ready

    # -- entry point -----------------------------------------------------------------------------
    def answer(self, path: str, query: Mapping[str, str]) -> tuple[int, Json | str | bytes]:
        """(HTTP status, JSON object, encoded JSON (bytes) or plain text) for a GET."""
        try:
            return self._route(path, query)
        except AdapterError as exc:
            return exc.status, status(exc.status, exc.reason, str(exc))

    def _route(self, path: str, query: Mapping[str, str]) -> tuple[int, Json | str | bytes]:
        info = request_info(path)
        if info.is_resource and info.group in self._groups() and info.version in self._versions(info.group):
            return 200, self._metric(info, query)  # the HPA's requests: first, with the least work
        parts = _segments(path)
        if path.rstrip("/") in ("/healthz", "/livez"):
            return 200, "ok"
        if path.rstrip("/") == "/readyz":
            return self._readyz(verbose="verbose" in query)
        if parts == ("version",):
            return 200, dict(VERSION_INFO)
        if parts == ("api",):
            return 200, {
                "kind": "APIVersions",
                "apiVersion": "v1",
                "versions": [],
                "serverAddressByClientCIDRs": [],
            }
        if parts == ("apis",):
            return 200, self._group_list()
        if len(parts) >= 2 and parts[0] == "apis" and parts[1] in self._groups():
            group = parts[1]
            if len(parts) == 2:
                return 200, self._group(group)
            version = parts[2]
            if version not in self._versions(group):
                raise NotFound(
                    f"the server could not find the requested resource (version {version} of {group})"
                )
            if len(parts) == 3:
                return 200, self._resource_list(group, version)
        raise NotFound(f"the server could not find the requested resource ({path})")

    def _readyz(self, *, verbose: bool) -> tuple[int, str]:
        checks = self._ready()
        lines = [f"[{'+' if ok else '-'}]{name} {'ok' if ok else 'failed'}" for name, ok in checks]
        healthy = all(ok for _, ok in checks)
        if healthy and not verbose:
            return 200, "ok"
        text = "\n".join([*lines, "readyz check passed" if healthy else "readyz check failed"]) + "\n"
        return (200 if healthy else 500), text

    # -- discovery --------------------------------------------------------------------------------
    def _groups(self) -> tuple[str, ...]:
        return (CUSTOM, EXTERNAL) if self.external_enabled else (CUSTOM,)

    @staticmethod
    def _versions(group: str) -> tuple[str, ...]:
        return CUSTOM_VERSIONS if group == CUSTOM else ("v1beta1",)

    def _group(self, group: str) -> Json:
        versions = [{"groupVersion": f"{group}/{v}", "version": v} for v in self._versions(group)]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": versions,
            "preferredVersion": versions[0],
        }

    def _group_list(self) -> Json:
        """Groups with something to list: kubectl's discovery treats an empty resource list as an
        error ("received empty response"), so an empty group is left out, as kube-apiserver does."""
        listing = self._listing()
        groups = []
        for g in self._groups():
            if not (listing.custom if g == CUSTOM else listing.external):
                continue
            item = self._group(g)
            item.pop("kind")
            item.pop("apiVersion")
            groups.append(item)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def _resource_list(self, group: str, version: str) -> Json:
        listing = self._listing()
        entries: list[Json]
        if group == CUSTOM:
            entries = [
                {
                    "name": f"{resource.qualified}/{metric}",
                    "singularName": "",
                    "namespaced": resource.namespaced,
                    "kind": "MetricValueList",
                    "verbs": ["get"],
                }
                for resource, metric in listing.custom
            ]
        else:
            entries = [
                {
                    "name": metric,
                    "singularName": "",
                    "namespaced": True,
                    "kind": "ExternalMetricValueList",
                    "verbs": ["get"],
                }
                for metric in listing.external
            ]
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}",
            "resources": entries,
        }

    # -- values -----------------------------------------------------------------------------------
    def _metric(self, info: RequestInfo, query: Mapping[str, str]) -> Json | bytes:
        if info.group == EXTERNAL:
            selector = _selector(query.get("labelSelector"))
            ext = self._values.external(metric=info.resource, namespace=info.namespace, selector=selector)
            return self._external_list(info.resource, ext)
        asked = _custom_request(info, query.get("labelSelector"), query.get("metricLabelSelector"))
        found = self._values.for_objects(
            metric=asked.metric,
            resource=asked.resource,
            namespace=asked.namespace,
            name=asked.name,
            selector=asked.selector,
            metric_selector=asked.metric_selector,
        )
        memo = found.memo
        if memo is None:  # not served from memory (explain-hpa) or an empty selection
            return self._custom_list(info.version, asked.metric, found.values, asked.metric_selector, {})
        cached = self.answers.get(asked.key, generation=memo.generation, pods=found.pods)
        if cached is not None:
            return cached
        nowait.check()  # encoding takes up to milliseconds: a worker thread's job
        body = self._custom_list(info.version, asked.metric, found.values, asked.metric_selector, memo)
        self.answers.put(asked.key, body, generation=memo.generation, pods=found.pods)
        return body

    @staticmethod
    def _custom_list(
        version: str,
        metric: str,
        values: Sequence[ObjectValue],
        msel: Selector,
        memo: dict[Hashable, bytes],
    ) -> bytes:
        """The ``MetricValueList``, encoded. Each item is encoded from a per-answer template (cheaper
        than a dict through orjson) and kept in ``memo``: served from memory, that is the
        evaluation's, so every request until the next refresh joins the items' bytes."""
        head = {"kind": "MetricValueList", "apiVersion": f"{CUSTOM}/{version}", "metadata": {}}
        selector_json = orjson.dumps(label_selector_object(msel))
        metric_json = orjson.dumps(metric)
        templates: dict[tuple[Resource, str, float, int], tuple[bytes, bytes, bytes]] = {}
        quantities: dict[float, bytes] = {}  # utilisations repeat (0-100): format each value once
        parts = []
        for v in values:
            # one evaluation can serve several metric names and metricLabelSelectors that render
            # the same query: each item's bytes name the metric and the selector
            key = (version, metric, msel, v.name)
            part = memo.get(key)
            if part is None:
                shape = (v.resource, v.namespace, v.timestamp, v.window_seconds)
                t = templates.get(shape)
                if t is None:
                    t = templates[shape] = _item_template(version, metric_json, selector_json, v)
                quantity = quantities.get(v.value)
                if quantity is None:
                    quantity = quantities[v.value] = format_quantity(v.value).encode()
                part = memo[key] = b"".join((t[0], orjson.dumps(v.name), t[1], quantity, t[2]))
            parts.append(part)
        return orjson.dumps(head)[:-1] + b',"items":[' + b",".join(parts) + b"]}"

    @staticmethod
    def _external_list(metric: str, values: list[ExternalValue]) -> Json:
        items = [
            {
                "metricName": metric,
                "metricLabels": dict(v.labels),
                "timestamp": rfc3339(v.timestamp),
                "window": v.window_seconds,
                "value": format_quantity(v.value),
            }
            for v in values
        ]
        return {
            "kind": "ExternalMetricValueList",
            "apiVersion": f"{EXTERNAL}/v1beta1",
            "metadata": {},
            "items": items,
        }
