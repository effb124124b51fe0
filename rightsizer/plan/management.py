"""How a node's GPUs are managed, read from the cluster: NVIDIA's DRA driver (and whether with
``DynamicMIG``) or the device plugin. Pure: nodes and ResourceSlices in, as ``kubectl get -o json``
prints them.

* A ResourceSlice of driver ``gpu.nvidia.com`` whose MIG devices (``type=mig``) carry no ``uuid``, or
  consume shared counters (``consumesCounters``), is ``DynamicMIG``: the driver creates the instance
  when a claim is prepared, and NVIDIA says the MIG Manager must not run there.
* Other ``gpu.nvidia.com`` slices (MIG devices with a ``uuid``, whole GPUs), or the GPU Operator's
  ``nvidia.com/gpu.deploy.dra-driver=true`` label: a DRA node whose MIG layout is made ahead of time.
* The label while the slices cannot be read: the mode is unknown, and the node is left alone (the
  safe side, as for a node the series call dynamic).

Both ``resource.k8s.io/v1`` devices (``attributes`` on the device) and ``v1beta1`` ones (under
``basic``) are read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

DEVICE_PLUGIN, DRA_STATIC, DRA_DYNAMIC = "device-plugin", "dra-static-mig", "dra-dynamic-mig"
DRIVER = "gpu.nvidia.com"
DRA_LABEL = "nvidia.com/gpu.deploy.dra-driver"


def _device_fields(device: Mapping[str, Any]) -> Mapping[str, Any]:
    basic = device.get("basic")
    return basic if isinstance(basic, Mapping) else device


def slice_devices(rslice: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The attribute-holding part of each device (v1: the device; v1beta1: its ``basic``)."""
    devices = (rslice.get("spec") or {}).get("devices") or []
    return [_device_fields(d) for d in devices if isinstance(d, Mapping)]


def device_attribute(fields: Mapping[str, Any], name: str) -> str | None:
    """A device attribute's value as text (``{"string": "mig"}`` → ``mig``), None when absent."""
    attrs = fields.get("attributes") or {}
    value = attrs.get(name) if isinstance(attrs, Mapping) else None
    if not isinstance(value, Mapping):
        return None
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            return str(value[kind])
    return None


def slice_node(rslice: Mapping[str, Any]) -> str:
    spec = rslice.get("spec") or {}
    return str(spec.get("nodeName") or (spec.get("pool") or {}).get("name") or "")


def dynamic_devices(rslice: Mapping[str, Any]) -> list[str]:
    """Names of the slice's MIG devices that only exist once claimed (no ``uuid``, or shared counters)."""
    out = []
    for device in (rslice.get("spec") or {}).get("devices") or []:
        if not isinstance(device, Mapping):
            continue
        fields = _device_fields(device)
        if device_attribute(fields, "type") != "mig":
            continue
        if device_attribute(fields, "uuid") is None or fields.get("consumesCounters"):
            out.append(str(device.get("name", "")))
    return out


def mode(node: Mapping[str, Any], slices: Iterable[Mapping[str, Any]] | None) -> tuple[str, str] | None:
    """(mode, reason) for ``node`` from its labels and the ``gpu.nvidia.com`` slices (``None``: they
    could not be read); ``None`` when nothing says the DRA driver runs there."""
    name = str((node.get("metadata") or {}).get("name", ""))
    labelled = ((node.get("metadata") or {}).get("labels") or {}).get(DRA_LABEL) == "true"
    if slices is None:
        if labelled:
            return DRA_DYNAMIC, (
                f"{DRA_LABEL}=true and its ResourceSlices could not be read: DynamicMIG cannot be ruled out"
            )
        return None
    own = [s for s in slices if (s.get("spec") or {}).get("driver") == DRIVER and slice_node(s) == name]
    dynamic = [d for s in own for d in dynamic_devices(s)]
    if dynamic:
        return DRA_DYNAMIC, (
            f"DynamicMIG: {len(dynamic)} MIG device(s) in its {DRIVER} ResourceSlices have no uuid "
            f"(e.g. {dynamic[0]}): instances are created per claim"
        )
    if own:
        return DRA_STATIC, f"{DRIVER} ResourceSlices with MIG instances made ahead of time"
    if labelled:
        return DRA_STATIC, f"{DRA_LABEL}=true (no {DRIVER} ResourceSlice published yet)"
    return None
