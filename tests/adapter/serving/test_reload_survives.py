"""A config reload failure is logged, counted and survived: a non-UTF-8 file, an alias bomb and a
failing change hook do not stop the watch thread, and the next valid edit loads."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from adapter.config.reload import ConfigHolder
from gpupilot_common import atomicfile
from tests.common.test_yamlsafe import alias_bomb

VALID = "metrics:\n  - name: gpu_busy\n    series: DCGM_FI_DEV_GPU_UTIL\n"
VALID_2 = VALID + "  - name: gpu_hot\n    series: DCGM_FI_DEV_GPU_TEMP\n"


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


# Edits are swapped in whole (atomicfile), as kubelet swaps a mounted ConfigMap: the watch polls every
# 50 ms and would otherwise now and then read a half-written file, one failed reload more than expected.
# Edits are found by the watch alone, each one reload: a SIGHUP right after an edit races the poll
# (on a loaded machine the poll could load the edit and the signal load it again, one result more
# than counted). The SIGHUP path is checked on an unchanged file, where nothing else reloads.
def test_reload_failures_are_counted_and_the_watch_survives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = tmp_path / "adapter.yaml"
    cfg.write_text(VALID)
    results: list[bool] = []
    changes: list[int] = []

    def on_change() -> None:
        changes.append(1)
        if len(changes) == 1:
            raise RuntimeError("a listener failed")

    holder = ConfigHolder(cfg, on_result=results.append, on_change=on_change)
    first = holder.current
    thread = holder.watch(0.05)
    try:
        with caplog.at_level(logging.ERROR, logger="adapter.config.reload"):
            atomicfile.write_bytes(cfg, b"metrics:\n  - name: gpu_b\xfcsy\n")  # Latin-1
            assert wait_for(lambda: results == [False])
            atomicfile.write_text(cfg, alias_bomb())
            assert wait_for(lambda: results == [False, False])
            holder.request_reload()  # SIGHUP, the file unchanged: read again, refused again
            assert wait_for(lambda: results == [False, False, False])
        assert holder.current is first
        assert "not UTF-8 text (byte 0xfc on line 2)" in caplog.text
        assert "aliases expand to more than 200,000 values" in caplog.text
        reload_records = [r for r in caplog.records if r.name == "adapter.config.reload"]
        assert reload_records and all("\n" not in r.getMessage() for r in reload_records)
        atomicfile.write_text(cfg, VALID_2)  # the change hook raises on this reload …
        assert wait_for(lambda: results == [False, False, False, True])
        assert thread.is_alive()
        atomicfile.write_text(cfg, VALID)  # … and the watch still loads the next edit
        assert wait_for(lambda: results == [False, False, False, True, True])
        assert [m.name for m in holder.current.metrics] == ["gpu_busy"]
        time.sleep(0.15)  # three polls: no edit, no reload
        assert results == [False, False, False, True, True] and len(changes) == 2
    finally:
        holder.stop()
        thread.join(5)
