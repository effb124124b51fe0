"""An answer the process has no memory left to parse (orjson reports that as a JSON error) is said
to be that, naming the query, its size and the byte-limit flag, not "not valid JSON at byte 0": run
in a child process whose address space is capped just above what it uses."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent(
    """
    import resource
    from gpupilot_common import promanswer

    limits = promanswer.AnswerLimits(max_series=10**7, max_bytes=1 << 30)
    body = promanswer.AnswerBody(url="http://127.0.0.1:9", query="up", limits=limits)
    series = b",".join(b'{"metric":{"a":"%d"},"value":[1,"1"]}' % i for i in range(1_500_000))
    body.feed(b'{"status":"success","data":{"resultType":"vector","result":[' + series + b"]}}")
    del series
    with open("/proc/self/status") as status:
        used = next(int(line.split()[1]) for line in status if line.startswith("VmSize:")) << 10
    resource.setrlimit(resource.RLIMIT_AS, (used + (96 << 20), used + (96 << 20)))
    try:
        promanswer.decode(200, "OK", body, path="/api/v1/query")
    except promanswer.PrometheusAnswerTooLarge as exc:
        print(exc)
    """
)


@pytest.mark.slow
def test_an_answer_too_large_for_the_memory_left_says_so() -> None:
    res = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120, check=False
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == (
        "Prometheus at http://127.0.0.1:9: not enough memory to parse the answer to 'up' "
        "(63,388,952 bytes); narrow the query, lower --max-answer-bytes or give the process more memory"
    ), res.stdout + res.stderr
