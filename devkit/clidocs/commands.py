"""Every command's parser, by reference page: ``gpupilot-rightsizer-plan.md`` is ``gpupilot-rightsizer
plan``. A command module's ``OUTPUT_SCHEMA`` (Markdown: what ``-o json`` prints) is added to its page."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from devkit.clidocs import parsers, schemas


@dataclass(frozen=True)
class Command:
    page: str
    """File name under docs/reference/, without ``.md``."""
    title: str
    parser: argparse.ArgumentParser
    schema: str = ""
    see: str = ""
    """Prefix of the subcommand pages' names (the top page links to them)."""


def schema_for(module: str) -> str:
    """The module's ``OUTPUT_SCHEMA``, its ``{table}`` filled from ``OUTPUT_DATACLASS`` when it names one."""
    try:
        found = importlib.import_module(module)
    except ImportError:
        return ""
    text = str(getattr(found, "OUTPUT_SCHEMA", ""))
    cls = getattr(found, "OUTPUT_DATACLASS", None)
    return text.replace("{table}", schemas.table(cls).rstrip()) if cls is not None else text


def _exporter() -> Iterator[Command]:
    cli = importlib.import_module("exporter.commands.cli")
    yield Command("gpupilot-exporter", "gpupilot-exporter", cli.build_parser())
    sim = importlib.import_module("simulator.cli")
    yield Command("gpupilot-exporter-backfill", "gpupilot-exporter backfill", sim.backfill_parser())
    yield Command("gpupilot-exporter-cluster", "gpupilot-exporter cluster", sim.cluster_parser())


def _adapter() -> Iterator[Command]:
    top: argparse.ArgumentParser = importlib.import_module("adapter.cli").build_parser()
    yield Command("gpupilot-adapter", "gpupilot-adapter", top, see="gpupilot-adapter-")
    for name, (_, sub) in parsers.subcommands(top).items():
        schema = schema_for(f"adapter.commands.{name.replace('-', '_')}")
        yield Command(f"gpupilot-adapter-{name}", f"gpupilot-adapter {name}", sub, schema=schema)


def _rightsizer() -> Iterator[Command]:
    cli = importlib.import_module("rightsizer.cli")
    top: argparse.ArgumentParser = cli.build_parser([])
    yield Command("gpupilot-rightsizer", "gpupilot-rightsizer", top, see="gpupilot-rightsizer-")
    for name in cli.COMMANDS:
        _, sub = parsers.subcommands(cli.build_parser([name]))[name]
        schema = schema_for(f"rightsizer.commands.{name}")
        yield Command(f"gpupilot-rightsizer-{name}", f"gpupilot-rightsizer {name}", sub, schema=schema)


SOURCES: tuple[Callable[[], Iterator[Command]], ...] = (_exporter, _adapter, _rightsizer)


def all_commands() -> list[Command]:
    return [c for source in SOURCES for c in source()]


def render(c: Command) -> str:
    return parsers.page(c.parser, title=c.title, extra=c.schema, see=c.see)
