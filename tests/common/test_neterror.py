"""gpupilot_common.neterror: a transport failure in the words that say what to check."""

from __future__ import annotations

import urllib3.exceptions

from gpupilot_common import neterror

CHAIN = (
    "HTTPSConnectionPool(host='127.0.0.1', port=1): Max retries exceeded with url: /apis "
    "(Caused by NewConnectionError(\"HTTPSConnection(host='127.0.0.1', port=1): Failed to establish a "
    'new connection: [Errno 111] Connection refused"))'
)


def test_the_cause_not_the_chain():
    assert neterror.cause(urllib3.exceptions.ProtocolError(CHAIN)) == "connection refused"
    assert (
        neterror.cause(OSError("[Errno -2] Name or service not known")) == "the host name is not known (DNS)"
    )


def test_an_unknown_failure_is_its_first_line_bounded():
    assert neterror.known_cause(ValueError("odd\nmore")) == ""
    assert neterror.cause(ValueError("odd\nmore")) == "odd"
    assert neterror.cause(ValueError("x" * 1000)) == "x" * 300
    assert neterror.cause(ValueError()) == "ValueError"
