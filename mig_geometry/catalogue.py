"""GPU models and their MIG profiles, keyed by PCI device id (names vary by driver).

Facts come from NVIDIA's MIG user guide, `nvidia-smi mig -lgipp` transcripts, the GPU Operator's
default mig-parted ConfigMap and mig-parted's example configs (see shared/reference/mig-geometry.md).
Every 7-compute-slice part has 8 memory slices (0-7); an instance occupies ``memory_slices``
consecutive memory slices starting at one of ``starts``.

Profile names follow mig-parted (go-nvlib): the memory figure is ``round(ceil(8 × profile memory /
total memory) / 8 × ceil(total GiB))``, so a part's names follow from its total memory in GiB
(:func:`name_gb`). Each model says where its facts come from (``source``); ``inferred=True`` marks
models whose placements (or whose very profile list) no published table or transcript confirms.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property, lru_cache

NVIDIA_VENDOR_ID = 0x10DE

VARIANTS = ("", "+me", "-me", "+me.all", "+gfx")
"""Engine variants of a GPU-instance profile: default, +media extensions, without media engines,
with all media engines, with graphics (RTX PRO Blackwell)."""

_NAME = re.compile(r"^(?:(?P<c>\d+)c\.)?(?P<g>\d+)g\.(?P<gb>\d+)gb(?P<variant>(?:[+-][a-z.]+)?)$")


@dataclass(frozen=True)
class ProfileName:
    """A mig-parted profile name split into its parts (``1c.3g.40gb`` → c=1, g=3, gb=40)."""

    gpu_slices: int
    memory_gb: int
    variant: str = ""
    compute: int | None = None
    """Compute-instance size for ``Nc.`` names; ``None`` for a whole GPU instance."""

    @property
    def gi_name(self) -> str:
        return f"{self.gpu_slices}g.{self.memory_gb}gb{self.variant}"


@cache
def parse_name(name: str) -> ProfileName | None:
    """Parse ``[Nc.]Mg.XXgb[variant]``; ``None`` if the text is not of that form."""
    m = _NAME.match(name)
    if not m or m.group("variant") not in VARIANTS:
        return None
    c = int(m.group("c")) if m.group("c") else None
    return ProfileName(int(m.group("g")), int(m.group("gb")), m.group("variant"), c)


@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile of a model (e.g. ``3g.40gb`` on H100 80GB)."""

    name: str
    """Profile name as the MIG Manager and device plugin spell it (``1g.10gb``, ``1g.10gb+me``)."""
    gi_profile_id: int
    """``nvidia-smi mig -lgip`` id (19=1g, 20=1g+me, 15=1g two memory slices, 14=2g, 9=3g, 5=4g,
    0=7g); -1 where NVIDIA has not published it (RTX PRO variants)."""
    compute_slices: int
    memory_slices: int
    starts: tuple[int, ...]
    """Allowed first memory slice of a placement."""
    max_count: int
    memory_mib: int
    sms: int
    aliases: tuple[str, ...] = ()
    """Other exact names NVIDIA's configs use for this same profile on this product (a driver that
    reports a different total memory names it differently: GB200's 3g.93gb / 3g.95gb)."""

    @property
    def variant(self) -> str:
        """``+me``, ``-me``, ``+me.all``, ``+gfx`` or ``""``."""
        parsed = parse_name(self.name)
        return parsed.variant if parsed else ""

    @property
    def media_extensions(self) -> bool:
        """True for every engine variant (``+me``, ``-me``, ``+me.all``, ``+gfx``): the profiles the
        optimiser leaves alone because they differ from the plain one only in media/graphics engines."""
        return bool(self.variant)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def compute_sizes(self) -> tuple[int, ...]:
        """Compute-instance sizes a GPU instance of this profile can hold (NVML's CI profiles)."""
        return tuple(c for c in (1, 2, 3, 4, 6, 7, 8) if c <= self.compute_slices and _ci_fits(c, self))


def _ci_fits(c: int, prof: Profile) -> bool:
    g = prof.compute_slices
    if c == g:
        return True
    return c in {1: (), 2: (1,), 3: (1, 2), 4: (1, 2), 7: (1, 2, 3, 4)}.get(g, ())


