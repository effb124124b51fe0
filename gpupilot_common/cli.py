"""An argparse parser whose usage errors are one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
from importlib import metadata
from pathlib import Path
from typing import NoReturn

from gpupilot_common.paths import file_problem


class OneLineParser(argparse.ArgumentParser):
    """``prog: error: argument --x: … (see --help)``; subparsers made from it behave the same."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")


def existing_file(text: str) -> Path:
    """``argparse`` type for a file that must exist now (a CA bundle, a token), not at first use."""
    path = Path(text)
    if problem := file_problem(path):
        raise argparse.ArgumentTypeError(f"{text!r}: {problem}")
    return path


DISTRIBUTION = "gpupilot"


def package_version() -> str:
    """The installed package's version (its metadata), or ``unknown`` when run from a bare checkout."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def add_version(parser: argparse.ArgumentParser) -> None:
    """``--version``: ``gpupilot-rightsizer plan 0.1.0`` (the program as the parser names it)."""
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {package_version()}",
        help="print the version and exit",
    )
