"""The API server's aggregation layer (kube-aggregator) for the double: requests under an
APIService's ``/apis/GROUP/VERSION`` go to the extension server behind it, as the real one sends
them.

The double authenticates the caller (its bearer token), then opens TLS to the extension server,
verifying its certificate against the APIService's ``caBundle`` for the name
``<service>.<namespace>.svc`` (what the aggregator dials), presents the front-proxy client
certificate (signed by the ``requestheader-client-ca-file`` CA), and names the user in
``X-Remote-User`` / ``X-Remote-Group``. Register one with :func:`register`; the double answers 503
ServiceUnavailable when the extension server cannot be reached or trusted, as the aggregator does.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tests.support.kubedouble.double import KubeDouble

FORWARDED_HEADERS = ("Accept", "Content-Type")


@dataclass(frozen=True)
class Backend:
    """Where an APIService's Service really listens here, and the aggregator's client identity."""

    host: str
    port: int
    server_name: str
    ca_bundle_pem: bytes
    client_cert: Path
    client_key: Path
    timeout_s: float = 10.0

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.ca_bundle_pem.decode())
        ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx

    def forward(
        self, method: str, path: str, user: str, groups: list[str], body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes, str]:
        """(status, body, content type) of the extension server's answer; 503 when unreachable."""
        try:
            raw = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
            sock = self.context().wrap_socket(raw, server_hostname=self.server_name)
        except (OSError, ssl.SSLError) as err:
            return (
                503,
                _status(503, "ServiceUnavailable", f"error trying to reach service: {err}"),
                "application/json",
            )
        conn = http.client.HTTPSConnection(self.server_name, self.port, timeout=self.timeout_s)
        conn.sock = sock
        sent = {k: v for k, v in headers.items() if k in FORWARDED_HEADERS}
        sent["X-Remote-User"] = user
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for key, value in sent.items():
                conn.putheader(key, value)
            for group in groups:
                conn.putheader("X-Remote-Group", group)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            return resp.status, resp.read(), resp.getheader("Content-Type", "application/json")
        except (OSError, http.client.HTTPException) as err:
            return (
                503,
                _status(503, "ServiceUnavailable", f"error trying to reach service: {err}"),
                "application/json",
            )
        finally:
            conn.close()


def _status(code: int, reason: str, message: str) -> bytes:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "code": code,
            "reason": reason,
            "message": message,
        }
    ).encode()


def register(
    kube: KubeDouble,
    apiservice: dict[str, Any],
    *,
    address: tuple[str, int],
    client_cert: Path,
    client_key: Path,
) -> Backend:
    """Serve ``/apis/GROUP/VERSION`` of this APIService object through its ``caBundle`` (which it
    must carry: an APIService without one is not trusted) to the server at ``address``."""
    spec = apiservice["spec"]
    bundle = base64.b64decode(spec.get("caBundle") or "")
    if not bundle:
        raise ValueError(f"APIService {apiservice['metadata']['name']}: no caBundle, no trust path")
    service = spec["service"]
    backend = Backend(
        host=address[0],
        port=address[1],
        server_name=f"{service['name']}.{service['namespace']}.svc",
        ca_bundle_pem=bundle,
        client_cert=client_cert,
        client_key=client_key,
    )
    kube.api.aggregated[f"/apis/{spec['group']}/{spec['version']}"] = backend
    return backend
