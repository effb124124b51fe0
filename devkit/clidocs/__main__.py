"""``python -m devkit.clidocs [--check]``: write docs/reference/ (or say which page is stale)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from devkit.clidocs import commands, helmvalues

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "reference"
CHART = ROOT / "deploy" / "helm" / "gpupilot"


def wanted() -> dict[str, str]:
    """Every generated page: file name → content."""
    pages = commands.pages()
    pages["helm-values.md"] = helmvalues.page(CHART)
    return pages


def stale(out: Path = OUT) -> list[str]:
    """Generated pages missing from ``out`` or different from what the code says now."""
    return sorted(
        name
        for name, text in wanted().items()
        if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text
    )


def write(out: Path = OUT) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in wanted().items():
        path = out / name
        tmp = path.with_name(f".{name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devkit.clidocs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 naming the stale pages; write nothing")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        if names:
            print(
                f"stale reference pages: {', '.join(names)}; run: python -m devkit.clidocs", file=sys.stderr
            )
            return 1
        return 0
    for path in write():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
