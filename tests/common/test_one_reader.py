"""Every YAML or JSON file the services read goes through the one bounded reader
(gpupilot_common.yamlsafe: a regular file only, at most 16 MiB, UTF-8; aliases, nesting and tags
within the shared limits): a scan of their source lists every ``yaml.`` loading call, every
``json.load`` of a file object, every ``.read_text()`` / ``.read_bytes()`` and every builtin
``open()``, and fails on one outside the reader that is not on the short list below, each entry with
the reason it is not a user's file."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("adapter", "exporter", "rightsizer", "gpupilot_common", "simulator", "mig_geometry")
READER = "gpupilot_common/yamlsafe.py"
YAML_LOADS = {"load", "safe_load", "load_all", "safe_load_all", "full_load", "full_load_all", "unsafe_load",
              "unsafe_load_all", "compose", "compose_all", "parse", "scan"}  # fmt: skip

NOT_USER_FILES = {
    ("adapter/config/mapping.py", "read_text"): "the built-in default-config.yaml from the package",
    ("exporter/contract/counters.py", "read_text"): "the built-in counters file from the package",
    ("adapter/clients/membudget.py", "read_text"): "the container's cgroup memory limit (/sys/fs/cgroup)",
    ("exporter/attribute/procs.py", "open"): "a process's cgroup in /proc",
    ("exporter/attribute/visibility.py", "read_text"): "the exporter's own /proc/self/status",
    (
        "rightsizer/commands/validate.py",
        "read_text",
    ): "manifest.read_text: yamlsafe.read_text with validate's words",
}


def calls() -> list[tuple[str, int, str]]:
    """(file, line, what) of every read the scan looks at, outside the reader."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel == READER:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
                if not isinstance(node, ast.Call):
                    continue
                fn = node.func
                if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name):
                    if fn.value.id == "yaml" and fn.attr in YAML_LOADS:
                        found.append((rel, node.lineno, f"yaml.{fn.attr}"))
                    if fn.value.id == "json" and fn.attr == "load":
                        found.append((rel, node.lineno, "json.load"))
                reader = (
                    isinstance(fn, ast.Attribute)
                    and isinstance(fn.value, ast.Name)
                    and fn.value.id == "yamlsafe"
                )
                if isinstance(fn, ast.Attribute) and fn.attr in ("read_text", "read_bytes") and not reader:
                    found.append((rel, node.lineno, fn.attr))
                if isinstance(fn, ast.Name) and fn.id == "open":
                    found.append((rel, node.lineno, "open"))
    return found


def test_every_file_read_goes_through_the_bounded_reader() -> None:
    outside = [(rel, line, what) for rel, line, what in calls() if (rel, what) not in NOT_USER_FILES]
    assert not outside, (
        "read outside gpupilot_common.yamlsafe (use yamlsafe.read_text/read_bytes/safe_load…): "
        + ", ".join(f"{rel}:{line} {what}" for rel, line, what in outside)
    )


def test_the_scan_sees_what_it_looks_for() -> None:
    """The scan is not blind: the known exceptions are found where they are, and a call of each kind
    in a sample is caught."""
    seen = {(rel, what) for rel, _, what in calls()}
    assert set(NOT_USER_FILES) <= seen
    sample = ast.parse("yaml.safe_load(t)\njson.load(f)\np.read_text()\nopen(p)\nyaml.safe_dump(d)\n")
    kinds = []
    for node in ast.walk(sample):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            kinds.append(node.func.attr)
    assert {"safe_load", "load", "read_text"} <= set(kinds)
