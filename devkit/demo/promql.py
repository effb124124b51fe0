"""The demo's one door to Prometheus: instant queries over its HTTP API."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass


class QueryError(RuntimeError):
    pass


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


def query(base_url: str, expr: str, *, timeout: float = 15.0) -> list[Sample]:
    url = f"{base_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = json.load(resp)
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:200]
        raise QueryError(f"Prometheus rejected {expr!r}: HTTP {err.code} {detail}") from err
    except (urllib.error.URLError, OSError) as err:
        raise QueryError(f"Prometheus at {base_url} unreachable: {err}") from err
    data = body.get("data", {})
    if body.get("status") != "success" or data.get("resultType") != "vector":
        raise QueryError(f"unexpected answer to {expr!r}: {str(body)[:200]}")
    return [Sample(dict(r["metric"]), float(r["value"][1])) for r in data["result"]]
