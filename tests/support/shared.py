"""Expensive test inputs built once per test run, shared by every pytest-xdist worker.

A week of simulated fleet history takes tens of seconds to backfill; each worker that needs it used
to build its own. :func:`built_once` builds an input into a directory of the run's shared temporary
root under a file lock (the first worker to ask builds, the others wait and reuse), and
:func:`linked_copy` hands each user a private copy made of hard links, so a Prometheus started on
it can write its WAL, compact and delete blocks without touching anyone else's files.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest


def run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory every process of this run shares: under xdist each worker's base temp is
    ``<root>/popen-gwN``; without it the base temp is the run's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def built_once(
    tmp_path_factory: pytest.TempPathFactory, key: str, build: Callable[[Path], dict[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """``build(directory)`` once per run for ``key``; returns the directory and what ``build``
    returned (JSON-serialisable facts such as the history's start and end). A build that raised
    leaves nothing behind, so the next asker builds again and sees the same error."""
    shared = run_root(tmp_path_factory) / "shared-inputs"
    shared.mkdir(parents=True, exist_ok=True)
    where = shared / key
    done = shared / f"{key}.json"
    with _locked(shared / f"{key}.lock"):
        if not done.exists():
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir()
            try:
                facts = build(where)
            except BaseException:
                shutil.rmtree(where, ignore_errors=True)
                raise
            partial = done.with_suffix(".partial")
            partial.write_text(json.dumps(facts))
            partial.rename(done)
    facts_read: dict[str, Any] = json.loads(done.read_text())
    return where, facts_read


def linked_copy(source: Path, target: Path) -> Path:
    """A copy of ``source`` made of hard links (instant, no extra disk); files are never modified in
    place by Prometheus, only created and removed, so copies stay independent."""
    shutil.copytree(source, target, copy_function=os.link)
    return target
