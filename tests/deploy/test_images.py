"""One image per service: each service's dependency closure covers what its code imports, and the
exporter's (pulled on every GPU node) holds none of the analysis stack."""

from __future__ import annotations

import ast
import functools
import sys
from importlib import metadata
from pathlib import Path

import pytest

from devkit import image_contents
from gpupilot_common.entrypoint import OWN_PACKAGES

ROOT = Path(__file__).resolve().parents[2]
OWN = OWN_PACKAGES
SHARED = {"gpupilot_common", "mig_geometry", "hpa_controller"}


def third_party_imports(package: Path) -> set[str]:
    """Top-level third-party imports of ``package``, and of the shared modules (gpupilot_common, hpa_controller,
    mig_geometry) it reaches, in every form: ``from gpupilot_common.x import y``,
    ``from gpupilot_common import x``, ``import gpupilot_common.x``, and those modules' own imports."""
    found: set[str] = set()
    paths = list(package.rglob("*.py"))
    for path in paths:  # grows while it is walked: shared modules reached add theirs
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for module in modules:
                if module.split(".")[0] not in SHARED:
                    continue
                base = ROOT / module.replace(".", "/")
                for shared in (base.with_suffix(".py"), base / "__init__.py"):
                    if shared.is_file() and shared not in paths:
                        paths.append(shared)
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OWN and top != "__future__":
                    found.add(top)
    return found


@functools.cache
def _distributions_by_module() -> dict[str, list[str]]:
    """Installed distributions by top-level module (a scan of every installed package: once)."""
    return dict(metadata.packages_distributions())


def distributions_of(module: str) -> set[str]:
    return {image_contents._norm(d) for d in _distributions_by_module().get(module, [])}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("service", "package", "extras"),
    [
        ("exporter", "exporter", ["exporter"]),
        ("simulator", "simulator", ["exporter", "simulator"]),  # --backend sim, backfill, cluster
        ("adapter", "adapter", ["adapter"]),
        ("rightsizer", "rightsizer", ["rightsizer"]),
    ],
)
def test_each_service_extra_covers_its_imports(service: str, package: str, extras: list[str]) -> None:
    closure = set(image_contents.closure(extras))
    imports = third_party_imports(ROOT / package)
    assert imports, "the import scan found nothing"
    missing = {m for m in imports if not distributions_of(m) & closure}
    assert not missing, f"gpupilot[{service}] lacks the distributions of {sorted(missing)}"


def test_exporter_image_holds_no_analysis_stack_and_is_small() -> None:
    exporter = image_contents.contents("exporter")
    everything = {k for s in image_contents.SERVICES for k in image_contents.closure([s])}
    heavy = {"pandas", "scipy", "matplotlib", "numpy", "kubernetes"}
    assert not heavy & set(exporter.distributions), sorted(heavy & set(exporter.distributions))
    assert heavy <= everything, "the measurement no longer sees the other services' dependencies"
    assert exporter.total < 64 * 2**20, f"exporter dependencies: {exporter.total / 2**20:.0f} MiB"


def test_exporter_core_imports_no_simulator_dependency() -> None:
    """numpy belongs to the simulator: the exporter must not import it at module level (nor the
    simulator at all: an import-linter contract; --backend sim loads it by name)."""
    core = set()
    for path in (ROOT / "exporter").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:  # module level only; lazy imports are fine
            if isinstance(node, ast.Import):
                core |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                core.add(node.module.split(".")[0] if node.level == 0 else "")
                if node.module.startswith("simulator"):
                    core.add("simulator")
    assert "numpy" not in core and "simulator" not in core


@pytest.mark.slow
def test_report_renders_every_service() -> None:
    text = image_contents.render([image_contents.contents(s) for s in image_contents.SERVICES])
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["IMAGE", "MiB", "DISTS"]
    assert [line.split()[0] for line in lines[1:4]] == list(image_contents.SERVICES)
    assert lines[4].startswith("one image")


# The built images themselves are not run here: `make images` runs each one's commands and main job
# as it builds it (CI runs it after `make test`), and `make e2e` runs them as the chart and the
# overlays start them.
