"""gpupilot_common.atomicfile: a failed write (full disk, no permission) leaves the old file or
directory exactly as it was and says so in one line; report directories are swapped as a whole."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest

from gpupilot_common import atomicfile


def _full_disk(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    def fail(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, name, fail)


@pytest.mark.parametrize("step", ["write", "fsync"])
def test_a_full_disk_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    target = tmp_path / "plan.json"
    target.write_text('{"old": true}\n')
    _full_disk(monkeypatch, step)
    with pytest.raises(atomicfile.WriteFailed) as err:
        atomicfile.write_text(target, '{"new": true}\n' * 1000)
    assert target.read_text() == '{"old": true}\n'
    assert os.listdir(tmp_path) == ["plan.json"]
    message = str(err.value)
    assert message == f"cannot write {target}: No space left on device; the previous one is left intact"
    assert "\n" not in message


def test_a_new_file_is_written_whole(tmp_path: Path) -> None:
    target = tmp_path / "chart.png"
    atomicfile.write_bytes(target, b"\x89PNG" + bytes(range(256)) * 100)
    assert target.read_bytes()[:4] == b"\x89PNG" and target.stat().st_size == 4 + 25600
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    atomicfile.write_bytes(target, b"second")
    assert target.read_bytes() == b"second" and os.listdir(tmp_path) == ["chart.png"]


def test_a_directory_without_write_permission_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As an unprivileged user in a read-only directory (the tests run as root, where the mode bits
    do not stop a write, so the refusal the kernel would give is raised where it would come)."""
    target = tmp_path / "plan.json"
    target.write_text("old")

    def refuse(*_a: object, **_k: object) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    with pytest.raises(atomicfile.WriteFailed) as err:
        atomicfile.write_text(target, "new")
    assert str(err.value) == f"cannot write {target}: Permission denied; the previous one is left intact"
    assert target.read_text() == "old"


def _report_name(name: str) -> bool:
    return name.endswith((".html", ".png"))


def test_a_directory_is_replaced_as_a_whole(tmp_path: Path) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.html").write_text("old")
    (out / "old-chart.png").write_bytes(b"old")

    def build(staging: Path) -> str:
        (staging / "report.html").write_text("new")
        (staging / "new-chart.png").write_bytes(b"new")
        return "built"

    assert atomicfile.replace_dir(out, build, owned=_report_name) == "built"
    assert sorted(os.listdir(out)) == ["new-chart.png", "report.html"]
    assert (out / "report.html").read_text() == "new"
    assert os.listdir(tmp_path) == ["report"]  # no staging or old directory left behind


def test_a_failed_build_leaves_the_old_directory_untouched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.html").write_text("old")
    (out / "trend.png").write_bytes(b"old")
    _full_disk(monkeypatch, "fsync")

    def build(staging: Path) -> None:
        (staging / "report.html").write_text("new")
        (staging / "extra.png").write_bytes(b"new")

    with pytest.raises(atomicfile.WriteFailed, match=r"report: No space left on device; the previous one"):
        atomicfile.replace_dir(out, build, owned=_report_name)
    assert sorted(os.listdir(out)) == ["report.html", "trend.png"]
    assert (out / "report.html").read_text() == "old"
    assert os.listdir(tmp_path) == ["report"]


def test_other_files_are_kept_and_other_directories_refused(tmp_path: Path) -> None:
    out = tmp_path / "report"
    out.mkdir()
    (out / "plan.json").write_text("the plan the report was made from")
    (out / "old.png").write_bytes(b"old")
    atomicfile.replace_dir(out, lambda staging: (staging / "new.png").write_bytes(b"new"), owned=_report_name)
    assert sorted(os.listdir(out)) == ["new.png", "plan.json"]
    assert (out / "plan.json").read_text() == "the plan the report was made from"
    (tmp_path / "src").mkdir()
    with pytest.raises(
        atomicfile.WriteFailed, match=r"holds directories or links this tool did not write \(report, src\)"
    ):
        atomicfile.replace_dir(tmp_path, lambda staging: None, owned=_report_name)
    assert sorted(os.listdir(tmp_path)) == ["report", "src"]


def test_a_directory_that_cannot_be_flushed_is_not_called_intact(tmp_path, monkeypatch):
    target = tmp_path / "plan.json"
    target.write_text("old")
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if os.path.isdir(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(atomicfile.WriteFailed) as err:
        atomicfile.write_text(target, "new")
    assert "may not survive a crash" in str(err.value) and "left intact" not in str(err.value)
    assert target.read_text() == "new"
