"""The simulator and the rightsizer's packer read the same catalogue (names, MiB, new products)."""

from __future__ import annotations

import pytest

from mig_geometry.catalogue import find_model
from mig_geometry.placement import fits
from rightsizer.optimise.packing import class_for
from simulator.migconfigs import resolve_builtin


def model(key: str):  # type: ignore[no-untyped-def]
    m = find_model(key)
    assert m is not None
    return m


def test_packer_does_not_fit_5000_mib_into_a100s_4864_mib_1g() -> None:
    a40 = model("A100 40GB")
    assert class_for(a40, compute=1, memory_mib=4864).name == "1g.5gb"
    assert class_for(a40, compute=1, memory_mib=5000).name == "1g.10gb"


@pytest.mark.parametrize(
    ("key", "balanced"),
    [
        ("GB200", {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1}),
        ("B300", {"1g.34gb": 2, "2g.67gb": 1, "3g.135gb": 1}),
        ("RTX PRO 6000", {"1g.24gb": 2, "2g.48gb": 1}),
        ("A30", {"1g.6gb": 2, "2g.12gb": 1}),
        ("H100 NVL", {"1g.12gb": 2, "2g.24gb": 1, "3g.47gb": 1}),
    ],
)
def test_simulator_builtin_configs_for_every_product(key: str, balanced: dict[str, int]) -> None:
    m = model(key)
    assert resolve_builtin(m, "all-balanced") == balanced
    assert fits(m, balanced)


def test_simulator_reads_published_aliases_and_refuses_other_gpus_names() -> None:
    assert resolve_builtin(model("GB200"), "all-1g.24gb") == {"1g.23gb": 7}
    with pytest.raises(KeyError):
        resolve_builtin(model("H100 96GB"), "all-7g.94gb")
