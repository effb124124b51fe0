"""``gpupilot-exporter``, the console script: :mod:`exporter.commands.cli` behind the one-line
missing-extra check (:mod:`gpupilot_common.entrypoint`). ``--backend sim``, ``backfill`` and
``cluster`` need the simulator's extra too, and the line names both."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence

from gpupilot_common import entrypoint

PROG = "gpupilot-exporter"
SIMULATOR_COMMANDS = ("backfill", "cluster")


def wants_simulator(args: Sequence[str]) -> bool:
    """The simulator's commands, or ``--backend sim`` (as two words or ``--backend=sim``)."""
    if args and args[0] in SIMULATOR_COMMANDS:
        return True
    pairs = itertools.pairwise(args)
    return "--backend=sim" in args or any(a == "--backend" and b == "sim" for a, b in pairs)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extras = ("exporter", "simulator") if wants_simulator(args) else ("exporter",)
    return entrypoint.run(prog=PROG, extras=extras, cli="exporter.commands.cli", argv=args)
