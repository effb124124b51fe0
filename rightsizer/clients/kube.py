"""The rightsizer's one door to the Kubernetes API (the only module that imports ``kubernetes``).

Objects cross this boundary as plain JSON dicts (camelCase, as ``kubectl get -o json`` prints them),
so everything above it is pure and testable without the client. Errors wrap the client's::

    KubeError                      anything the API or the connection said no to
    ├── TemporaryKubeError         worth retrying: 409 Conflict, 429, 5xx, connection failures
    │   ├── ConflictError          409: someone wrote the object first (re-read, re-decide, retry)
    │   └── TooManyRequestsError   429: throttled, or an eviction a PodDisruptionBudget refuses now
    └── PermanentKubeError         retrying will not help: 400/401/403/404/415/422, bad kubeconfig
        ├── NotFoundError          404
        └── MultipleBudgetsError   500 from an eviction: the pod is under two PodDisruptionBudgets

A temporary error carries ``retry_after_s``, the server's ``Retry-After`` (API Priority and Fairness
sends one with its 429s), or None.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import urllib3.exceptions
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from gpupilot_common import neterror, urllib3deadline, watchdog
from gpupilot_common.paths import file_problem
from rightsizer.errors import RightsizerError

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
CLUSTER_POLICY = ("nvidia.com", "v1", "clusterpolicies")
RESOURCE_VERSIONS = ("v1", "v1beta1")
"""resource.k8s.io versions ResourceSlices are read in, newest first (v1 is GA from Kubernetes 1.34)."""
WORKLOAD_KINDS = {
    "ReplicaSet": ("apps", "read_namespaced_replica_set", "patch_namespaced_replica_set"),
    "Deployment": ("apps", "read_namespaced_deployment", "patch_namespaced_deployment"),
    "StatefulSet": ("apps", "read_namespaced_stateful_set", "patch_namespaced_stateful_set"),
}
"""Owner kinds apply reads and patches the pod template of: (API group, read method, patch method)."""


class KubeError(RightsizerError):
    """The Kubernetes API refused or could not be reached; ``status`` is the HTTP code (0 = none)."""

    temporary = False

    def __init__(self, message: str, *, status: int = 0, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class TemporaryKubeError(KubeError):
    temporary = True


class ConflictError(TemporaryKubeError):
    pass


class TooManyRequestsError(TemporaryKubeError):
    pass


class PermanentKubeError(KubeError):
    pass


class NotFoundError(PermanentKubeError):
    pass


class MultipleBudgetsError(PermanentKubeError):
    """The Eviction API's 500 for a pod two PodDisruptionBudgets select (it cannot evict such a pod;
    ``pkg/registry/core/pod/storage/eviction.go``)."""


MULTIPLE_BUDGETS = "more than one PodDisruptionBudget"

MAX_RETRY_AFTER_S = 600.0


@dataclass(frozen=True)
class KubeSettings:
    kubeconfig: Path | None = None
    """Path of a kubeconfig; ``None``: ``$KUBECONFIG``/``~/.kube/config``, then the in-cluster service account."""
    context: str | None = None
    """kubeconfig context; ``None``: the current context."""
    request_timeout_s: float = 30.0
    """Per-request timeout (watches use their own server-side timeout)."""


def _message(exc: ApiException) -> str:
    """The Status ``message``, with its ``details.causes`` (an eviction's 429 says there which budget
    refused and how many healthy pods it needs)."""
    try:
        body = json.loads(exc.body or "{}")
        text = str(body.get("message") or exc.reason or "")
        causes = ((body.get("details") or {}).get("causes")) or []
        extra = "; ".join(
            str(c.get("message")) for c in causes[:3] if isinstance(c, dict) and c.get("message")
        )
        return f"{text} ({extra})" if extra else text
    except (ValueError, AttributeError):
        return str(exc.reason or exc.body or "")


def _retry_after(exc: ApiException) -> float | None:
    """``Retry-After`` in seconds (RFC 9110: delay-seconds; an HTTP date is not sent by Kubernetes)."""
    headers = exc.headers or {}
    raw = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        value = float(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None
    if value is None or not (0 <= value <= MAX_RETRY_AFTER_S):
        return None
    return value


def _raise(exc: Exception, what: str) -> NoReturn:
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = _message(exc)
        text = f"{what}: HTTP {status} {message}".rstrip()
        after = _retry_after(exc)
        if status == 409:
            raise ConflictError(text, status=status) from exc
        if status == 429:
            raise TooManyRequestsError(text, status=status, retry_after_s=after) from exc
        if status == 404:
            raise NotFoundError(text, status=status) from exc
        if status == 500 and MULTIPLE_BUDGETS in message:
            raise MultipleBudgetsError(text, status=status) from exc
        if status >= 500 or status == 0:
            raise TemporaryKubeError(text, status=status, retry_after_s=after) from exc
        raise PermanentKubeError(text, status=status) from exc
    raise TemporaryKubeError(
        f"{what}: cannot reach the API server: {neterror.cause(exc)}; check the kubeconfig's server "
        "(--kubeconfig, $KUBECONFIG)"
    ) from exc


_TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)
_NOT_KUBERNETES = "the answer is not Kubernetes API JSON; is the kubeconfig's server a Kubernetes API server?"


class Kube:
    """Typed, dict-in/dict-out calls on one ``ApiClient`` (thread-safe: urllib3 pools connections)."""

    def __init__(self, api_client: Any, *, request_timeout_s: float = 30.0) -> None:
        self._client = api_client
        pool = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
        if pool is not None:  # every answer within its deadline, headers included
            urllib3deadline.bound(pool)
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)
        self._coordination = client.CoordinationV1Api(api_client)
        self._apps = client.AppsV1Api(api_client)
        self._batch = client.BatchV1Api(api_client)  # CronJobs and Jobs, when a workload kind needs them
        self._timeout = request_timeout_s

    @classmethod
    def connect(cls, settings: KubeSettings) -> Kube:
        """Load the kubeconfig (or the in-cluster config); a :class:`PermanentKubeError` names what is wrong."""
        cfg = client.Configuration()
        try:
            if settings.kubeconfig is not None:
                if problem := file_problem(settings.kubeconfig):
                    what = "file not found" if problem.startswith("no such file") else f"is {problem}"
                    raise PermanentKubeError(f"{settings.kubeconfig}: kubeconfig {what}")
                config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=str(settings.kubeconfig), context=settings.context, client_configuration=cfg
                )
            else:
                try:
                    config.load_kube_config(context=settings.context, client_configuration=cfg)  # type: ignore[no-untyped-call]
                except (ConfigException, OSError) as first:
                    try:
                        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
                    except ConfigException:
                        raise PermanentKubeError(
                            f"no usable kubeconfig ({first}) and not running in a cluster: pass --kubeconfig"
                        ) from first
        except ConfigException as exc:
            where = settings.kubeconfig or "kubeconfig"
            raise PermanentKubeError(f"{where}: {exc} (check --kubeconfig/--context)") from exc
        return cls(client.ApiClient(cfg), request_timeout_s=settings.request_timeout_s)

    def close(self) -> None:
        self._client.close()

    def _json(self, obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = self._client.sanitize_for_serialization(obj)
        return out

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        deadline = time.monotonic() + self._timeout
        try:
            with watchdog.within(self._timeout):
                result = fn(*args, _request_timeout=self._timeout, **kwargs)
        except ApiException as exc:
            _raise(exc, what)
        except _TRANSPORT_ERRORS as exc:
            if time.monotonic() >= deadline:  # the watchdog cut a trickling answer
                raise TemporaryKubeError(
                    f"{what}: no complete answer from the Kubernetes API within {self._timeout:g}s"
                ) from exc
            _raise(exc, what)
        except (ValueError, TypeError) as exc:  # the client could not read the answer (an HTML page)
            raise PermanentKubeError(f"{what}: {_NOT_KUBERNETES}") from exc
        if isinstance(result, dict):
            return result
        return self._json(result)

    # -- nodes ----------------------------------------------------------------------------------
    def get_node(self, name: str) -> dict[str, Any]:
        return self._call(f"node {name}", self._core.read_node, name)

    def list_nodes(self, *, label_selector: str = "") -> list[dict[str, Any]]:
        result = self._call("list nodes", self._core.list_node, label_selector=label_selector)
        return list(result.get("items") or [])

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """Strategic-merge patch; put ``metadata.resourceVersion`` in ``patch`` to make it conditional."""
        return self._call(f"patch node {name}", self._core.patch_node, name, dict(patch))

    def watch_node(self, name: str, *, resource_version: str, timeout_s: float) -> Iterator[dict[str, Any]]:
        """Node objects as they change after ``resource_version``, for at most ``timeout_s`` seconds."""
        w = watch.Watch()  # type: ignore[no-untyped-call]
        try:
            # the whole watch ends by its deadline, however the server trickles its bytes (the
            # consumer makes no other call between two events: it breaks out to make one)
            with watchdog.within(timeout_s + 10):
                for event in w.stream(  # type: ignore[no-untyped-call]
                    self._core.list_node,
                    field_selector=f"metadata.name={name}",
                    resource_version=resource_version,
                    timeout_seconds=max(1, int(timeout_s)),
                    _request_timeout=timeout_s + 10,
                ):
                    if event.get("type") == "ERROR":
                        raise TemporaryKubeError(f"watch node {name}: {event.get('raw_object')}")
                    yield self._json(event["object"])
        except ApiException as exc:
            _raise(exc, f"watch node {name}")
        except _TRANSPORT_ERRORS as exc:
            _raise(exc, f"watch node {name}")
        except (ValueError, TypeError) as exc:
            raise PermanentKubeError(f"watch node {name}: {_NOT_KUBERNETES}") from exc
        finally:
            w.stop()  # type: ignore[no-untyped-call]

    # -- pods -----------------------------------------------------------------------------------
    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        result = self._call(
            f"pods on {node}", self._core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}"
        )
        return list(result.get("items") or [])

    def evict_pod(self, namespace: str, name: str) -> None:
        """policy/v1 Eviction: the API server checks PodDisruptionBudgets (429 when one says no)."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        self._call(
            f"evict pod {namespace}/{name}", self._core.create_namespaced_pod_eviction, name, namespace, body
        )

    def list_pods(self, namespace: str | None = None, *, label_selector: str = "") -> list[dict[str, Any]]:
        """Pods of ``namespace`` (``None``: every namespace) whose labels match ``label_selector``."""
        kwargs = {"label_selector": label_selector} if label_selector else {}
        if namespace is None:
            result = self._call("list pods", self._core.list_pod_for_all_namespaces, **kwargs)
        else:
            result = self._call(
                f"list pods in {namespace}", self._core.list_namespaced_pod, namespace, **kwargs
            )
        return list(result.get("items") or [])

    # -- workloads (apps/v1, batch/v1) ------------------------------------------------------------
    def _workload_api(self, kind: str, verb: str) -> Any:
        known = WORKLOAD_KINDS.get(kind)
        if known is None:
            raise PermanentKubeError(
                f"{kind} is not a workload kind apply changes ({', '.join(WORKLOAD_KINDS)})"
            )
        group, read, patch = known
        api = self._apps if group == "apps" else self._batch
        return getattr(api, read if verb == "read" else patch)

    def get_workload(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        """A ReplicaSet, Deployment or StatefulSet."""
        return self._call(
            f"{kind.lower()} {namespace}/{name}", self._workload_api(kind, "read"), name, namespace
        )

    def patch_workload(
        self, kind: str, namespace: str, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        """JSON merge patch (lists are replaced whole); put ``metadata.resourceVersion`` in it to guard."""
        return self._call(
            f"patch {kind.lower()} {namespace}/{name}",
            self._workload_api(kind, "patch"),
            name,
            namespace,
            dict(patch),
            _content_type=MERGE_PATCH,
        )

    # -- configmaps -------------------------------------------------------------------------------
    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call(
                f"configmap {namespace}/{name}", self._core.read_namespaced_config_map, name, namespace
            )
        except NotFoundError:
            return None

    def create_configmap(self, namespace: str, name: str, data: Mapping[str, str]) -> dict[str, Any]:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": dict(data),
        }
        return self._call(
            f"create configmap {namespace}/{name}", self._core.create_namespaced_config_map, namespace, body
        )

    def replace_configmap(self, configmap: Mapping[str, Any]) -> dict[str, Any]:
        """PUT with the object's ``resourceVersion``: a concurrent writer makes this a :class:`ConflictError`."""
        meta = configmap["metadata"]
        return self._call(
            f"replace configmap {meta['namespace']}/{meta['name']}",
            self._core.replace_namespaced_config_map,
            meta["name"],
            meta["namespace"],
            dict(configmap),
        )

    # -- ResourceSlices (resource.k8s.io) ----------------------------------------------------------
    def list_resource_slices(self, *, driver: str, node: str | None = None) -> list[dict[str, Any]]:
        """The ResourceSlices ``driver`` publishes (on ``node`` only when given): ``resource.k8s.io/v1``
        (Kubernetes 1.34+), else ``v1beta1`` (1.32/1.33) when the API server has no v1."""
        selector = f"spec.driver={driver}" + (f",spec.nodeName={node}" if node else "")
        last: NotFoundError | None = None
        for version in RESOURCE_VERSIONS:
            try:
                result = self._call(
                    f"list resourceslices.resource.k8s.io/{version}",
                    self._custom.list_cluster_custom_object,
                    "resource.k8s.io",
                    version,
                    "resourceslices",
                    field_selector=selector,
                )
            except NotFoundError as exc:
                last = exc
                continue
            return list(result.get("items") or [])
        assert last is not None
        raise last

    # -- ClusterPolicy (custom resource) -----------------------------------------------------------
    def list_cluster_policies(self) -> list[dict[str, Any]]:
        result = self._call(
            "list clusterpolicies.nvidia.com", self._custom.list_cluster_custom_object, *CLUSTER_POLICY
        )
        return list(result.get("items") or [])

    def patch_cluster_policy(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """JSON merge patch (a CRD takes no strategic merge); include ``metadata.resourceVersion`` to guard."""
        return self._call(
            f"patch clusterpolicy {name}",
            self._custom.patch_cluster_custom_object,
            *CLUSTER_POLICY,
            name,
            dict(patch),
            _content_type=MERGE_PATCH,
        )

    # -- leases (coordination.k8s.io/v1) ------------------------------------------------------------
    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call(
                f"lease {namespace}/{name}", self._coordination.read_namespaced_lease, name, namespace
            )
        except NotFoundError:
            return None

    def create_lease(self, namespace: str, lease: Mapping[str, Any]) -> dict[str, Any]:
        """409 AlreadyExists (someone created it first) is a :class:`ConflictError`."""
        return self._call(
            f"create lease {namespace}/{lease['metadata']['name']}",
            self._coordination.create_namespaced_lease,
            namespace,
            dict(lease),
        )

    def replace_lease(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        """PUT with the lease's ``resourceVersion``: another holder's write first is a :class:`ConflictError`."""
        meta = lease["metadata"]
        return self._call(
            f"replace lease {meta['namespace']}/{meta['name']}",
            self._coordination.replace_namespaced_lease,
            meta["name"],
            meta["namespace"],
            dict(lease),
        )

    # -- events ---------------------------------------------------------------------------------
    def create_event(self, namespace: str, event: Mapping[str, Any]) -> dict[str, Any]:
        return self._call(
            f"create event in {namespace}", self._core.create_namespaced_event, namespace, dict(event)
        )
