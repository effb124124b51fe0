"""``gpupilot-adapter``, the console script: :mod:`adapter.cli` behind the one-line missing-extra check
(:mod:`gpupilot_common.entrypoint`)."""

from __future__ import annotations

from collections.abc import Sequence

from gpupilot_common import entrypoint

PROG = "gpupilot-adapter"


def main(argv: Sequence[str] | None = None) -> int:
    return entrypoint.run(prog=PROG, extras=("adapter",), cli="adapter.cli", argv=argv)
