"""Answer-size benchmark: a stand-in Prometheus on 127.0.0.1 streams a 1,000,000-series answer
(``devkit.hugeanswer``); the adapter (``explain-hpa``) and ``plan`` run against it with their
default answer limits, beside the adapter with the limits raised out of the way on a 200,000-series
answer (what every request cost before the limits). Peak RSS sampled with psutil every 10 ms.

Goals (issue 27): the adapter under 400 MiB and ``plan`` under 1 GiB, both ending with the error
within their timeout. ``python -m bench.answers``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from devkit.hugeanswer import HugeAnswerServer, Measured, answer_size, run_measured

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
ADAPTER = [sys.executable, "-m", "adapter", "explain-hpa", "-f", "examples/hpa-llm-inference.yaml"]


def _adapter(url: str, *extra: str) -> Measured:
    return run_measured(
        [*ADAPTER, "--prometheus-url", url, "--prometheus-timeout", "60", *extra], cwd=REPO, limit=120
    )


def _plan(url: str, out: Path) -> Measured:
    args = [sys.executable, "-m", "rightsizer", "plan", "--prometheus-url", url, "--out", str(out)]
    return run_measured([*args, "--timeout", "60", "--quiet"], cwd=REPO, limit=120)


def main() -> int:
    rows: list[tuple[str, int, Measured, int]] = []
    with HugeAnswerServer(1_000_000) as huge, tempfile.TemporaryDirectory() as tmp:
        rows.append(("adapter explain-hpa, default limits", 1_000_000, _adapter(huge.url), huge.bytes_sent))
        sent = huge.bytes_sent
        rows.append(
            (
                "plan, default limits",
                1_000_000,
                _plan(huge.url, Path(tmp) / "plan.json"),
                huge.bytes_sent - sent,
            )
        )
    with HugeAnswerServer(200_000) as big:
        raised = _adapter(big.url, "--max-answer-series", "10000000", "--max-answer-bytes", str(1 << 34))
        rows.append(("adapter explain-hpa, limits raised", 200_000, raised, big.bytes_sent))
    print(f"one answer of 1,000,000 series is {answer_size(1_000_000) / MiB:,.0f} MiB\n")
    print(f"{'run':38} {'series':>9} {'exit':>4} {'seconds':>7} {'peak RSS MiB':>12} {'read MiB':>8}")
    for name, series, m, read in rows:
        print(
            f"{name:38} {series:>9,} {m.code:>4} {m.seconds:>7.1f} {m.peak_rss / MiB:>12.0f} {read / MiB:>8.0f}"
        )
    for name, _series, m, _read in rows:
        print(f"  {name}: {m.stderr.strip().splitlines()[-1][:200] if m.stderr.strip() else '(no message)'}")
    goals = [
        ("adapter < 400 MiB with the error", rows[0][2].peak_rss < 400 * MiB and rows[0][2].code == 1),
        ("plan < 1 GiB with the error", rows[1][2].peak_rss < 1024 * MiB and rows[1][2].code == 1),
    ]
    print("goals: " + ", ".join(f"{g}: {'met' if ok else 'MISSED'}" for g, ok in goals))
    return 0 if all(ok for _g, ok in goals) else 1


if __name__ == "__main__":
    raise SystemExit(main())
