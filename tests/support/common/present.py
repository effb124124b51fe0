"""``present(x)``: a value typed optional (the kubernetes client's models type every field so) that
a test needs, asserted there and narrowed for the type checker."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def present(value: T | None, what: str = "a value") -> T:
    assert value is not None, f"{what} is missing"
    return value
