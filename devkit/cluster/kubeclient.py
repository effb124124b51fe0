"""The devkit's one door to the test control plane: the official ``kubernetes`` client's dynamic
client, with server-side apply, status patches and a few waits. Errors become :class:`KubeError`
lines naming the object and the API's reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config, dynamic, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import DynamicApiError, ResourceNotFoundError

FIELD_MANAGER = "gpupilot-devkit"


class KubeError(RuntimeError):
    pass


def _describe(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{obj.get('kind')} {ns + '/' if ns else ''}{meta.get('name')}"


def _reason(exc: Exception) -> str:
    status = getattr(exc, "status", "")
    body = getattr(exc, "body", "") or ""
    if isinstance(body, bytes):
        body = body.decode(errors="replace")
    return f"{status} {str(body)[:300]}".strip()


class Kube:
    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.api_client = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self.dynamic = dynamic.DynamicClient(self.api_client)  # type: ignore[no-untyped-call]

    def resource(self, api_version: str, kind: str) -> Any:
        try:
            return self.dynamic.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:
            self.dynamic.resources.invalidate_cache()
            return self.dynamic.resources.get(api_version=api_version, kind=kind)

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        res = self.resource(obj["apiVersion"], obj["kind"])
        ns = (obj.get("metadata") or {}).get("namespace")
        try:
            out = res.create(body=obj, namespace=ns) if res.namespaced else res.create(body=obj)
        except (DynamicApiError, ApiException) as exc:
            raise KubeError(f"create {_describe(obj)}: {_reason(exc)}") from None
        return dict(out.to_dict())

    def apply(self, obj: dict[str, Any], *, subresource: str = "") -> dict[str, Any]:
        """Server-side apply of ``obj`` (forced: the devkit owns what it sets)."""
        res = self.resource(obj["apiVersion"], obj["kind"])
        if subresource:
            res = getattr(res, subresource)
        ns = (obj.get("metadata") or {}).get("namespace")
        try:
            out = res.server_side_apply(
                body=obj,
                name=obj["metadata"]["name"],
                namespace=ns if res.namespaced else None,
                field_manager=FIELD_MANAGER,
                force_conflicts=True,
            )
        except (DynamicApiError, ApiException) as exc:
            raise KubeError(f"apply {_describe(obj)}: {_reason(exc)}") from None
        return dict(out.to_dict())

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        res = self.resource(api_version, kind)
        try:
            out = res.get(name=name, namespace=namespace) if res.namespaced else res.get(name=name)
        except (DynamicApiError, ApiException) as exc:
            if getattr(exc, "status", 0) == 404:
                return None
            raise KubeError(f"get {kind} {name}: {_reason(exc)}") from None
        return dict(out.to_dict())

    def list(
        self, api_version: str, kind: str, *, namespace: str | None = None, **selectors: str
    ) -> list[dict[str, Any]]:
        res = self.resource(api_version, kind)
        try:
            out = res.get(namespace=namespace, **selectors)
        except (DynamicApiError, ApiException) as exc:
            raise KubeError(f"list {kind}: {_reason(exc)}") from None
        return [dict(item.to_dict()) for item in out.items]

    def merge_patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: dict[str, Any],
        *,
        namespace: str | None = None,
        subresource: str = "",
    ) -> dict[str, Any]:
        res = self.resource(api_version, kind)
        if subresource:
            res = getattr(res, subresource)
        try:
            out = res.patch(
                name=name,
                namespace=namespace,
                body=patch,
                content_type="application/merge-patch+json",
            )
        except (DynamicApiError, ApiException) as exc:
            raise KubeError(
                f"patch {kind} {name}{'/' + subresource if subresource else ''}: {_reason(exc)}"
            ) from None
        return dict(out.to_dict())

    def delete(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        res = self.resource(api_version, kind)
        try:
            res.delete(name=name, namespace=namespace)
        except (DynamicApiError, ApiException) as exc:
            if getattr(exc, "status", 0) != 404:
                raise KubeError(f"delete {kind} {name}: {_reason(exc)}") from None

    def watch(
        self, api_version: str, kind: str, *, timeout_seconds: int = 60, **kwargs: Any
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        res = self.resource(api_version, kind)
        w = watch.Watch()  # type: ignore[no-untyped-call]
        for event in self.dynamic.watch(res, timeout=timeout_seconds, watcher=w, **kwargs):  # type: ignore[no-untyped-call]
            yield event["type"], dict(event["raw_object"])

    def wait_established(self, crd: str, *, timeout: float = 30) -> None:
        def established() -> bool:
            obj = self.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", crd)
            conds = ((obj or {}).get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Established" and c.get("status") == "True" for c in conds)

        wait_for(established, timeout=timeout, what=f"CRD {crd} established")
        self.dynamic.resources.invalidate_cache()

    def create_raw(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to an API path (a subresource the dynamic client does not name: TokenRequest)."""
        try:
            out = self.dynamic.request("post", path, body=body)
        except (DynamicApiError, ApiException) as exc:
            raise KubeError(f"POST {path}: {_reason(exc)}") from None
        return dict(out.to_dict())

    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api_client)


def wait_for(check: Callable[[], Any], *, timeout: float, what: str, every: float = 0.2) -> Any:
    """``check()``'s first truthy answer, polling; :class:`KubeError` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise KubeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)
