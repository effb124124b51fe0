"""Discovery's background refresh: an unforeseen failure of one refresh never ends the thread."""

from __future__ import annotations

import threading
import time

from adapter.config.mapping import AdapterConfig
from adapter.provider.discovery import Discovery


class FlakyNames:
    """Prometheus' metric names: the first call fails as aiohttp's stream can (a bare
    RuntimeError when the connection goes away mid-answer), later calls answer."""

    def __init__(self) -> None:
        self.calls = 0
        self.answered = threading.Event()

    def metric_names(self) -> set[str]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("Connection closed.")
        self.answered.set()
        return {"DCGM_FI_DEV_GPU_UTIL"}


def test_a_refresh_that_raises_anything_leaves_the_thread_refreshing(caplog) -> None:
    names = FlakyNames()
    failures: list[BaseException] = []
    discovery = Discovery(
        prometheus=names,  # type: ignore[arg-type]
        config=lambda: AdapterConfig(source="test", metrics=(), external=()),
        interval=0.05,
        on_failure=failures.append,
    )
    discovery.start()
    try:
        assert names.answered.wait(5.0), "the thread died with the first refresh's error"
        deadline = time.monotonic() + 5.0
        while discovery.listing.refreshed == 0.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert discovery.listing.refreshed > 0.0
    finally:
        discovery.stop()
    assert [type(f) for f in failures] == [RuntimeError]  # counted once
    (line,) = [r.getMessage() for r in caplog.records if "discovery refresh" in r.getMessage()]
    assert "RuntimeError: Connection closed." in line and "Traceback" not in caplog.text
