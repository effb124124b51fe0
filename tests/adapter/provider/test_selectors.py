"""Label selectors: string form parsing, matching, LabelSelector objects and PromQL matchers."""

import pytest

from adapter.errors import BadRequest
from adapter.provider.selectors import (
    from_label_selector,
    parse_selector,
    regex_alternatives,
    to_promql_matchers,
)

LABELS = {"app": "llm-inference", "tier": "gpu", "app.kubernetes.io/name": "vllm"}


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("", True),
        ("app=", False),  # an empty value is valid and matches only an empty label
        ("app=llm-inference", True),
        ("app==llm-inference", True),
        ("app=embedder", False),
        ("app!=embedder", True),
        ("app!=llm-inference", False),
        ("missing!=x", True),  # != matches objects without the key, as in Kubernetes
        ("tier in (gpu, cpu)", True),
        ("tier in (cpu)", False),
        ("tier notin (cpu)", True),
        ("tier notin (gpu,cpu)", False),
        ("missing notin (x)", True),
        ("tier", True),
        ("missing", False),
        ("!missing", True),
        ("!tier", False),
        ("app=llm-inference,tier in (gpu),!canary", True),
        ("app.kubernetes.io/name=vllm", True),
        ("app=llm-inference, tier=cpu", False),
    ],
)
def test_matching(text: str, matches: bool) -> None:
    assert parse_selector(text).matches(LABELS) is matches


@pytest.mark.parametrize("bad", ["=x", "tier in (gpu", "a b c", "app=bad value", "tier in ()", ",", "app)"])
def test_bad_selectors_name_the_selector(bad: str) -> None:
    with pytest.raises(BadRequest) as err:
        parse_selector(bad)
    assert repr(bad) in str(err.value)


def test_string_round_trip() -> None:
    text = "app=llm,tier in (a,b),!canary,env!=prod,x.io/y,z notin (q)"
    assert str(parse_selector(text)) == text
    assert parse_selector(str(parse_selector(text))) == parse_selector(text)


def test_promql_matchers_for_kube_state_metrics_labels() -> None:
    sel = parse_selector("app=llm,tier in (a,b),!canary,env!=prod,app.kubernetes.io/name,z notin (q.1)")
    assert to_promql_matchers(sel, label_prefix="label_") == [
        'label_app="llm"',
        'label_tier=~"a|b"',
        'label_canary=""',
        'label_env!="prod"',
        'label_app_kubernetes_io_name=~".+"',
        'label_z!~"q\\\\.1"',
    ]


def test_regex_alternatives_escape_only_metacharacters() -> None:
    # '-' stays literal so Prometheus sees a plain set of names
    assert regex_alternatives(["llm-inference-0", "a.b"]) == "llm-inference-0|a\\.b"


def test_label_selector_object() -> None:
    sel = from_label_selector(
        {
            "matchLabels": {"app": "llm-inference"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["gpu"]},
                {"key": "canary", "operator": "DoesNotExist"},
            ],
        },
        where="test",
    )
    assert str(sel) == "app=llm-inference,tier in (gpu),!canary"
    assert sel.matches(LABELS)
    with pytest.raises(BadRequest, match="operator must be one of"):
        from_label_selector({"matchExpressions": [{"key": "x", "operator": "Near"}]}, where="spec.selector")
