"""plan.json with a field of the wrong type: ``apply --dry-run`` answers one line and exit 1 or 2,
never a traceback (hypothesis puts every JSON type at every field, including a list or a number as
``mig_parted_config."mig-configs"``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rightsizer.cli import main
from rightsizer.plan.model import plan_to_dict
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer.apply_support import Change, make_plan, seed_node

GOOD = {"3g.40gb": 1, "1g.10gb": 4}
BASE: dict[str, Any] = plan_to_dict(make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]))


def _paths(value: object, prefix: tuple[object, ...] = ()) -> Iterator[tuple[object, ...]]:
    """Every field path of the plan, objects and lists included."""
    if prefix:
        yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value[:2]):
            yield from _paths(item, (*prefix, i))


PATHS = sorted(_paths(BASE), key=repr)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


def _set(doc: Any, path: tuple[object, ...], value: object) -> Any:
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a")
        yield kube.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")


def _dry_run(doc: Any, kubeconfig: Path, tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    plan = tmp / "plan.json"
    plan.write_text(json.dumps(doc))
    code = main(["apply", "--plan", str(plan), "--kubeconfig", str(kubeconfig), "--dry-run"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err


@pytest.mark.parametrize(
    "configs", [["gpupilot-x"], 7, "all-1g.10gb", {"gpupilot-x": 3}, {"gpupilot-x": [5]}]
)
def test_mig_configs_of_the_wrong_type_is_one_line(
    configs: object, cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _dry_run(_set(BASE, ("mig_parted_config", "mig-configs"), configs), cluster, tmp_path, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "mig_parted_config.mig-configs" in err, err


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(PATHS), value=JSON)
def test_any_field_of_any_type_is_one_line_or_accepted(
    path: tuple[object, ...], value: object, cluster: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _dry_run(_set(BASE, path, value), cluster, tmp_path, capsys)
    assert code in (0, 1, 2)
    if code:
        assert len(err.strip().splitlines()) == 1, err
