"""What each service's image would hold: the installed size of its dependency closure.

``python -m devkit.image_contents`` reads the installed distributions' metadata (no download, no
Docker): for each service extra of ``gpupilot`` (``exporter``, ``adapter``, ``rightsizer``), the
closure of its requirements with environment markers evaluated, and the bytes of every file those
distributions installed. The figures are the site-packages part of an image; the base image
(``python:3.11-slim``) comes on top and is shared by all three.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

SERVICES = ("exporter", "adapter", "rightsizer")
DIST = "gpupilot"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(dist: metadata.Distribution, extras: Iterable[str]) -> list[Requirement]:
    out = []
    wanted = set(extras)
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None:
            out.append(req)
            continue
        if (
            any(req.marker.evaluate({"extra": e}) for e in wanted) and not req.marker.evaluate({"extra": ""})
        ) or req.marker.evaluate({"extra": ""}):
            out.append(req)
    return out


def root_requirements(extras: Iterable[str], pyproject: Path = PYPROJECT) -> list[Requirement]:
    """gpupilot's own requirements for ``extras``, read from pyproject.toml (not the installed copy)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    reqs = [Requirement(t) for t in project.get("dependencies", [])]
    for extra in extras:
        reqs += [Requirement(t) for t in project.get("optional-dependencies", {}).get(extra, [])]
    return reqs


def closure(extras: Sequence[str], *, pyproject: Path = PYPROJECT) -> dict[str, metadata.Distribution]:
    """Distributions (by normalised name) that ``pip install gpupilot[extras]`` installs, gpupilot excluded."""
    found: dict[str, metadata.Distribution] = {}
    todo: list[tuple[str, tuple[str, ...]]] = []
    for req in root_requirements(extras, pyproject):
        todo.append((req.name, tuple(req.extras)))
    while todo:
        name, req_extras = todo.pop()
        key = _norm(name)
        if key == _norm(DIST):
            for req in root_requirements(req_extras, pyproject):
                todo.append((req.name, tuple(req.extras)))
            continue
        if key in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # not installed here (a platform we are not on)
        found[key] = dist
        for req in _requirements(dist, req_extras):
            todo.append((req.name, tuple(req.extras)))
    return found


def size_of(dist: metadata.Distribution) -> int:
    total = 0
    for f in dist.files or []:
        try:
            total += Path(str(dist.locate_file(f))).stat().st_size
        except OSError:
            continue
    return total


@dataclass(frozen=True)
class ImageContents:
    service: str
    distributions: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.distributions.values())


def contents(service: str) -> ImageContents:
    return ImageContents(service, {k: size_of(d) for k, d in sorted(closure([service]).items())})


def render(images: Sequence[ImageContents], *, top: int = 5) -> str:
    everything = {k: v for img in images for k, v in img.distributions.items()}
    lines = [f"{'IMAGE':<12} {'MiB':>7}  {'DISTS':>5}  LARGEST"]
    for img in [*images, ImageContents("one image", everything)]:
        largest = sorted(img.distributions.items(), key=lambda kv: -kv[1])[:top]
        names = ", ".join(f"{k} {v / 2**20:.0f}" for k, v in largest)
        lines.append(f"{img.service:<12} {img.total / 2**20:7.1f}  {len(img.distributions):5d}  {names}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.image_contents",
        description="Installed size of each service image's Python dependencies (from this environment).",
    )
    parser.add_argument(
        "--top", type=int, default=5, help="largest distributions listed per image (default 5)"
    )
    args = parser.parse_args(argv)
    images = [contents(s) for s in SERVICES]
    print(render(images, top=args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
