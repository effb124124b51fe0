"""Plans name a config the cluster already has when the proposed layout equals it (point 8)."""

from __future__ import annotations

from rightsizer.analysis.types import GpuInventory, NodeInventory
from rightsizer.cli import main
from rightsizer.migparted import manifest, resolve
from rightsizer.optimise.proposal import GpuPlan
from rightsizer.plan import build
from tests.support.rightsizer import nvidia_configs


def cluster() -> list:  # type: ignore[type-arg]
    return manifest.load_manifest(nvidia_configs.default_like_configmap(), source="cm.yaml").mig


def node(device_id: int, model: str, gpus: int = 2) -> NodeInventory:
    return NodeInventory(
        "n1", tuple(GpuInventory("n1", i, f"GPU-{i}", model, device_id, True) for i in range(gpus))
    )


def test_balanced_layout_is_named_all_balanced_with_nvidias_entries() -> None:
    h100 = node(0x2330, "H100 80GB")
    balanced = {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    name, doc = build._config(h100, [GpuPlan(0, True, balanced), GpuPlan(1, True, dict(balanced))], cluster())
    assert name == "all-balanced"
    # The config travels as the cluster wrote it (every product's entry), so merging changes nothing.
    assert len(doc["mig-configs"]["all-balanced"]) == len(nvidia_configs.BALANCED)


def test_seven_small_slices_on_a100_40gb_is_all_1g_5gb_and_four_two_slice_is_all_1g_10gb() -> None:
    a100 = node(0x20B0, "A100 40GB", gpus=1)
    assert build._config(a100, [GpuPlan(0, True, {"1g.5gb": 7})], cluster())[0] == "all-1g.5gb"
    assert build._config(a100, [GpuPlan(0, True, {"1g.10gb": 4})], cluster())[0] == "all-1g.10gb"


def test_mixed_gpus_or_a_layout_no_config_has_get_a_gpupilot_config() -> None:
    h100 = node(0x2330, "H100 80GB")
    mixed = [GpuPlan(0, True, {"1g.10gb": 7}), GpuPlan(1, False, {})]
    name, doc = build._config(h100, mixed, cluster())
    assert name.startswith("gpupilot-") and list(doc["mig-configs"]) == [name]
    odd = [GpuPlan(0, True, {"3g.40gb": 1, "1g.10gb": 4}), GpuPlan(1, True, {"3g.40gb": 1, "1g.10gb": 4})]
    assert build._config(h100, odd, cluster())[0].startswith("gpupilot-")
    # Without the cluster's configs nothing is named after them.
    assert build._config(h100, [GpuPlan(0, True, {"1g.10gb": 7})] * 2)[0].startswith("gpupilot-")


def test_disabled_and_gb200_aliases_resolve() -> None:
    assert resolve.matching_config(cluster(), device_id=0x2330, layouts=[(0, False, {}), (1, False, {})]) == (
        "all-disabled",
        [{"devices": "all", "mig-enabled": False}],
    )
    example = manifest.load_manifest(nvidia_configs.manager_example_manifest(), source="ex.yaml").mig
    # The example's GB200 entry says 1g.24gb/3g.95gb; the catalogue's names are 1g.23gb/3g.93gb.
    got = resolve.matching_config(
        example, device_id=0x2941, layouts=[(0, True, {"1g.23gb": 2, "2g.47gb": 1, "3g.93gb": 1})]
    )
    assert got is not None and got[0] == "all-balanced"


def test_plan_refuses_an_unreadable_mig_config_in_one_line(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(
        ["plan", "--prometheus-url", "http://127.0.0.1:9", "--mig-config", str(tmp_path / "none.yaml")]
    )
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "none.yaml: cannot read" in line
