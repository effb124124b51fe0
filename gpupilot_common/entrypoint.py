"""The console scripts' entry: a service whose extra is not installed says so in one line.

``pip install gpupilot`` installs all three commands but none of the services' dependencies; each
service's come with its extra (``pip install 'gpupilot[adapter]'``). :func:`run` loads the service's
command-line module by name and runs it; a third-party module missing on the way, at import or
later, ends as one line naming the extra to install and exit status 2, never a traceback::

    gpupilot-adapter: the adapter's dependencies are not installed (no module 'orjson'); install them with: pip install 'gpupilot[adapter]'

``--version`` alone answers without loading anything, so it works on any install.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from gpupilot_common.cli import package_version

OWN_PACKAGES = frozenset(
    {
        "exporter",
        "simulator",
        "adapter",
        "rightsizer",
        "mig_geometry",
        "hpa_controller",
        "gpupilot_common",
        "devkit",
    }
)
"""Modules of this distribution: one of them missing is a broken install or a bug, not an extra."""
MISSING_EXTRA_EXIT = 2
VERSION_ONLY = frozenset({"--version", "-v", "--verbose"})


def missing_extra_line(prog: str, extras: Sequence[str], module: str) -> str:
    """``PROG: the adapter's dependencies are not installed (no module 'X'); install them with: …``."""
    whose = " and the ".join(f"{extra}'s" for extra in extras)
    return (
        f"{prog}: the {whose} dependencies are not installed (no module {module!r}); "
        f"install them with: pip install 'gpupilot[{','.join(extras)}]'"
    )


def third_party_missing(exc: ModuleNotFoundError) -> str | None:
    """The top-level name of the missing module when it is another distribution's, else None."""
    top = (exc.name or "").partition(".")[0]
    if not top or top in OWN_PACKAGES or top in sys.stdlib_module_names:
        return None
    return top


def run(*, prog: str, extras: Sequence[str], cli: str, argv: Sequence[str] | None = None) -> int:
    """``cli.main(argv)`` (the module named ``cli``), with a missing dependency as one line.

    ``extras``: the extras the invocation needs, named in the line (``("exporter", "simulator")``
    for the exporter's ``--backend sim``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--version" in args and set(args) <= VERSION_ONLY:
        print(f"{prog} {package_version()}")
        return 0
    try:
        module = importlib.import_module(cli)
        return int(module.main(args))
    except ModuleNotFoundError as exc:
        missing = third_party_missing(exc)
        if missing is None:
            raise
        print(missing_extra_line(prog, extras, missing), file=sys.stderr)
        return MISSING_EXTRA_EXIT
