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


def test_a_large_document_written_out_loads_and_its_aliases_stay_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The bounds scaled down 200 times (the same code, a test that takes milliseconds).
    monkeypatch.setattr(yamlsafe, "MAX_ALIAS_VALUES", 1_000)
    monkeypatch.setattr(yamlsafe, "DOCUMENT_FLOOR", 1_000)
    # 5,000 values without an alias: more than the alias allowance, and no expansion at all.
    items = "".join(f"- {{pod: task-{i:06d}, node: n{i // 8}}}\n" for i in range(1_000))
    data = yamlsafe.safe_load(items)
    assert len(data) == 1_000 and data[-1] == {"pod": "task-000999", "node": "n124"}
    # A small alias used a few times in a large document: written values do not count against
    # what aliases may add.
    small = "base: &b {cpu: 1, mem: 2}\nuses: [*b, *b, *b]\nitems:\n" + "".join(
        f"  - task-{i:06d}\n" for i in range(5_000)
    )
    assert yamlsafe.safe_load(small)["uses"][2] == {"cpu": 1, "mem": 2}
    # ... while a bomb is refused whatever else the file holds.
    with pytest.raises(yamlsafe.YamlLimitError, match="aliases expand to more than 1,000 values"):
        yamlsafe.safe_load(small + alias_bomb(levels=4, width=9))


def test_a_document_denser_than_its_size_allows_has_its_own_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(yamlsafe, "DOCUMENT_FLOOR", 1_000)
    values = 3_000  # one value per 2 characters: over 1,000 + a quarter of the 6,000 characters
    text = "[" + ",".join(["1"] * values) + "]"
    assert values > yamlsafe.document_limit(len(text)) == 1_000 + len(text) // 4
    with pytest.raises(yamlsafe.YamlLimitError) as info:
        yamlsafe.safe_load(text)
    problem = str(info.value.problem)
    assert problem.startswith(f"the document holds more than {yamlsafe.document_limit(len(text)):,} values")
    assert "aliases" not in problem
    # Each document of a stream is counted on its own.
    half = "[" + ",".join(["1"] * (values // 2)) + "]"
    assert len(yamlsafe.safe_load_all(half + "\n---\n" + half)) == 2


def test_syntax_errors_read_in_pyyaml_words_whichever_parser_read_them() -> None:
    with pytest.raises(yaml.YAMLError) as fast:
        yamlsafe.safe_load("a: [1, 2\nb: 3\n")
    pure = yaml.SafeLoader("a: [1, 2\nb: 3\n")
    with pytest.raises(yaml.YAMLError) as reference:
        pure.get_single_node()
    assert str(fast.value) == str(reference.value)
