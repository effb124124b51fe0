"""An argparse parser whose usage errors are one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn


class OneLineParser(argparse.ArgumentParser):
    """``prog: error: argument --x: … (see --help)``; subparsers made from it behave the same."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see --help)\n")


def existing_file(text: str) -> Path:
    """``argparse`` type for a file that must exist now (a CA bundle, a token), not at first use."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: no such file")
    return path
