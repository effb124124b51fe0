"""chunks.by_pod_name: a query with one series per pod asked whole, or in parts by the last
characters of the pods' names when the answer is over the series limit; the parts add up to the
whole answer, every pod once, whatever its name ends in."""

from __future__ import annotations

import random
import re
import string

import pytest

from rightsizer.clients.chunks import by_pod_name
from rightsizer.clients.prometheus import PrometheusAnswerTooLarge, Sample

_MATCHER = re.compile(r'^kube_pod_owner\{(?:pod=~"(?P<re>[^"]*)")?\}$')


class Pods:
    """A client answering ``kube_pod_owner{pod=~"RE"}`` over a list of pods (RE fully anchored, as
    Prometheus does), refusing answers over ``limit`` series as the real client does."""

    def __init__(self, names: list[str], limit: int) -> None:
        self.names, self.limit, self.queries = names, limit, 0

    def instant(self, query: str, at: float) -> list[Sample]:
        self.queries += 1
        m = _MATCHER.match(query)
        assert m, query
        pattern = re.compile(m["re"] or ".*", re.DOTALL)
        found = [Sample({"pod": n}, 1.0, at) for n in self.names if pattern.fullmatch(n)]
        if len(found) > self.limit:
            raise PrometheusAnswerTooLarge(f"{query}: more than {self.limit:,} series (--max-answer-series)")
        return found


def _query(matcher: str) -> str:
    return f"kube_pod_owner{{{matcher}}}"


def _names(count: int, seed: int = 7) -> list[str]:
    rnd = random.Random(seed)
    alphabet = string.ascii_lowercase + string.digits
    names = [f"web-{''.join(rnd.choices(alphabet, k=5))}" for _ in range(count)]
    # names a random suffix does not give: one or two characters, upper case, a dot, a dash at the end
    return [*names, "a", "7", "zz", "X", "job.v2", "trailing-", "Ab"]


def test_a_small_answer_is_one_query() -> None:
    client = Pods(_names(50), limit=1000)
    got = by_pod_name(client, _query, 0.0)  # type: ignore[arg-type]
    assert client.queries == 1 and len(got) == len(client.names)


@pytest.mark.parametrize("limit", [400, 100])  # one level of parts, then two
def test_parts_add_up_to_every_pod_once(limit: int) -> None:
    client = Pods(_names(2000), limit=limit)
    got = [s.labels["pod"] for s in by_pod_name(client, _query, 0.0)]  # type: ignore[arg-type]
    assert sorted(got) == sorted(client.names)
    assert client.queries > 1


def test_more_pods_than_two_levels_of_parts_hold_is_the_limit_named() -> None:
    client = Pods(_names(2000), limit=5)
    with pytest.raises(PrometheusAnswerTooLarge, match="--max-answer-series"):
        by_pod_name(client, _query, 0.0)  # type: ignore[arg-type]
