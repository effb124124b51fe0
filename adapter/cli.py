"""``gpupilot-adapter``: ``serve`` (the custom/external metrics API server), ``explain-hpa`` and
``replay-hpa``, ``recommend-hpa``, ``check-apiservices`` (before installing: does another adapter own the metrics APIs?),
``convert-config``.

Each subcommand lives in :mod:`adapter.commands` (one module each, with ``add_arguments`` and ``run``);
this module holds the top-level parser and the one place errors become a line and an exit code."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from adapter.commands import check_apiservices, convert_config, explain_hpa, recommend_hpa, replay_hpa, serve
from adapter.errors import AdapterError, ConfigError
from gpupilot_common import logs
from gpupilot_common.cli import OneLineParser, add_version


class Command(NamedTuple):
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {
    "serve": Command(
        "run the HTTPS API server", "Run the metrics API server.", serve.add_arguments, serve.run
    ),
    "check-apiservices": Command(
        "before installing: is custom/external.metrics.k8s.io served by another adapter?",
        "Read the APIServices deploy/adapter would install and refuse (exit 1) when another server, "
        "such as prometheus-adapter or KEDA, serves the same API group. Exit 0: free or already "
        "gpupilot's; 2: the API could not be read.",
        check_apiservices.add_arguments,
        check_apiservices.run,
    ),
    "convert-config": Command(
        "convert a prometheus-adapter config file to this adapter's format",
        "Read a prometheus-adapter config (rules, externalRules, resourceRules) and write the "
        "equivalent gpupilot-adapter config; print one line per item that could not be expressed. "
        "Exit 0 when something was converted, 1 when nothing was, 2 when the file cannot be read.",
        convert_config.add_arguments,
        convert_config.run,
    ),
    "explain-hpa": Command(
        "show what an HPA would do now, metric by metric",
        "Fetch the values an autoscaling/v2 HPA would see and apply the HPA's algorithm.",
        explain_hpa.add_arguments,
        explain_hpa.run,
    ),
    "replay-hpa": Command(
        "replay an HPA (as written or with other targets) over Prometheus history",
        "Run the HPA controller's decision over past metric values and show replicas over time.",
        replay_hpa.add_arguments,
        replay_hpa.run,
    ),
    "recommend-hpa": Command(
        "the HPA targets and behaviour that spend the fewest GPU-hours while a service bound holds",
        "Recover the offered load and a per-replica capacity model from history, replay candidate "
        "configurations with the HPA controller's decision, and recommend the cheapest that holds the bound "
        "on held-out days. Exit 0 with a recommendation, 1 when nothing meets the bound, 2 on bad input.",
        recommend_hpa.add_arguments,
        recommend_hpa.run,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="gpupilot-adapter",
        description="Serve Prometheus metrics to the HPA as custom.metrics.k8s.io / external.metrics.k8s.io.",
    )
    logs.add_flags(parser)
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        sp = sub.add_parser(name, help=command.help, description=command.description)
        add_version(sp)
        logs.add_flags(sp, top_level=False)
        command.add_arguments(sp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    level = logs.level_of(args)
    logs.configure(service="adapter", log_format=args.log_format, level=level)
    if level != "debug":
        # urllib3's own "Retrying (Retry(total=2 …))" lines come before the command's one-line error
        # about an unreachable API server; --log-level debug shows them
        logging.getLogger("urllib3").setLevel(logging.ERROR)
    try:
        return COMMANDS[args.command].run(args)
    except AdapterError as exc:
        print(f"gpupilot-adapter {args.command}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())
