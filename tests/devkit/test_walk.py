"""devkit.walk, the calls ``make extras`` and ``make images`` run: every subcommand of each console
script is among them, the files they read are what the commands accept, and a result is judged
wrong for a traceback, a wrong exit status, more than the one error line or missing output; a
server call waits for its URL, then stops the server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from adapter.cli import COMMANDS as ADAPTER_COMMANDS
from devkit import walk
from exporter.commands.cli import SUBCOMMANDS as EXPORTER_SUBCOMMANDS
from rightsizer.cli import COMMANDS as RIGHTSIZER_COMMANDS
from rightsizer.serve import config as serve_config


def subcommands(install: str, prog: str) -> set[str]:
    return {c.argv[1] for c in walk.CALLS[install] if c.argv[0] == prog and len(c.argv) > 1}


def test_every_subcommand_is_walked():
    assert set(ADAPTER_COMMANDS) <= subcommands("adapter", walk.ADAPTER)
    assert set(RIGHTSIZER_COMMANDS) <= subcommands("rightsizer", walk.RIGHTSIZER)
    assert set(EXPORTER_SUBCOMMANDS) <= subcommands("exporter,simulator", walk.EXPORTER)
    for install, prog in (
        ("exporter", walk.EXPORTER),
        ("adapter", walk.ADAPTER),
        ("rightsizer", walk.RIGHTSIZER),
    ):
        assert {"--version", "--help"} <= subcommands(install, prog), install
    # the base install: each program's version and a missing-extra line from each
    assert {c.argv[0] for c in walk.BASE_CALLS if c.code == 2} == {
        walk.EXPORTER,
        walk.ADAPTER,
        walk.RIGHTSIZER,
    }


def test_the_files_are_what_the_commands_read(tmp_path):
    place = walk.Place(work=str(tmp_path), prom="http://127.0.0.1:9090", port=9500)
    walk.write_files(tmp_path, place)
    cfg = serve_config.load(tmp_path / "serve.yaml")
    assert (cfg.prometheus_url, cfg.listen_port) == ("http://127.0.0.1:9090", 9500)
    assert cfg.state_dir == tmp_path / "serve-state-9500" and cfg.report is not None
    adapter = yaml.safe_load((tmp_path / "prometheus-adapter.yaml").read_text())
    assert adapter["rules"][0]["seriesQuery"].startswith("DCGM_FI_DEV_GPU_UTIL{")
    kubeconfig = yaml.safe_load((tmp_path / "kubeconfig").read_text())
    assert kubeconfig["clusters"][0]["cluster"]["server"] == f"https://127.0.0.1:{place.closed_port}"


ERROR = walk.Call(("x",), code=1, error="x: cannot reach {closed}")


@pytest.mark.parametrize(
    ("code", "stdout", "stderr", "why"),
    [
        (1, "", "x: cannot reach http://127.0.0.1:{port}: refused\n", ""),
        (1, "", "x: cannot reach http://127.0.0.1:{port}: refused\nError: exit status 1\n", ""),  # buildah's
        (2, "", "x: cannot reach http://127.0.0.1:{port}: refused\n", "exit 2, expected 1"),
        (1, "", "WARNING noise\nx: cannot reach http://127.0.0.1:{port}: refused\n", "not the one line"),
        (1, "", "Traceback (most recent call last):\n  File …\nKeyError: 'x'\n", "a traceback"),
        (1, "", "Retrying (Retry(total=2))\nx: cannot reach http://127.0.0.1:{port}\n", "retry warnings"),
    ],
)
def test_a_result_is_judged(code, stdout, stderr, why):
    place = walk.Place(work="/w")
    found = walk.judge(ERROR, place, code, stdout, stderr.replace("{port}", str(place.closed_port)))
    assert (why in found) if why else found == ""


def test_said_output_must_be_there():
    call = walk.Call(("x",), says="wrote {work}/plan.json")
    assert walk.judge(call, walk.Place(work="/w"), 0, "wrote /w/plan.json\n", "") == ""
    assert "does not hold 'wrote /w/plan.json'" in walk.judge(call, walk.Place(work="/w"), 0, "wrote x\n", "")


@pytest.mark.slow
def test_a_server_call_waits_for_its_url_then_stops_the_server(tmp_path):
    server = (sys.executable, "-m", "http.server", "{port}", "--bind", "127.0.0.1", "--directory", "{work}")
    ok = walk.Call(server, serve="http://127.0.0.1:{port}/serve.yaml", says="prometheus_url: {prom}")
    place = walk.Place(work=str(tmp_path), prom="http://prom:9090")
    outcome = walk.run_call(ok, place, wrap=list, env={}, host_work=tmp_path)
    assert outcome.ok, outcome.why
    gone = walk.Call((sys.executable, "-c", "print('bye')"), serve="http://127.0.0.1:{port}/")
    outcome = walk.run_call(gone, place, wrap=list, env={}, host_work=tmp_path)
    assert not outcome.ok and "answered nothing" in outcome.why and "bye" in outcome.why


def test_examples_are_copied_for_the_calls(tmp_path):
    walk.prepare(tmp_path)
    assert (tmp_path / "examples" / "fleet-demo.yaml").is_file()
    assert (tmp_path / "examples" / "hpa-state.yaml").read_text() == (
        Path(walk.ROOT / "examples" / "hpa-state.yaml").read_text()
    )
