"""A named pipe, a device or a directory given where a file is expected is one line, at once — it
blocked seven commands for ever, `serve --check --offline` included — and a NUL character in a path
of serve.yaml (state_dir, report.out_dir) is one line naming the field, not a traceback. Each command
runs as users run it, in a process of its own, all at once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpupilot_common import yamlsafe

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "fleet-demo.yaml"

pytestmark = pytest.mark.slow  # a dozen processes


def commands(fifo: str) -> dict[str, list[str]]:
    return {
        "serve --check --offline": ["rightsizer", "serve", "--config", fifo, "--check", "--offline"],
        "validate": ["rightsizer", "validate", fifo],
        "apply --plan": ["rightsizer", "apply", "--plan", fifo, "--dry-run"],
        "plan token file": ["rightsizer", "plan", "--prometheus-url", "http://127.0.0.1:9", "--prometheus-bearer-token-file", fifo],
        "exporter --scenario": ["exporter", "--once", "--backend", "sim", "--scenario", fifo],
        "exporter -f": ["exporter", "--once", "--backend", "sim", "--scenario", str(DEMO), "-f", fifo],
        "exporter --web-config": ["exporter", "--once", "--backend", "sim", "--scenario", str(DEMO), "--web-config", fifo],
        "adapter serve --config": ["adapter", "serve", "--config", fifo, "--prometheus-url", "http://127.0.0.1:9"],
        "explain-hpa": ["adapter", "explain-hpa", "-f", fifo, "--state", fifo],
        "convert-config": ["adapter", "convert-config", fifo],
    }  # fmt: skip


def run_all(argvs: dict[str, list[str]], cwd: Path) -> dict[str, subprocess.CompletedProcess[str]]:
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", *argv], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, argv in argvs.items()
    }
    out = {}
    for name, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail(f"{name}: still blocked after 90 s")
        out[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return out


def test_a_named_pipe_where_a_file_is_expected_is_one_line_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for name, done in run_all(commands(str(fifo)), REPO).items():
        lines = [ln for ln in done.stderr.splitlines() if ln.strip() and " INFO " not in ln]
        assert done.returncode != 0, (name, done.stderr)
        assert "Traceback" not in done.stderr, (name, done.stderr)
        assert len(lines) == 1 and "named pipe" in lines[0] and str(fifo) in lines[0], (name, lines)


@pytest.mark.parametrize(("where", "kind"), [("/dev/null", "a character device"), ("dir", "a directory")])
def test_the_reader_refuses_devices_and_directories(tmp_path: Path, where: str, kind: str) -> None:
    path = tmp_path if where == "dir" else Path(where)
    with pytest.raises(OSError) as err:
        yamlsafe.read_text(path)
    assert err.value.strerror is not None and err.value.strerror.startswith(kind)


@pytest.mark.parametrize("field", ["state_dir", "report.out_dir"])
def test_a_nul_in_a_serve_yaml_path_is_one_line_naming_the_field(tmp_path: Path, field: str) -> None:
    config = tmp_path / "serve.yaml"
    bad = '"/var/lib/gpu\\0pilot"'
    report = f"report:\n  schedule: mon 06:00\n  out_dir: {bad}\n" if field == "report.out_dir" else ""
    state = f"state_dir: {bad}\n" if field == "state_dir" else f"state_dir: {tmp_path}\n"
    config.write_text(
        f"prometheus_url: http://127.0.0.1:9\ntimezone: UTC\n{state}{report}plan: {{every: 6h}}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "rightsizer", "serve", "--config", str(config), "--check", "--offline"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and field.rsplit(".", maxsplit=1)[-1] in lines[0] and "NUL" in lines[0], lines
