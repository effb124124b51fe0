"""One Prometheus (or VictoriaMetrics) instant query for tests: the answer's result list, after
asserting the server said ``success`` (the message names the expression and the server's error)."""

from __future__ import annotations

from typing import Any

import requests


def instant(
    url: str, expr: str, at: float | None = None, *, timeout: float = 60.0, **params: Any
) -> list[dict[str, Any]]:
    """``GET {url}/api/v1/query`` for ``expr`` at ``at`` (default: the server's now); extra
    ``params`` go into the query string as given."""
    query: dict[str, Any] = {"query": expr, **params}
    if at is not None:
        query["time"] = at
    body = requests.get(f"{url}/api/v1/query", params=query, timeout=timeout).json()
    assert body["status"] == "success", f"{expr}: {body.get('error', body)}"
    return list(body["data"]["result"])
