"""urllib3 connections whose answers end at the caller's wall-clock deadline, headers included
(:mod:`gpupilot_common.watchdog`), for the clients built on urllib3: ``requests`` (the rightsizer's
Prometheus client) and the official ``kubernetes`` client (the adapter's and the rightsizer's).

:func:`bound` switches a ``PoolManager`` to these connection classes; the caller then wraps each
exchange in :func:`gpupilot_common.watchdog.within`.
"""

from __future__ import annotations

from typing import Any

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from gpupilot_common import watchdog


class _DeadlineHTTPConnection(HTTPConnection):
    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        watchdog.arm_current(self.sock)
        return super().getresponse(*args, **kwargs)


class _DeadlineHTTPSConnection(HTTPSConnection):
    def getresponse(self, *args: Any, **kwargs: Any) -> Any:
        watchdog.arm_current(self.sock)
        return super().getresponse(*args, **kwargs)


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _DeadlineHTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _DeadlineHTTPSConnection


def bound(pool_manager: urllib3.PoolManager) -> urllib3.PoolManager:
    """``pool_manager`` with connections that honour :func:`gpupilot_common.watchdog.within`
    (pools it already made are dropped: the next request makes one of the new kind)."""
    pool_manager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
    pool_manager.clear()
    return pool_manager
