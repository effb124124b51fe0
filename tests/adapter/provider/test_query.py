"""Query templates → PromQL: placeholders, the max-value-age rewrite, and pod-set matchers."""

from adapter.provider.values import _name_pods, render_query


def test_placeholders_and_freshness_rewrite() -> None:
    q = render_query(
        "sum by (<<by>>) (<<series>>{<<matchers>>}) / sum by (<<by>>) (DCGM_FI_DEV_FB_FREE{<<matchers>>})",
        series="DCGM_FI_DEV_FB_USED",
        matchers=['namespace="a"', 'pod="p"'],
        by="namespace, pod",
        max_age=120,
    )
    assert q == (
        'sum by (namespace, pod) (last_over_time(DCGM_FI_DEV_FB_USED{namespace="a", pod="p"}[120s]))'
        ' / sum by (namespace, pod) (last_over_time(DCGM_FI_DEV_FB_FREE{namespace="a", pod="p"}[120s]))'
    )


def test_no_age_limit_and_range_selectors_left_alone() -> None:
    assert render_query("x{<<matchers>>}", series="x", matchers=[], by="", max_age=0) == "x{}"
    q = render_query(
        "sum(rate(x{<<matchers>>}[5m])) + y{<<matchers>>}", series="x", matchers=['a="1"'], by="", max_age=60
    )
    assert q == 'sum(rate(x{a="1"}[5m])) + last_over_time(y{a="1"}[60s])'
    assert render_query(
        "gpupilot:fleet_waste:gpu_equivalents{<<matchers>>}", series="s", matchers=[], by="", max_age=30
    ) == ("last_over_time(gpupilot:fleet_waste:gpu_equivalents{}[30s])")


def test_pods_are_named_only_when_they_are_a_small_part_of_the_namespace() -> None:
    assert _name_pods(500, 5000)
    assert _name_pods(1, 2)
    assert not _name_pods(3, 5)
    assert not _name_pods(5000, 5000)
    assert not _name_pods(2500, 100_000)  # above 2,000 names the body would grow past ~80 KB
    assert not _name_pods(0, 10)
