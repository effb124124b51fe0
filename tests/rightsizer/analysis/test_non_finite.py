"""NaN and ±Inf in Prometheus answers never reach a statistic: plan ended in an OverflowError
decoding an infinite peak hour (``decode_peak_hour``)."""

from __future__ import annotations

import math

from rightsizer.analysis import history
from rightsizer.clients.prometheus import Sample

LABELS = {"Hostname": "node-a", "gpu": "0", "UUID": "GPU-a", "GPU_I_ID": "9", "GPU_I_PROFILE": "1g.10gb"}


def test_non_finite_samples_are_left_out_of_the_fold() -> None:
    stats: dict[tuple[str, ...], dict[str, float]] = {}
    for column, value in (("peak", 0.4), ("peak_hour", math.inf), ("peak", math.nan), ("p95", -math.inf)):
        history._fold(stats, [Sample(LABELS, value, 0.0)], column, "cluster")
    (row,) = stats.values()
    assert row == {"peak": 0.4}
    assert "peak_hour" not in row  # so decode_peak_hour never sees inf (int(inf) is an OverflowError)


def test_a_finite_peak_hour_decodes() -> None:
    origin = 1_764_460_800.0
    assert history.decode_peak_hour(history.HOUR_CODE - 1, origin) == origin
