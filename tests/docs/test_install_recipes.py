"""docs/install.md's recipes: every values block renders with the real Helm and passes the chart's
schema, so a recipe copied into my-values.yaml installs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_helm import CHART, run_helm

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "install.md"
BLOCK = re.compile(r"```yaml\n(.*?)```", re.S)
TOP_LEVEL = {
    "exporter",
    "adapter",
    "rightsizer",
    "prometheus",
    "prometheusAuth",
    "monitoring",
    "networkPolicy",
}


def recipes() -> list[tuple[str, str]]:
    out = []
    for i, text in enumerate(BLOCK.findall(PAGE.read_text())):
        doc = yaml.safe_load(text)
        if isinstance(doc, dict) and set(doc) & TOP_LEVEL and "apiVersion" not in doc:
            out.append((f"block-{i}", text))
    return out


RECIPES = recipes()


def test_the_page_has_its_recipes() -> None:
    assert len(RECIPES) >= 5  # MIG, time-slicing, GKE, EKS, AKS


@pytest.mark.slow
@pytest.mark.parametrize(("name", "text"), RECIPES, ids=[n for n, _ in RECIPES])
def test_each_recipe_renders(name: str, text: str, tmp_path: Path) -> None:
    values = tmp_path / f"{name}.yaml"
    values.write_text(text)
    res = run_helm("template", "gpupilot", str(CHART), "--namespace", "gpupilot", "-f", str(values))
    assert res.returncode == 0, f"{name}: {res.stderr.strip()}\n{text}"
