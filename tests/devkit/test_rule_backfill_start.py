"""promtool ``create-blocks-from rules`` (2.42) writes nothing at all, and exits 0, when the rule
group's first evaluation falls after the end of the first 2 h block: the rules' backfill starts at
that block's end instead when ``--start`` lies within one evaluation interval of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from devkit import history
from devkit.prometheus import PrometheusError

EVEN_HOUR = 1796601600  # 2026-12-07T00:00:00Z: a 2 h block boundary
assert EVEN_HOUR % history.PROMTOOL_BLOCK_SECONDS == 0


@pytest.mark.parametrize(
    ("start", "interval", "expected"),
    [
        (EVEN_HOUR - 41, 300, EVEN_HOUR),  # the demo's failing run: 41 s before the boundary
        (EVEN_HOUR - 1, 300, EVEN_HOUR),
        (EVEN_HOUR - 300, 300, EVEN_HOUR),  # an evaluation in its last second would still be cut off
        (EVEN_HOUR - 300.5, 300, EVEN_HOUR - 301),  # promtool takes whole seconds, as given
        (EVEN_HOUR - 301, 300, EVEN_HOUR - 301),  # the first block holds an evaluation whatever the offset
        (EVEN_HOUR, 300, EVEN_HOUR),
        (EVEN_HOUR + 1, 300, EVEN_HOUR + 1),
        (EVEN_HOUR - 3600, 300, EVEN_HOUR - 3600),
        (EVEN_HOUR - 59, 60, EVEN_HOUR),
        (EVEN_HOUR - 61, 60, EVEN_HOUR - 61),
    ],
)
def test_rules_start_leaves_an_evaluation_in_promtools_first_block(
    start: float, interval: float, expected: int
) -> None:
    assert history.promtool_rules_start(start, interval) == expected


def test_an_interval_of_a_block_or_more_is_refused_with_the_reason(tmp_path: Path) -> None:
    """promtool would skip the rest of the range at the first 2 h block holding no evaluation."""
    with pytest.raises(PrometheusError, match=r"every 7200s: .* use an interval under 2 h"):
        history.backfill_rules(tmp_path, [], start=EVEN_HOUR - 86400, end=EVEN_HOUR, eval_interval=7200)
