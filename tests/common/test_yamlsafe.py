"""Bounded YAML and text reading: alias bombs, deep nesting, self-referring aliases, non-UTF-8 and
oversized files are refused with the error types each reader already reports in one line."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from gpupilot_common import yamlsafe


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """The classic "billion laughs" in YAML: ``width ** levels`` values from a few hundred bytes."""
    lines = ["a0: &a0 [" + ",".join(["lol"] * width) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_refused_fast_and_small() -> None:
    text = alias_bomb()
    assert len(text) < 420  # the bomb was 387 bytes and grew the loaders past 1.2 GB
    tracemalloc.start()
    t0 = time.perf_counter()
    with pytest.raises(yaml.YAMLError) as info:
        yamlsafe.safe_load(text)
    elapsed = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert isinstance(info.value, yamlsafe.YamlLimitError)
    assert "aliases expand to more than 200,000 values" in str(info.value.problem)
    assert info.value.problem_mark is not None and info.value.problem_mark.line >= 5
    assert elapsed < 2 and peak < 20 * 2**20
    with pytest.raises(yamlsafe.YamlLimitError):
        yamlsafe.safe_load_all("ok: 1\n---\n" + text)
    with pytest.raises(yamlsafe.YamlLimitError):
        yamlsafe.compose_all(text)


def test_ordinary_aliases_and_merge_keys_still_load() -> None:
    text = "base: &b {cpu: 1, mem: 2}\nx: {<<: *b, mem: 3}\ny: [*b, *b]\n"
    assert yamlsafe.safe_load(text) == yaml.safe_load(text)
    assert yamlsafe.safe_load(alias_bomb(levels=3, width=9))["a2"][0][0] == ["lol"] * 9


def test_deep_nesting_and_self_reference() -> None:
    with pytest.raises(yamlsafe.YamlLimitError, match="nested more than 64 levels deep"):
        yamlsafe.safe_load("[" * 5000 + "]" * 5000)
    with pytest.raises(yamlsafe.YamlLimitError, match="nested more than 64"):
        yamlsafe.safe_load("a:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 80)))
    with pytest.raises(yamlsafe.YamlLimitError, match="an alias refers to itself"):
        yamlsafe.safe_load("a: &a [1, *a]\n")
    assert yamlsafe.safe_load("[" * 60 + "]" * 60) is not None


def test_read_text_refuses_non_utf8_and_huge_files(tmp_path: Path) -> None:
    latin = tmp_path / "latin1.yaml"
    latin.write_bytes(b"name: ok\nowner: Jos\xe9\n")
    with pytest.raises(OSError) as info:
        yamlsafe.read_text(latin)
    assert info.value.strerror == "not UTF-8 text (byte 0xe9 on line 2); save the file as UTF-8"
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * 2000)
    with pytest.raises(OSError, match="larger than 0 MiB"):
        yamlsafe.read_text(big, max_bytes=1000)
    with pytest.raises(FileNotFoundError):
        yamlsafe.read_text(tmp_path / "missing.yaml")
    good = tmp_path / "good.yaml"
    good.write_text("name: Jos\u00e9\n", encoding="utf-8")
    assert yamlsafe.read_text(good) == "name: Jos\u00e9\n"
