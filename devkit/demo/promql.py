"""The demo's one door to Prometheus: instant queries over its HTTP API, read by the shared reader
(:mod:`gpupilot_common.promanswer`), whose failures become :class:`QueryError`."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

from gpupilot_common import promanswer

Sample = promanswer.Sample
LIMITS = promanswer.AnswerLimits(max_series=100_000, max_bytes=64 << 20)
CHUNK = 1 << 16


class QueryError(RuntimeError):
    pass


def query(base_url: str, expr: str, *, timeout: float = 15.0) -> list[Sample]:
    path = "/api/v1/query"
    url = f"{base_url}{path}?" + urllib.parse.urlencode({"query": expr})
    body = promanswer.AnswerBody(url=base_url, query=expr, limits=LIMITS)
    try:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                status, reason = resp.status, resp.reason
                while chunk := resp.read(CHUNK):
                    body.feed(chunk)
        except urllib.error.HTTPError as err:  # 4xx/5xx: their body says why
            status, reason = err.code, str(err.reason)
            body.feed(err.read(LIMITS.max_bytes))
        except TimeoutError as err:
            raise promanswer.timed_out(base_url, timeout, flag="timeout") from err
        except (urllib.error.URLError, OSError) as err:
            cause = getattr(err, "reason", err)
            raise promanswer.unreachable(base_url, str(cause), flag="the Prometheus URL") from err
        return promanswer.vector(promanswer.decode(status, reason, body, path=path), body)
    except promanswer.PrometheusFailure as exc:
        raise QueryError(str(exc)) from None
