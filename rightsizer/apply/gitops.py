"""``--workloads gitops``: the request changes written as files for a Git repository, not applied.

For each workload whose request changes: a kustomize strategic-merge patch
(``<namespace>.<kind>.<name>.yaml``: the container's ``resources`` with the new resource and the old
one set to ``null``, which deletes it), listed in ``kustomization-patches.yaml`` (paste its
``patches:`` into the overlay's ``kustomization.yaml``), and one ``workloads.diff`` (unified diff of
each pod template's containers as the cluster has them now, for a review). Files are written
atomically (a temporary file renamed over the old one).
"""

from __future__ import annotations

import difflib
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from rightsizer.apply.workloads import Change, moved_containers, template_of

API_VERSIONS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "ReplicaSet": "apps/v1"}


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def patch_name(change: Change) -> str:
    return f"{change.namespace}.{change.kind.lower()}.{change.name}.yaml"


def kustomize_patch(change: Change, live: Mapping[str, Any]) -> dict[str, Any]:
    """The strategic-merge patch that moves the workload's containers to the new request."""
    before = (template_of(live, change.kind).get("spec") or {}).get("containers") or []
    after = moved_containers(before, change.moves)
    containers = []
    for old_c, new_c in zip(before, after, strict=True):
        if old_c.get("resources") == new_c.get("resources"):
            continue
        res: dict[str, Any] = {}
        for part in ("limits", "requests"):
            was = (old_c.get("resources") or {}).get(part) or {}
            now = (new_c.get("resources") or {}).get(part) or {}
            if was == now:
                continue
            res[part] = {**{k: None for k in was if k not in now}, **now}
        containers.append({"name": new_c.get("name"), "resources": res})
    return {
        "apiVersion": API_VERSIONS.get(change.kind, "apps/v1"),
        "kind": change.kind,
        "metadata": {"name": change.name, "namespace": change.namespace},
        "spec": {"template": {"spec": {"containers": containers}}},
    }


def unified_diff(change: Change, live: Mapping[str, Any]) -> str:
    before = (template_of(live, change.kind).get("spec") or {}).get("containers") or []
    after = moved_containers(before, change.moves)
    where = f"{change.namespace}/{change.kind.lower()}/{change.name}"
    return "".join(
        difflib.unified_diff(
            _dump({"containers": before}).splitlines(keepends=True),
            _dump({"containers": after}).splitlines(keepends=True),
            fromfile=f"a/{where}",
            tofile=f"b/{where}",
        )
    )


def write_patches(directory: Path, changes: Sequence[tuple[Change, Mapping[str, Any]]]) -> list[Path]:
    """Write one patch per ``(change, live object)``, the kustomization list and the diff; returns the paths."""
    written = []
    diffs = []
    for change, live in changes:
        path = directory / patch_name(change)
        write_atomically(path, _dump(kustomize_patch(change, live)))
        written.append(path)
        diffs.append(unified_diff(change, live))
    listing = directory / "kustomization-patches.yaml"
    write_atomically(listing, _dump({"patches": [{"path": p.name} for p in written]}))
    diff = directory / "workloads.diff"
    write_atomically(diff, "".join(diffs))
    return [*written, listing, diff]