@dataclass(frozen=True)
class Product:
    """One PCI device id (optionally with a subsystem id) and the name NVIDIA's tables give it."""

    device_id: int
    name: str
    subsystem_id: int | None = None


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
    source: str = ""
    """Where the profile table, placements and MiB come from."""
    products: tuple[Product, ...] = ()
    """The products sharing this geometry, by PCI device id (and subsystem id where one is needed)."""

    def __hash__(self) -> int:
        # Models are keys of the packing caches (millions of lookups on a large fleet): the key names
        # a model, so hashing it alone is consistent with equality and skips the profile tables.
        return hash(self.key)

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

    def product(self, device_id: int) -> str:
        for p in self.products:
            if p.device_id == device_id:
                return p.name
        return self.key

    def profile(self, name: str) -> Profile | None:
        """The GPU-instance profile named exactly ``name`` (or one of its published aliases)."""
        return self._profile_index.get(name)

    def compute_profile(self, name: str) -> tuple[Profile, int] | None:
        """``(GPU-instance profile, compute size)`` for a name this model has, GI or ``Nc.`` CI form."""
        prof = self.profile(name)
        if prof is not None:
            return prof, prof.compute_slices
        parsed = parse_name(name)
        if parsed is None or parsed.compute is None:
            return None
        gi = self.profile(parsed.gi_name)
        if gi is None or parsed.compute >= gi.compute_slices or parsed.compute not in gi.compute_sizes():
            return None
        return gi, parsed.compute

    def all_names(self) -> tuple[str, ...]:
        """Every name mig-parted accepts on this model: GI profiles, aliases, and CI profiles."""
        out: list[str] = []
        for p in self.profiles:
            out.extend(p.names)
            if not p.variant:
                for c in p.compute_sizes():
                    if c < p.compute_slices:
                        out.extend(f"{c}c.{n}" for n in p.names)
        return tuple(out)

    @cached_property
    def _profile_index(self) -> Mapping[str, Profile]:
        return {n: p for p in self.profiles for n in p.names}

    @property
    def full_profile(self) -> Profile | None:
        """The profile that takes the whole GPU (7g / 4g on A30)."""
        return max(self.profiles, key=lambda p: p.compute_slices, default=None)


def name_gb(slices: int, of: int, total_gb: int) -> int:
    """mig-parted's memory figure for a profile holding ``slices`` of ``of`` memory slices.

    go-nvlib rounds the fraction up to eighths and multiplies by the total in whole GiB, rounding
    half away from zero (Go's ``math.Round``): H100 NVL (94 GiB) 1 slice → 11.75 → 12.
    """
    frac = math.ceil(8 * slices / of) / 8
    return math.floor(frac * total_gb + 0.5)


# Fractions of total memory that A100 80GB's profiles hold (9856 / 19968 / 40192 / 80384 MiB of
# 81920), used to infer MiB where NVIDIA publishes none; floored to 64 MiB so a packer never assumes
# more than the part has.
_A100_80_FRACTIONS = {1: 9856 / 81920, 2: 19968 / 81920, 4: 40192 / 81920, 8: 80384 / 81920}


