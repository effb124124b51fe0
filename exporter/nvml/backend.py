"""The NVML backend: GPUs, MIG instances, GPM activity and Xid events through nvidia-ml-py.

The only module that imports ``pynvml`` (an import-linter contract says so). Its helpers
(:mod:`exporter.nvml.fields`, :mod:`exporter.nvml.gpm`, :mod:`exporter.nvml.mig`,
:mod:`exporter.nvml.xid`) get the library as an object, so the tests drive the same code with a
fake NVML library.

One :meth:`NvmlBackend.read` is one collection:

* static identity (UUID, PCI, name, memory total, GPM support) is read once in :meth:`open`;
* MIG mode and the MIG devices are read every collection, so a reconfiguration shows on the next
  one; a stale MIG handle drops that instance for the collection and forces fresh identity reads;
* a GPU answering ``NVML_ERROR_GPU_IS_LOST`` moves to ``snapshot.lost``; the others keep flowing;
* Xid events are drained from an NVML event set with a zero timeout.

Privileges (see deploy/exporter/daemonset.yaml for the evidence): in MIG mode the parent GPU's
memory information and the GPU instance placement need CAP_SYS_ADMIN; without it those calls
answer ``NO_PERMISSION``, which is counted (``no_permission:<call>``) and never loses the GPU.
Without the host's PID namespace NVML lists only this container's processes, so process counts
are not published at all (absent = unknown) and ``NodeSnapshot.processes_visible`` says why.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import pynvml

from exporter.attribute.visibility import ProcessVisibility, process_visibility
from exporter.errors import BackendError, BackendUnavailable
from exporter.nvml import fields as nvml_fields
from exporter.nvml.fields import MIB, GpuLost, NvmlCalls, StaleHandle, mismatch_error, text
from exporter.nvml.gpm import GpmSampler
from exporter.nvml.mig import MigDevice, MigTopology
from exporter.nvml.procs import ProcessSampler
from exporter.nvml.xid import XidWatcher
from exporter.snapshot import GpuInfo, GpuSnapshot, LostGpu, MigInstance, NodeSnapshot, ProcessUsage


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _gi_owners(devices: list[MigDevice]) -> list[MigDevice]:
    """Per GPU instance, the MIG device of its lowest compute instance id."""
    best: dict[int, MigDevice] = {}
    for dev in devices:
        gi = dev.identity.gpu_instance_id
        if gi not in best or dev.identity.compute_instance_id < best[gi].identity.compute_instance_id:
            best[gi] = dev
    return list(best.values())


def _as_tuple(exc: type[BaseException] | tuple[()]) -> tuple[type[BaseException], ...]:
    return exc if isinstance(exc, tuple) else (exc,)


@dataclass
class _Gpu:
    index: int
    handle: Any
    info: GpuInfo
    mig: MigTopology


class NvmlBackend:
    """:class:`exporter.collect.backend.Backend` over NVML.

    ``library`` defaults to the real ``pynvml`` module (tests pass a fake). ``gpm_min_interval_s``
    is the shortest gap between two GPM samples of one entity (NVML needs more than 100 ms);
    ``gpm_first_gap_s`` is how long the first read after :meth:`open` waits for its second GPM
    sample (``--once``: activity over one second, not over the bare minimum). ``visibility``
    says whether NVML can list other containers' processes (default: the PID-namespace check of
    :mod:`exporter.attribute.visibility`). ``clock``, ``wall_clock`` and ``sleep`` are injectable for tests.
    """

    name = "nvml"

    def __init__(
        self,
        *,
        library: Any = None,
        gpm_min_interval_s: float = 0.2,
        gpm_first_gap_s: float = 1.0,
        visibility: Callable[[], ProcessVisibility] = process_visibility,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.lib: Any = pynvml if library is None else library
        self._gpm_min_interval_s = gpm_min_interval_s
        self._gpm_first_gap_s = max(gpm_first_gap_s, gpm_min_interval_s)
        self._visibility_check = visibility
        self.visibility = ProcessVisibility(visible=False, reason="not checked yet")
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._reset_state()

    def _reset_state(self) -> None:
        self._calls = NvmlCalls(self.lib, clock=self._clock)
        self._gpm = GpmSampler(self._calls, min_interval_s=self._gpm_min_interval_s, clock=self._clock)
        self._xid = XidWatcher(self._calls, wall_clock=self._wall_clock)
        self._procs = ProcessSampler(self._calls)
        self._gpus: list[_Gpu] = []
        self._lost_at_open: list[LostGpu] = []
        self._driver = ""
        self._open = False
        self._first_read = False

    # -- lifecycle ---------------------------------------------------------------------------

    def open(self) -> None:
        lib = self.lib
        if self._open:
            self.close()  # re-initialisation: release samples, events and the NVML reference first
        try:
            lib.nvmlInit()
        except Exception as exc:  # NVMLError, or OSError from loading libnvidia-ml.so
            raise BackendUnavailable(
                f"NVML init failed: {_one_line(exc)}; is the NVIDIA driver installed and are "
                "/dev/nvidia* and libnvidia-ml.so visible to this process?"
            ) from exc
        self._reset_state()
        self._open = True
        self.visibility = self._visibility_check()
        try:
            self._driver = text(lib.nvmlSystemGetDriverVersion())
            count = int(lib.nvmlDeviceGetCount())
        except lib.NVMLError as exc:
            self.close()
            raise BackendUnavailable(f"NVML could not list GPUs: {_one_line(exc)}") from exc
        for index in range(count):
            try:
                self._gpus.append(self._enumerate(index))
            except (lib.NVMLError, GpuLost, *_as_tuple(mismatch_error(lib))) as exc:
                self._lost_at_open.append(LostGpu(index, "", "", f"enumeration failed: {_one_line(exc)}"))
        self._xid.register((g.info.uuid, g.handle) for g in self._gpus)
        self._prime_gpm()
        self._first_read = True

    def close(self) -> None:
        self._gpm.close()
        self._xid.close()
        if self._open:
            with contextlib.suppress(self.lib.NVMLError):
                self.lib.nvmlShutdown()
        self._open = False
        self._gpus = []

    def _enumerate(self, index: int) -> _Gpu:
        lib = self.lib
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        pci = lib.nvmlDeviceGetPciInfo(handle)
        # In MIG mode the parent's memory info needs CAP_SYS_ADMIN (NO_PERMISSION otherwise): the
        # total is then unknown (0), counted, and the GPU is still read.
        memory = self._calls.call(
            f"index:{index}", "memory_total", ("enumerate:memory_total",), lib.nvmlDeviceGetMemoryInfo, handle
        )
        try:
            minor = int(lib.nvmlDeviceGetMinorNumber(handle))
        except lib.NVMLError:
            minor = index
        info = GpuInfo(
            index=index,
            uuid=text(lib.nvmlDeviceGetUUID(handle)),
            pci_bus_id=text(pci.busId),
            minor_number=minor,
            model_name=text(lib.nvmlDeviceGetName(handle)),
            pci_device_id=(int(pci.pciDeviceId) >> 16) & 0xFFFF,
            driver_version=self._driver,
            mig_enabled=self._mig_mode(handle),
            gpm_supported=self._gpm.supported(handle),
            memory_total_mib=0 if memory is None else int(memory.total) // MIB,
        )
        return _Gpu(index=index, handle=handle, info=info, mig=MigTopology(self._calls, handle))

    def _mig_mode(self, handle: Any, *, known: bool = False) -> bool:
        """Current MIG mode; ``known`` (the last mode seen) when NVML can't tell us this time."""
        lib = self.lib
        try:
            current, _pending = lib.nvmlDeviceGetMigMode(handle)
        except lib.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == lib.NVML_ERROR_GPU_IS_LOST:
                raise GpuLost(f"nvmlDeviceGetMigMode: {exc}") from exc
            if code in (lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_FUNCTION_NOT_FOUND):
                return False  # a GPU without MIG
            if code in (lib.NVML_ERROR_UNINITIALIZED, lib.NVML_ERROR_DRIVER_NOT_LOADED):
                raise
            self._calls.errors["mig:mode"] += 1
            return known
        return bool(current == lib.NVML_DEVICE_MIG_ENABLE)

    # -- GPM ---------------------------------------------------------------------------------

    def _prime_gpm(self) -> None:
        """First GPM samples at open, so the first read (``--once``) already has activity."""
        for gpu in self._gpus:
            if not gpu.info.gpm_supported:
                continue
            try:
                self._gpm_whole(gpu)
                if gpu.info.mig_enabled:
                    for dev in _gi_owners(gpu.mig.devices()):
                        self._gpm_instance(gpu, dev)
            except (GpuLost, StaleHandle, self.lib.NVMLError):
                continue  # read() reports it

    def _gpm_whole(self, gpu: _Gpu) -> dict[str, float] | None:
        lib = self.lib
        return self._gpm.collect(
            gpu.info.uuid, lambda s: lib.nvmlGpmSampleGet(gpu.handle, s), with_rates=True
        )

    def _gpm_instance(self, gpu: _Gpu, dev: MigDevice) -> dict[str, float] | None:
        lib, gi_id = self.lib, dev.identity.gpu_instance_id
        return self._gpm.collect(
            dev.uuid, lambda s: lib.nvmlGpmMigSampleGet(gpu.handle, gi_id, s), with_rates=False
        )

    # -- collection --------------------------------------------------------------------------

    def read(self) -> NodeSnapshot:
        lib = self.lib
        if not self._open:
            raise BackendError("NVML backend is not open")
        if self._first_read:
            # Right after open(): the second GPM sample is taken gpm_first_gap_s (1 s) after the first,
            # so --once has activity measured over a second, not over the bare 100 ms minimum.
            self._first_read = False
            age = self._gpm.oldest_age()
            if age is not None and age < self._gpm_first_gap_s:
                self._sleep(self._gpm_first_gap_s - age)
        self._xid.drain()
        gpus: list[GpuSnapshot] = []
        lost = list(self._lost_at_open)
        live: set[str] = set()
        mismatch = _as_tuple(mismatch_error(lib))
        for gpu in self._gpus:
            try:
                snap = self._read_gpu(gpu)
            except GpuLost as exc:
                lost.append(LostGpu(gpu.index, gpu.info.uuid, gpu.info.pci_bus_id, f"GPU is lost ({exc})"))
                continue
            except mismatch as exc:
                # nvidia-ml-py newer than the driver, outside NvmlCalls: this GPU, not the collection.
                self._calls.errors[f"library_mismatch:gpu:{gpu.index}"] += 1
                del exc
                continue
            except lib.NVMLError as exc:
                code = getattr(exc, "value", None)
                if code == lib.NVML_ERROR_GPU_IS_LOST:
                    lost.append(
                        LostGpu(gpu.index, gpu.info.uuid, gpu.info.pci_bus_id, f"GPU is lost ({exc})")
                    )
                    continue
                if code in (lib.NVML_ERROR_UNINITIALIZED, lib.NVML_ERROR_DRIVER_NOT_LOADED):
                    raise BackendError(f"NVML stopped answering: {_one_line(exc)}") from exc
                self._calls.errors[f"gpu:{gpu.index}"] += 1
                continue
            gpus.append(snap)
            live.add(gpu.info.uuid)
            live.update(i.uuid for i in snap.instances)
        self._gpm.keep_only(live)
        # Errors since the last snapshot (those of open() land in the first one).
        errors = dict(self._calls.errors)
        self._calls.errors.clear()
        if not gpus and self._gpus and not lost:
            raise BackendError("NVML: no GPU could be read this collection")
        return NodeSnapshot(
            taken_at=self._wall_clock(),
            gpus=tuple(gpus),
            lost=tuple(lost),
            field_errors=MappingProxyType(errors),
            driver_version=self._driver,
            processes_visible=self.visibility.visible,
            processes_visibility_reason=self.visibility.reason,
        )

    def _read_gpu(self, gpu: _Gpu) -> GpuSnapshot:
        calls, key, handle = self._calls, gpu.info.uuid, gpu.handle
        mig_enabled = self._mig_mode(handle, known=gpu.info.mig_enabled)
        if mig_enabled != gpu.info.mig_enabled:
            gpu.info = replace(gpu.info, mig_enabled=mig_enabled)
            gpu.mig.reset()
            calls.forget(key)
            self._gpm.forget(key)  # whole-GPU samples were refused in MIG mode; ask again
            self._procs.forget(key)
        values: dict[str, float] = {}
        nvml_fields.read_gpu_level(calls, key, handle, values)
        gpm_values = self._gpm_whole(gpu) if gpu.info.gpm_supported else None
        if gpm_values:
            # On a MIG GPU only the GPU-level GPM rates (PCIe) apply; activity is per instance.
            values.update({k: v for k, v in gpm_values.items() if not mig_enabled or "_PCIE_" in k})
        if "DCGM_FI_PROF_PCIE_TX_BYTES" not in values:
            nvml_fields.read_pcie_throughput(calls, key, handle, values)
        processes: int | None = None
        per_process: tuple[ProcessUsage, ...] | None = None
        util_visible = True
        instances: tuple[MigInstance, ...] = ()
        if mig_enabled:
            instances = self._read_instances(gpu)
        else:
            nvml_fields.read_whole_gpu(calls, key, handle, values)
            running = nvml_fields.read_device(calls, key, handle, values, processes=self.visibility.visible)
            if running is not None:
                processes = len(running)
                # Per-process accounting (per-pod figures on shared GPUs): only with the host's PID view.
                per_process, util_visible = self._procs.read(key, handle, running)
        return GpuSnapshot(
            info=gpu.info,
            values=MappingProxyType(values),
            instances=instances,
            xid_counts=MappingProxyType(dict(self._xid.counts.get(key, {}))),
            last_xid=self._xid.last.get(key),
            compute_processes=processes,
            processes=per_process,
            process_util_visible=util_visible,
        )

    def _read_instances(self, gpu: _Gpu) -> tuple[MigInstance, ...]:
        out: list[MigInstance] = []
        devices = gpu.mig.devices()
        # Framebuffer and GPM activity belong to the GPU instance: with several compute instances
        # in one GPU instance they are published on its first compute instance only, so sums
        # over MIG devices count each GPU instance once.
        owners = {d.uuid for d in _gi_owners(devices)}
        for dev in devices:
            values: dict[str, float] = {}
            owner = dev.uuid in owners
            try:
                running = nvml_fields.read_device(
                    self._calls,
                    dev.uuid,
                    dev.handle,
                    values,
                    mig=True,
                    memory=owner,
                    processes=self.visibility.visible,
                )
                if gpu.info.gpm_supported and owner:
                    values.update(self._gpm_instance(gpu, dev) or {})
            except StaleHandle:
                # Destroyed between enumeration and read: drop it now, identify all afresh next time.
                self._calls.errors["mig:reconfigured"] += 1
                gpu.mig.reset()
                continue
            ident = dev.identity
            out.append(
                MigInstance(
                    gpu_instance_id=ident.gpu_instance_id,
                    compute_instance_id=ident.compute_instance_id,
                    profile=ident.profile,
                    placement_start=ident.placement_start,
                    placement_size=ident.placement_size,
                    uuid=dev.uuid,
                    values=MappingProxyType(values),
                    compute_processes=None if running is None else len(running),
                )
            )
        out.sort(key=lambda i: (i.placement_start, i.gpu_instance_id))
        return tuple(out)
