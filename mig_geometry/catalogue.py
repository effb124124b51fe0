"""GPU models and their MIG profiles, keyed by PCI device id (names vary by driver).

Facts come from NVIDIA's MIG user guide and `nvidia-smi mig -lgipp` transcripts (see
shared/reference/mig-geometry.md). Every 7-compute-slice part has 8 memory slices (0-7); an instance
occupies ``memory_slices`` consecutive memory slices starting at one of ``starts``.
Rows marked ``inferred=True`` were not confirmed on hardware: the placement rules of their family
are assumed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache

NVIDIA_VENDOR_ID = 0x10DE


@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile of a model (e.g. ``3g.40gb`` on H100 80GB)."""

    name: str
    """Profile name as the MIG Manager and device plugin spell it (``1g.10gb``, ``1g.10gb+me``)."""
    gi_profile_id: int
    """NVML GPU-instance profile id (19=1g, 20=1g+me, 15=1g two memory slices, 14=2g, 9=3g, 5=4g, 0=7g)."""
    compute_slices: int
    memory_slices: int
    starts: tuple[int, ...]
    """Allowed first memory slice of a placement."""
    max_count: int
    memory_mib: int
    sms: int

    @property
    def media_extensions(self) -> bool:
        return self.name.endswith("+me")


@dataclass(frozen=True)
class GpuModel:
    """A GPU model: identity, memory and (for MIG-capable parts) its profiles."""

    key: str
    """Short friendly name used in scenarios and reports (``H100 80GB``)."""
    product_name: str
    """What NVML's ``nvmlDeviceGetName`` prints for the main SKU."""
    device_ids: tuple[int, ...]
    memory_mib: int
    compute_slices: int = 0
    memory_slices: int = 0
    profiles: tuple[Profile, ...] = ()
    sms: int = 0
    inferred: bool = False
    aliases: tuple[str, ...] = field(default=())

    @property
    def mig_capable(self) -> bool:
        return bool(self.profiles)

    @property
    def device_id(self) -> int:
        return self.device_ids[0]

    def device_filter(self, device_id: int | None = None) -> str:
        """mig-parted ``device-filter`` form: ``0xDDDD10DE``."""
        did = self.device_id if device_id is None else device_id
        return f"0x{did:04X}{NVIDIA_VENDOR_ID:04X}"

    def profile(self, name: str) -> Profile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None

    def profile_by_id(self, gi_profile_id: int) -> Profile | None:
        for p in self.profiles:
            if p.gi_profile_id == gi_profile_id:
                return p
        return None

    @property
    def full_profile(self) -> Profile | None:
        """The profile that takes the whole GPU (7g / 4g on A30)."""
        return max(self.profiles, key=lambda p: p.compute_slices, default=None)


def _seven_slice_profiles(
    mem_gb: tuple[int, int, int, int, int], *, total_mib: int, sms: tuple[int, int, int, int, int, int]
) -> tuple[Profile, ...]:
    """Profiles of a 7-compute/8-memory-slice part.

    mem_gb: the names' memory for (1g, 1g two-slice / 2g, 3g / 4g, 7g) as (1g, 2slice, 4slice, -, 7g);
    sms: (1g, 1g two-slice, 2g, 3g, 4g, 7g).
    """
    g1, g2, g4, _unused, g7 = mem_gb
    slice_mib = total_mib // 8
    return (
        Profile(f"1g.{g1}gb", 19, 1, 1, tuple(range(7)), 7, slice_mib, sms[0]),
        Profile(f"1g.{g1}gb+me", 20, 1, 1, tuple(range(7)), 1, slice_mib, sms[0]),
        Profile(f"1g.{g2}gb", 15, 1, 2, (0, 2, 4, 6), 4, 2 * slice_mib, sms[1]),
        Profile(f"2g.{g2}gb", 14, 2, 2, (0, 2, 4), 3, 2 * slice_mib, sms[2]),
        Profile(f"3g.{g4}gb", 9, 3, 4, (0, 4), 2, 4 * slice_mib, sms[3]),
        Profile(f"4g.{g4}gb", 5, 4, 4, (0,), 1, 4 * slice_mib, sms[4]),
        Profile(f"7g.{g7}gb", 0, 7, 8, (0,), 1, total_mib, sms[5]),
    )


_A100_SMS = (14, 14, 28, 42, 56, 98)
_H100_SMS = (16, 26, 32, 60, 64, 132)
_B200_SMS = (18, 28, 36, 66, 72, 148)