def _inferred_mib(total_mib: int, slices: int, of: int) -> int:
    frac = _A100_80_FRACTIONS[slices * 8 // of]
    return int(total_mib * frac) // 64 * 64


def _seven_slice_profiles(
    *,
    total_gb: int,
    total_mib: int,
    sms: tuple[int, int, int, int, int, int],
    mib: Mapping[int, int] | None = None,
    alias_total_gb: int | None = None,
) -> tuple[Profile, ...]:
    """Profiles of a 7-compute/8-memory-slice part.

    total_gb: the total in GiB mig-parted names from (``ceil`` of NVML's total); sms: (1g, 1g
    two-slice, 2g, 3g, 4g, 7g); mib: published MiB per memory-slice count (else inferred);
    alias_total_gb: a second total some driver reports (its names become aliases).
    """

    def gb(slices: int, total: int) -> int:
        return name_gb(slices, 8, total)

    def mem(slices: int) -> int:
        return mib[slices] if mib else _inferred_mib(total_mib, slices, 8)

    def names(fmt: str, slices: int) -> tuple[str, tuple[str, ...]]:
        main = fmt.format(gb(slices, total_gb))
        if alias_total_gb is None:
            return main, ()
        alt = fmt.format(gb(slices, alias_total_gb))
        return main, (() if alt == main else (alt,))

    # (name format, -lgip id, compute slices, memory slices, starts, max per GPU, SMs)
    rows: tuple[tuple[str, int, int, int, tuple[int, ...], int, int], ...] = (
        ("1g.{}gb", 19, 1, 1, tuple(range(7)), 7, sms[0]),
        ("1g.{}gb+me", 20, 1, 1, tuple(range(7)), 1, sms[0]),
        ("1g.{}gb", 15, 1, 2, (0, 2, 4, 6), 4, sms[1]),
        ("2g.{}gb", 14, 2, 2, (0, 2, 4), 3, sms[2]),
        ("3g.{}gb", 9, 3, 4, (0, 4), 2, sms[3]),
        ("4g.{}gb", 5, 4, 4, (0,), 1, sms[4]),
        ("7g.{}gb", 0, 7, 8, (0,), 1, sms[5]),
    )
    out = []
    for fmt, gid, c, m, starts, mx, sm in rows:
        name, aliases = names(fmt, m)
        out.append(Profile(name, gid, c, m, starts, mx, mem(m), sm, aliases))
    return tuple(out)


def _rtx_pro_profiles(*, total_mib: int) -> tuple[Profile, ...]:
    """RTX PRO 6000 Blackwell: 4 slices like A30, 96 GiB, with +gfx, -me and +me.all variants."""

    def mem(slices: int) -> int:
        return _inferred_mib(total_mib, slices, 4)

    out = []
    for g, gid, starts, mx in ((1, 14, (0, 1, 2, 3), 4), (2, 5, (0, 2), 2), (4, 0, (0,), 1)):
        base = f"{g}g.{name_gb(g, 4, 96)}gb"
        sm = 47 * g
        out.append(Profile(base, gid, g, g, starts, mx, mem(g), sm))
        variants: tuple[tuple[str, int], ...] = (("+gfx", mx),)
        if g < 4:
            variants += (("-me", mx), ("+me.all", 1))
        out += [Profile(base + v, -1, g, g, starts, n, mem(g), sm) for v, n in variants]
    return tuple(out)


_A100_SMS = (14, 14, 28, 42, 56, 98)
_H100_SMS = (16, 26, 32, 60, 64, 132)
_B200_SMS = (18, 28, 36, 66, 72, 148)

_GUIDE = "NVIDIA MIG user guide profile table"
_CONFIG = "GPU Operator default mig-parted ConfigMap"
_INFERRED_MIB = "profile MiB inferred from A100 80GB's published fractions of total memory"

MODELS: tuple[GpuModel, ...] = (
    GpuModel(
        "A100 40GB",
        "NVIDIA A100-SXM4-40GB",
        (0x20B0, 0x20B1, 0x20F1, 0x20F6),
        40960,
        7,
        8,
        _seven_slice_profiles(
            total_gb=40, total_mib=40960, sms=_A100_SMS, mib={1: 4864, 2: 9856, 4: 19968, 8: 40192}
        ),
        108,
        aliases=("A100-40GB", "A100-SXM4-40GB", "A100-PCIE-40GB", "A800-40GB"),
        source=f"{_GUIDE}; placements and MiB from nvidia-smi mig -lgipp on A100-SXM4-40GB",
        products=(
            Product(0x20B0, "A100-SXM4-40GB"),
            Product(0x20B1, "A100-PCIE-40GB"),
            Product(0x20F1, "A100-PCIE-40GB"),
            Product(0x20F6, "A800-40GB"),
        ),
    ),
    GpuModel(
        "A100 80GB",
        "NVIDIA A100-SXM4-80GB",
        (0x20B2, 0x20B5, 0x20F3, 0x20F5),
        81920,
        7,
        8,
        _seven_slice_profiles(
            total_gb=80, total_mib=81920, sms=_A100_SMS, mib={1: 9856, 2: 19968, 4: 40192, 8: 80384}
        ),
        108,
        aliases=("A100-80GB", "A100-SXM4-80GB", "A100 80GB PCIe", "A800-80GB"),
        source=f"{_GUIDE} (80GB names); MiB published for A100 80GB; placements as A100-40GB",
        products=(
            Product(0x20B2, "A100-SXM4-80GB"),
            Product(0x20B5, "A100 80GB PCIe"),
            Product(0x20F3, "A800-SXM4-80GB"),
            Product(0x20F5, "A800 80GB PCIe"),
        ),
    ),
    GpuModel(
        "H100 80GB",
        "NVIDIA H100 80GB HBM3",
        (0x2330, 0x2331, 0x2322, 0x2324),
        81559,
        7,
        8,
        _seven_slice_profiles(total_gb=80, total_mib=81559, sms=_H100_SMS),
        132,
        aliases=("H100", "H100-80GB", "H100 80GB HBM3", "H100 PCIe", "H100-SXM5-80GB", "H800"),
        source=f"{_GUIDE}; placements from nvidia-smi mig -lgipp on H100 80GB HBM3; {_INFERRED_MIB}",
        products=(
            Product(0x2330, "H100 SXM5 80GB"),
            Product(0x2331, "H100 PCIe 80GB"),
            Product(0x2322, "H800 PCIe 80GB"),
            Product(0x2324, "H800 SXM5 80GB"),
        ),
    ),
    GpuModel(
        "H100 NVL",
        "NVIDIA H100 NVL",
        (0x2321, 0x233A),
        95830,
        7,
        8,
        _seven_slice_profiles(total_gb=94, total_mib=95830, sms=_H100_SMS),
        132,
        aliases=("H100-NVL", "H800 NVL"),
        source=f"{_GUIDE}; placements from nvidia-smi mig -lgipp on H100 NVL; {_INFERRED_MIB}",
        products=(Product(0x2321, "H100 NVL"), Product(0x233A, "H800 NVL")),
    ),
    GpuModel(
        "H100 96GB",
        "NVIDIA GH200 480GB",
        (0x2342, 0x233D, 0x20B6, 0x2329),
        97871,
        7,
        8,
        _seven_slice_profiles(total_gb=96, total_mib=97871, sms=_H100_SMS),
        132,
        inferred=True,
        aliases=("GH200", "GH200 96GB", "H100-96GB", "H20"),
        source=(
            f"{_CONFIG} (names, all-balanced filter); placements inferred from the Hopper family; {_INFERRED_MIB}"
        ),
        products=(
            Product(0x2342, "GH200 96GB"),
            Product(0x233D, "H100 96GB"),
            Product(0x20B6, "PG506-96GB"),
            Product(0x2329, "H20"),
        ),
    ),
    GpuModel(
        "H200",
        "NVIDIA H200",
        (0x2335, 0x233B),
        143771,
        7,
        8,
        _seven_slice_profiles(total_gb=141, total_mib=143771, sms=_H100_SMS),
        132,
        inferred=True,
        aliases=("H200 141GB", "H200-141GB", "H200 NVL"),
        source=f"{_CONFIG} (names); placements inferred from the Hopper family; {_INFERRED_MIB}",
        products=(Product(0x2335, "H200 141GB"), Product(0x233B, "H200 NVL")),
    ),
    GpuModel(
        "GH200 144GB",
        "NVIDIA GH200 144G HBM3e",
        (0x2348,),
        146068,
        7,
        8,
        _seven_slice_profiles(total_gb=144, total_mib=146068, sms=_H100_SMS),
        132,
        inferred=True,
        aliases=("GH200-144GB",),
        source=f"{_CONFIG} (names); placements inferred from the Hopper family; {_INFERRED_MIB}",
        products=(Product(0x2348, "GH200 144G HBM3e"),),
    ),
    GpuModel(
        "B200",
        "NVIDIA B200",
        (0x2901,),
        183359,
        7,
        8,
        _seven_slice_profiles(total_gb=180, total_mib=183359, sms=_B200_SMS),
        148,
        inferred=True,
        aliases=("B200-180GB",),
        source=f"{_CONFIG} (names); placements inferred from the Hopper family; {_INFERRED_MIB}",
        products=(Product(0x2901, "B200"),),
    ),
    GpuModel(
        "GB200",
        "NVIDIA GB200",
        (0x2941,),
        190464,
        7,
        8,
        _seven_slice_profiles(total_gb=186, total_mib=190464, sms=_B200_SMS, alias_total_gb=189),
        148,
        inferred=True,
        aliases=("GB200-186GB", "GB200 HGX"),
        source=(
            f"{_CONFIG} (186 GiB names) and mig-parted's Hopper/Blackwell example (189 GiB names, "
            f"kept as aliases); placements inferred from the Hopper family; {_INFERRED_MIB}"
        ),
        products=(Product(0x2941, "GB200"),),
    ),
    GpuModel(
        "B300",
        "NVIDIA B300",
        (0x3182,),
        275040,
        7,
        8,
        _seven_slice_profiles(total_gb=269, total_mib=275040, sms=_B200_SMS),
        148,
        inferred=True,
        aliases=("B300-288GB",),
        source=(
            "GPU Operator default config (device-filter 0x318210DE); names 1g.34gb..7g.269gb as AWS "
            f"publishes them for p6-b300 MIG; placements inferred from the Hopper family; {_INFERRED_MIB}"
        ),
        products=(Product(0x3182, "B300"),),
    ),
    GpuModel(
        "GB300",
        "NVIDIA GB300",
        (0x31C2,),
        284208,
        7,
        8,
        _seven_slice_profiles(total_gb=278, total_mib=284208, sms=_B200_SMS),
        148,
        inferred=True,
        aliases=("GB300-288GB",),
        source=(
            "GPU Operator default config (device-filter 0x31C210DE); names inferred with mig-parted's "
            f"rule from NVML's total of 284208 MiB; placements inferred from the Hopper family; {_INFERRED_MIB}"
        ),
        products=(Product(0x31C2, "GB300"),),
    ),
    GpuModel(
        "RTX PRO 6000",
        "NVIDIA RTX PRO 6000 Blackwell Server Edition",
        (0x2BB5,),
        97887,
        4,
        4,
        _rtx_pro_profiles(total_mib=97887),
        188,
        inferred=True,
        aliases=("RTX-PRO-6000-96GB", "RTX PRO 6000 Blackwell"),
        source=(
            f"{_CONFIG} (names, +gfx/-me/+me.all variants, all-balanced filter 0x2BB510DE); 4-slice "
            f"placements inferred from A30; {_INFERRED_MIB}"
        ),
        products=(Product(0x2BB5, "RTX PRO 6000 Blackwell Server Edition"),),
    ),
    GpuModel(
        "A30",
        "NVIDIA A30",
        (0x20B7,),
        24576,
        4,
        4,
        (
            Profile("1g.6gb", 14, 1, 1, (0, 1, 2, 3), 4, 5952, 14),
            Profile("1g.6gb+me", 21, 1, 1, (0, 1, 2, 3), 1, 5952, 14),
            Profile("2g.12gb", 5, 2, 2, (0, 2), 2, 12032, 28),
            Profile("2g.12gb+me", 6, 2, 2, (0, 2), 1, 12032, 28),
            Profile("4g.24gb", 0, 4, 4, (0,), 1, 24320, 56),
        ),
        56,
        aliases=("A30-24GB",),
        source=(
            f"{_GUIDE} (A30-24GB, +me variants from R470/R525); 1g.6gb 5.81 GiB published; 2g/4g MiB "
            "inferred from A100 40GB's ratios to its 1-slice profile"
        ),
        products=(Product(0x20B7, "A30-24GB"),),
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


def by_device_id(device_id: int, subsystem_id: int | None = None) -> GpuModel | None:
    """The model for a PCI device id (``0x2330``), or for the 32-bit form ``0x233010DE``.

    A product listed with a subsystem id (the 32-bit ``0xSSSSVVVV`` of a ``device-filter``'s second
    half) wins over one without when ``subsystem_id`` matches.
    """
    if device_id > 0xFFFF:
        device_id >>= 16
    fallback = None
    for m in MODELS:
        if device_id not in m.device_ids:
            continue
        subs = [p.subsystem_id for p in m.products if p.device_id == device_id and p.subsystem_id is not None]
        if not subs:
            fallback = fallback or m
        elif subsystem_id in subs:
            return m
    return fallback


@lru_cache(maxsize=4096)
def find_model(text: str) -> GpuModel | None:
    """A model from a scenario or label: ``H100 80GB``, ``NVIDIA H100 80GB HBM3``, ``0x2330``
    (memoised: a plan asks it of every GPU of the fleet, by the few names it uses)."""
    text = text.strip()
    if re.fullmatch(r"0[xX][0-9a-fA-F]{4}([0-9a-fA-F]{4})?", text):
        return by_device_id(int(text, 16))
    return _index().get(_norm(text))


def known_model_keys() -> list[str]:
    return [m.key for m in MODELS]


def mig_models() -> tuple[GpuModel, ...]:
    return tuple(m for m in MODELS if m.mig_capable)


@cache
def models_with_name(name: str) -> tuple[GpuModel, ...]:
    """The MIG models on which ``name`` (GI or CI form) is an exact profile name."""
    return tuple(m for m in mig_models() if m.compute_profile(name) is not None)


def near_misses(model: GpuModel, name: str) -> list[str]:
    """Names of ``model`` close to ``name``: same compute/GPU slices and variant, nearest memory."""
    parsed = parse_name(name)
    if parsed is None:
        return []
    cands = []
    for cand in model.all_names():
        cp = parse_name(cand)
        if cp is None or cand in [n for p in model.profiles for n in p.aliases]:
            continue
        if (cp.gpu_slices, cp.compute, cp.variant) == (parsed.gpu_slices, parsed.compute, parsed.variant):
            cands.append((abs(cp.memory_gb - parsed.memory_gb), cand))
    cands.sort()
    return [c for _, c in cands]
