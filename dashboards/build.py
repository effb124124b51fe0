"""Write dashboards/*.json from the Python definitions (``make dashboards``).

``python -m dashboards.build`` rewrites the files; ``--check`` only compares and exits 1 naming
each file that is out of date, so CI can tell when someone edited JSON by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from dashboards import autoscaling, fleet, health, mig, node, rightsizing
from dashboards.model import Dashboard

HERE = Path(__file__).resolve().parent

DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "gpupilot-fleet.json": fleet.dashboard,
    "gpupilot-node.json": node.dashboard,
    "gpupilot-mig.json": mig.dashboard,
    "gpupilot-autoscaling.json": autoscaling.dashboard,
    "gpupilot-rightsizing.json": rightsizing.dashboard,
    "gpupilot-health.json": health.dashboard,
}


def render(make: Callable[[], Dashboard]) -> str:
    """The JSON text of one dashboard, as committed (sorted keys, two-space indent)."""
    return json.dumps(make().to_json(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.build", description=__doc__)
    parser.add_argument(
        "--out",
        type=Path,
        default=HERE,
        help="directory for the JSON files (default: the dashboards/ folder itself)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a committed file differs from what the builder produces",
    )
    args = parser.parse_args(argv)
    stale = []
    for name, make in DASHBOARDS.items():
        path = args.out / name
        text = render(make)
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
            continue
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run 'make dashboards'", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