MODELS: tuple[GpuModel, ...] = (
    GpuModel(
        "A100 40GB",
        "NVIDIA A100-SXM4-40GB",
        (0x20B0, 0x20B1, 0x20F1, 0x20F6),
        40960,
        7,
        8,
        _seven_slice_profiles((5, 10, 20, 20, 40), total_mib=40960, sms=_A100_SMS),
        108,
        aliases=("A100-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB", "A800-40GB"),
    ),
    GpuModel(
        "A100 80GB",
        "NVIDIA A100-SXM4-80GB",
        (0x20B2, 0x20B5, 0x20F3, 0x20F5),
        81920,
        7,
        8,
        _seven_slice_profiles((10, 20, 40, 40, 80), total_mib=81920, sms=_A100_SMS),
        108,
        aliases=("A100-80GB", "A100-SXM4-80GB", "A100 80GB PCIe", "A800-80GB"),
    ),
    GpuModel(
        "H100 80GB",
        "NVIDIA H100 80GB HBM3",
        (0x2330, 0x2331, 0x2322, 0x2324),
        81559,
        7,
        8,
        _seven_slice_profiles((10, 20, 40, 40, 80), total_mib=81559, sms=_H100_SMS),
        132,
        aliases=("H100", "H100-80GB", "H100 80GB HBM3", "H100 PCIe", "H100-SXM5-80GB", "H800"),
    ),
    GpuModel(
        "H100 NVL",
        "NVIDIA H100 NVL",
        (0x2321, 0x233A),
        95830,
        7,
        8,
        _seven_slice_profiles((12, 24, 47, 47, 94), total_mib=95830, sms=_H100_SMS),
        132,
        aliases=("H100-NVL", "H800 NVL"),
    ),
    GpuModel(
        "H100 96GB",
        "NVIDIA GH200 480GB",
        (0x2342, 0x233D, 0x20B6, 0x2329),
        97871,
        7,
        8,
        _seven_slice_profiles((12, 24, 48, 48, 96), total_mib=97871, sms=_H100_SMS),
        132,
        aliases=("GH200", "GH200 96GB", "H100-96GB", "H20"),
    ),
    GpuModel(
        "H200",
        "NVIDIA H200",
        (0x2335, 0x233B),
        143771,
        7,
        8,
        _seven_slice_profiles((18, 35, 71, 71, 141), total_mib=143771, sms=_H100_SMS),
        132,
        inferred=True,
        aliases=("H200 141GB", "H200-141GB", "H200 NVL"),
    ),
    GpuModel(
        "GH200 144GB",
        "NVIDIA GH200 144G HBM3e",
        (0x2348,),
        146068,
        7,
        8,
        _seven_slice_profiles((18, 36, 72, 72, 144), total_mib=146068, sms=_H100_SMS),
        132,
        inferred=True,
        aliases=("GH200-144GB",),
    ),
    GpuModel(
        "B200",
        "NVIDIA B200",
        (0x2901,),
        183359,
        7,
        8,
        _seven_slice_profiles((23, 45, 90, 90, 180), total_mib=183359, sms=_B200_SMS),
        148,
        inferred=True,
        aliases=("B200-180GB",),
    ),
    GpuModel(
        "A30",
        "NVIDIA A30",
        (0x20B7,),
        24576,
        4,
        4,
        (
            Profile("1g.6gb", 14, 1, 1, (0, 1, 2, 3), 4, 6144, 14),
            Profile("2g.12gb", 5, 2, 2, (0, 2), 2, 12288, 28),
            Profile("4g.24gb", 0, 4, 4, (0,), 1, 24576, 56),
        ),
        56,
        aliases=("A30-24GB",),
    ),
    # Parts without MIG: time-slicing is the only way to share them.
    GpuModel("A10", "NVIDIA A10", (0x2236,), 23028, sms=72, aliases=("A10-24GB",)),
    GpuModel("A10G", "NVIDIA A10G", (0x2237,), 23028, sms=80),
    GpuModel("L4", "NVIDIA L4", (0x27B8,), 23034, sms=58),
    GpuModel("L40S", "NVIDIA L40S", (0x26B9,), 46068, sms=142),
    GpuModel("T4", "Tesla T4", (0x1EB8,), 15360, sms=40),
)


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower().removeprefix("nvidia"))


@cache
def _index() -> dict[str, GpuModel]:
    out: dict[str, GpuModel] = {}
    for m in MODELS:
        for name in (m.key, m.product_name, *m.aliases):
            out.setdefault(_norm(name), m)
    return out


def by_device_id(device_id: int) -> GpuModel | None:
    """The model for a PCI device id (``0x2330``), or for the 32-bit form ``0x233010DE``."""
    if device_id > 0xFFFF:
        device_id >>= 16
    for m in MODELS:
        if device_id in m.device_ids:
            return m
    return None


def find_model(text: str) -> GpuModel | None:
    """A model from a scenario or label: ``H100 80GB``, ``NVIDIA H100 80GB HBM3``, ``0x2330``."""
    text = text.strip()
    if re.fullmatch(r"0[xX][0-9a-fA-F]{4}([0-9a-fA-F]{4})?", text):
        return by_device_id(int(text, 16))
    return _index().get(_norm(text))


def known_model_keys() -> list[str]:
    return [m.key for m in MODELS]
