"""``gpupilot-rightsizer``: validate, plan, apply, report, serve.

Subcommands live in :mod:`rightsizer.commands` (one module each, imported only when used so that
``validate`` does not pay for pandas or the Kubernetes client).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from gpupilot_common import logs
from gpupilot_common.cli import OneLineParser, add_version
from rightsizer.errors import RightsizerError

COMMANDS: dict[str, str] = {
    "validate": "check mig-parted configs against the MIG geometry catalogue",
    "plan": "read Prometheus history and propose better MIG layouts (read-only)",
    "apply": "apply a plan through the NVIDIA MIG Manager's node-label protocol",
    "report": "write the weekly rightsizing report (HTML, Markdown, PNG charts)",
    "serve": "run scheduled jobs: weekly report, periodic plan, guarded auto-apply",
    "drain": "ask a running serve to stop auto-applying and wait until no apply is in flight",
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="gpupilot-rightsizer",
        description="Find idle MIG slices, compute better layouts and apply them safely.",
    )
    logs.add_flags(parser)
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = next((a for a in argv if a in COMMANDS), None)
    for name, summary in COMMANDS.items():
        sp = sub.add_parser(name, help=summary, description=summary)
        add_version(sp)
        logs.add_flags(sp, top_level=False)
        if name == wanted:
            module = importlib.import_module(f"rightsizer.commands.{name}")
            module.add_arguments(sp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(args_list)
    args = parser.parse_args(args_list)
    level = logs.level_of(args)
    logs.configure(service="rightsizer", log_format=args.log_format, level=level)
    if level != "debug":
        # urllib3's own "Retrying (Retry(total=2 …))" lines come before the command's one-line error
        # about an unreachable API server; --log-level debug shows them
        logging.getLogger("urllib3").setLevel(logging.ERROR)
    module = importlib.import_module(f"rightsizer.commands.{args.command}")
    try:
        code: int = module.run(args)
    except RightsizerError as err:
        # The one catch for the whole tree: whatever a command did not handle itself ends as one
        # line and the error's exit code (2 for bad input, 1 for failures), never a traceback.
        print(f"gpupilot-rightsizer {args.command}: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print(f"gpupilot-rightsizer {args.command}: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
