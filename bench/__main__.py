"""``python -m bench [AREA …]``: run every ``bench/<area>.py`` that exists, each in its own process.

Areas run one after the other (a benchmark must not share CPU with another) and print their own
tables; the exit status is non-zero when any area's process failed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

AREAS = (
    "exporter",
    "sharing",
    "adapter",
    "adapter_peer",
    "keda",
    "keda_peer",
    "rightsizer",
    "trace",
    "inventory",
    "answers",
    "scale",
    "recommend",
)
HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    wanted = argv or [a for a in AREAS if (HERE / f"{a}.py").exists()]
    unknown = [a for a in wanted if not (HERE / f"{a}.py").exists()]
    if unknown:
        print(f"bench: no benchmark for {', '.join(unknown)}; available: {', '.join(AREAS)}", file=sys.stderr)
        return 2
    failed = []
    for area in wanted:
        print(f"\n=== bench/{area}.py ===", flush=True)
        started = time.monotonic()
        rc = subprocess.run([sys.executable, "-m", f"bench.{area}"], cwd=HERE.parent, check=False).returncode
        print(f"=== {area}: exit {rc} after {time.monotonic() - started:.0f}s ===", flush=True)
        if rc != 0:
            failed.append(area)
    if failed:
        print(f"bench: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
