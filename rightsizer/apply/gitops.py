"""``--workloads gitops``: the request changes written as files for a Git repository, not applied.

For each workload whose request changes: a kustomize strategic-merge patch
(``<namespace>.<kind>.<name>.yaml``: the container's ``resources`` with the new resource and the old
one set to ``null``, which deletes it), listed in ``kustomization-patches.yaml`` (paste its
``patches:`` into the overlay's ``kustomization.yaml``), and one ``workloads.diff`` (unified diff of
each pod template's containers as the cluster has them now, for a review).

Files go into ``<gitops dir>/<plan id>/`` only: the plan's folder is made or opened relative to the
gitops directory without following a symbolic link (a folder that is a link is refused, as is a
patch name that is one), and each file is written whole or not at all (a temporary file in the same
folder, flushed, renamed over the old one: :mod:`gpupilot_common.atomicfile`'s way). A failure — a
read-only or full disk, a link in the way — raises :class:`GitopsWriteFailed` (one line naming the
file and the cause) after removing the files this call had added; the caller rolls back.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import os
import secrets
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpupilot_common.atomicfile import WriteFailed
from rightsizer.apply.workloads import Change, moved_containers, template_of

API_VERSIONS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1", "ReplicaSet": "apps/v1"}


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


class GitopsWriteFailed(WriteFailed):
    """A patch file could not be written inside the plan's folder; nothing this run added is left."""


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_plan_folder(directory: Path, plan_id: str) -> int:
    """A descriptor of ``directory/plan_id``, made if missing; neither may be a symbolic link."""
    if plan_id in ("", ".", "..") or "/" in plan_id or "\0" in plan_id:
        raise GitopsWriteFailed(
            directory, OSError(errno.EINVAL, f"{plan_id!r} is not a folder name"), kept=False
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
        top = os.open(directory, _DIR)
    except OSError as exc:
        why = exc
        if directory.is_symlink():  # O_NOFOLLOW met a link (ENOTDIR or ELOOP)
            why = OSError(errno.ELOOP, "it is a symbolic link; give the real folder")
        elif exc.errno in (errno.ENOTDIR, errno.EEXIST):
            why = OSError(exc.errno, "not a folder (a file is in its place)")
        raise GitopsWriteFailed(directory, why, kept=False) from None
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(plan_id, 0o755, dir_fd=top)
        return os.open(plan_id, _DIR, dir_fd=top)
    except OSError as exc:
        why = exc
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # a file or a link where the folder goes
            why = OSError(exc.errno, "not a folder (a symbolic link or a file is in its place)")
        raise GitopsWriteFailed(directory / plan_id, why, kept=False) from None
    finally:
        os.close(top)


def _write_in(folder: int, name: str, data: bytes) -> None:
    """``name`` in the open ``folder`` written whole: a temporary file there, fsync, renamed over
    the old one (never through a link: a rename replaces the name itself), the folder fsynced."""
    try:
        if stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode):
            raise OSError(errno.ELOOP, "a symbolic link is in its place")
    except FileNotFoundError:
        pass
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder
    )
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder)
        raise
    os.fsync(folder)


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


def write_patches(
    directory: Path, plan_id: str, changes: Sequence[tuple[Change, Mapping[str, Any]]]
) -> list[Path]:
    """Write one patch per ``(change, live object)``, the kustomization list and the diff into
    ``directory/plan_id``; returns the paths. :class:`GitopsWriteFailed` when one cannot be written
    (the files this call added are removed again)."""
    files: list[tuple[str, str]] = []
    diffs = []
    for change, live in changes:
        files.append((patch_name(change), _dump(kustomize_patch(change, live))))
        diffs.append(unified_diff(change, live))
    files.append(("kustomization-patches.yaml", _dump({"patches": [{"path": n} for n, _ in files]})))
    files.append(("workloads.diff", "".join(diffs)))
    folder_path = directory / plan_id
    folder = _open_plan_folder(directory, plan_id)
    added: list[str] = []
    try:
        for name, text in files:
            existed = _exists(folder, name)
            try:
                _write_in(folder, name, text.encode())
            except OSError as exc:
                raise GitopsWriteFailed(folder_path / name, exc, kept=existed) from None
            if not existed:
                added.append(name)
    except GitopsWriteFailed:
        for name in added:
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=folder)
        raise
    finally:
        os.close(folder)
    return [folder_path / name for name, _ in files]


def _exists(folder: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
