"""Fixtures shared by the ``serve`` tests."""

from __future__ import annotations

from datetime import datetime

import apscheduler.executors.base
import apscheduler.schedulers.base
import pytest

from tests.support.rightsizer.serve_support import BERLIN, Clock


@pytest.fixture
def scheduler_clock(monkeypatch):
    """The scheduler's clock, set by hand: ``Service`` reads it, and APScheduler's own ``datetime.now``
    follows it. Starts on a Saturday evening in Berlin."""
    c = Clock(datetime(2026, 11, 28, 20, 0, tzinfo=BERLIN))  # a Saturday evening

    class FakeDatetime(datetime):
        @classmethod
        def now(cls, tz=None):
            return c.now.astimezone(tz) if tz else c.now.replace(tzinfo=None)

    monkeypatch.setattr(apscheduler.schedulers.base, "datetime", FakeDatetime)
    monkeypatch.setattr(apscheduler.executors.base, "datetime", FakeDatetime)
    return c
