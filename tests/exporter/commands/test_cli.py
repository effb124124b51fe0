"""``gpupilot-exporter``: --once, flag and file errors (one line, exit 2), --help, and a served process end to end."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from devkit.prometheus import free_port
from exporter.commands import cli
from exporter.settings import DEFAULT_POD_RESOURCES_SOCKET
from simulator.backend import SimBackend
from tests.support.exporter import fakes
from tests.support.exporter import kubelet_double as kd
from tests.support.exporter.kubelet_double import KubeletDouble

ROOT = Path(__file__).resolve().parents[3]
SCENARIO = ROOT / "examples" / "fleet-demo.yaml"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exporter", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.slow
def test_once_prints_the_exposition_of_a_simulated_node() -> None:
    res = run("--backend", "sim", "--scenario", str(SCENARIO), "--node", "gpu-h100-b", "--once")
    assert res.returncode == 0, res.stderr
    fams = {f.name: f for f in text_string_to_metric_families(res.stdout)}
    temps = fams["DCGM_FI_DEV_GPU_TEMP"].samples
    assert {s.labels["Hostname"] for s in temps} == {"gpu-h100-b"}
    assert {s.labels["gpu"] for s in temps} == {"0", "1", "2"}
    # the scenario's own pods attribute devices in sim mode
    assert any(s.labels.get("namespace") == "ai-serving" for s in temps)
    assert len(fams["DCGM_FI_PROF_GR_ENGINE_ACTIVE"].samples) >= 7
    assert fams["gpupilot_exporter_backend_up"].samples[0].value == 1.0


@pytest.mark.slow
def test_once_warns_in_one_line_when_the_pod_resources_socket_is_missing(tmp_path: Path) -> None:
    missing = tmp_path / "kubelet.sock"
    res = run("--backend", "sim", "--scenario", str(SCENARIO), "--node", "gpu-h100-b", "--once",
              "--pod-resources-socket", str(missing))  # fmt: skip
    assert res.returncode == 0  # the metrics are still printed, without pods
    assert res.stderr.count("\n") == 1
    assert res.stderr.startswith(
        f"gpupilot-exporter: warning: {missing}: kubelet pod-resources socket not found"
    )
    assert "DCGM_FI_DEV_GPU_TEMP" in res.stdout
    present = run("--backend", "sim", "--scenario", str(SCENARIO), "--node", "gpu-h100-b", "--once")
    assert "warning" not in present.stderr  # the simulator's own pods: nothing to warn about


def test_a_socket_path_too_long_to_look_up_is_reported_missing() -> None:
    settings = cli.parse_settings(
        ["--backend", "sim", "--scenario", str(SCENARIO), "--pod-resources-socket", "/" + "s" * 300],
        environ={},
    )
    assert "kubelet pod-resources socket not found" in cli.missing_socket_line(settings)


# An exporter-only install (the exporter image: no numpy, no simulator extra), imitated by hiding numpy
# from the import system before the exporter starts.
WITHOUT_NUMPY = "import sys; sys.modules['numpy'] = None; from exporter.commands.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "wanted_by"),
    [
        (["--backend", "sim", "--scenario", str(SCENARIO), "--once"], "--backend sim"),
        (["backfill", "--scenario", str(SCENARIO)], "gpupilot-exporter backfill"),
    ],
)
def test_sim_without_the_simulator_extra_is_one_line_naming_it(args: list[str], wanted_by: str) -> None:
    res = subprocess.run(
        [sys.executable, "-c", WITHOUT_NUMPY, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        f"gpupilot-exporter: {wanted_by} needs the simulator (missing module 'numpy'): "
        "pip install 'gpupilot[simulator]'"
    ]
    assert res.stdout == ""


def test_once_failure_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(
        cli, "build_backend", lambda settings: fakes.FakeBackend(fakes.node(), open_failures=99)
    )
    assert cli.main(["--once", "--node-name", "n"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("gpupilot-exporter: backend fake unavailable: NVML_ERROR_LIBRARY_NOT_FOUND")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--interval", "0"], "argument --interval: '0': must be between 0.1 and 3600 seconds"),
        (["--interval", "nan"], "argument --interval: 'nan' is not a finite number"),
        (["--interval", "inf"], "argument --interval: 'inf' is not a finite number"),
        (["--interval", "1e300"], "argument --interval: '1e300': must be between 0.1 and 3600"),
        (["--interval", "ten"], "argument --interval: 'ten' is not a number"),
        (["--collect-timeout", "-0"], "argument --collect-timeout: '-0': must be more than 0"),
        (
            ["--interval", "5", "--collect-timeout", "9"],
            "--collect-timeout 9: must be positive and at most --interval (5)",
        ),
        (["--listen", "nowhere"], "argument --listen: 'nowhere': expected HOST:PORT"),
        (["--backend", "sim"], "--backend sim needs --scenario FILE"),
        (["--scenario", "x.yaml"], "--scenario and --node only apply to --backend sim"),
        (
            ["--backend", "sim", "--scenario", "/nonexistent.yaml"],
            "/nonexistent.yaml: scenario file not found",
        ),
        (
            ["--backend", "sim", "--scenario", str(SCENARIO), "--node", "nope"],
            "no node 'nope' in the scenario",
        ),
        (["--web-config", "/nonexistent/web.yml", "--once"], "/nonexistent/web.yml: cannot read web config"),
        (["--backend", "gpu"], "argument --backend: invalid choice: 'gpu'"),
        (["--frobnicate"], "unrecognized arguments: --frobnicate (see --help)"),
    ],
)
def test_bad_flags_and_files_are_one_line_exit_2(
    args: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        rc = cli.main(args)
    except SystemExit as exc:  # argparse's own errors
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert err.count("\n") == 1, err
    assert expected in err


@pytest.mark.slow
def test_bad_flag_through_the_real_entry_point() -> None:
    res = run("--interval", "-1")
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr == (
        "gpupilot-exporter: error: argument --interval: '-1': must be between 0.1 and 3600 seconds "
        "(see --help)\n"
    )


@pytest.mark.slow
def test_bad_web_config_fails_at_start(tmp_path: Path) -> None:
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  admin: hunter2\n")
    res = run(
        "--backend", "sim", "--scenario", str(SCENARIO), "--web-config", str(web), "--listen", "127.0.0.1:0"
    )
    assert res.returncode == 2
    assert res.stderr.strip() == (
        f"gpupilot-exporter: {web}:2: basic_auth_users.admin: expected a bcrypt hash ($2y$…, 60 characters), "
        "e.g. from htpasswd -nBC 10 USER"
    )


@pytest.mark.slow
def test_help_explains_every_flag() -> None:
    res = run("--help")
    assert res.returncode == 0
    for flag in (
        "--backend",
        "--scenario",
        "--node ",
        "--listen",
        "--interval",
        "--collect-timeout",
        "--node-name",
        "--kubernetes",
        "--pod-resources-socket",
        "--web-config",
        "--once",
        "--log-level",
        "--collectors",
        "--mig-series",
        "--hostname-label",
        "--xid-count-window-size",
        "--clock-events-count-window-size",
        "backfill",
        "cluster",
    ):
        assert flag in res.stdout


def test_settings_defaults_and_node_name_precedence() -> None:
    s = cli.parse_settings([], environ={"NODE_NAME": "from-env"})
    assert (s.backend, s.listen.host, s.listen.port) == ("nvml", "", 9400)
    assert s.collector.interval == 10.0 and s.collector.collect_timeout == 5.0
    assert s.node_name == "from-env"
    assert s.pod_resources_socket == DEFAULT_POD_RESOURCES_SOCKET and not s.kubernetes
    assert cli.parse_settings(["--node-name", "flag"], environ={"NODE_NAME": "env"}).node_name == "flag"
    assert cli.parse_settings(["--interval", "2"], environ={}).collector.collect_timeout == 2.0
    s = cli.parse_settings(["--pod-resources-socket", "/tmp/k.sock", "--listen", "[::1]:9500"], environ={})
    assert s.kubernetes and s.pod_resources_socket_given and s.listen.host == "::1" and s.listen.port == 9500


@pytest.mark.slow
def test_serves_until_sigterm(tmp_path: Path) -> None:
    port = free_port()
    argv = ["--backend", "sim", "--scenario", str(SCENARIO), "--node", "gpu-h200-a"]
    argv += ["--listen", f"127.0.0.1:{port}", "--interval", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        ready = None
        while time.monotonic() < deadline:
            try:
                ready = requests.get(f"http://127.0.0.1:{port}/ready", timeout=2)
                if ready.status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        assert ready is not None and ready.status_code == 200
        r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert 'Hostname="gpu-h200-a"' in r.text
        assert r.headers["Content-Encoding"] == "gzip"  # requests asks for gzip, like Prometheus
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "serving http://127.0.0.1:" in err


def once(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, list[Any]]]:
    rc = cli.main(["--backend", "sim", "--scenario", str(SCENARIO), "--node", "gpu-h100-b", "--once", *args])
    out, _ = capsys.readouterr()
    fams: dict[str, list[Any]] = {}
    for fam in text_string_to_metric_families(out):
        for s in fam.samples:
            fams.setdefault(s.name.removesuffix("_total"), []).append(s)
    return rc, fams


def test_kubelet_attribution_replaces_the_scenarios_pods(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gpu0 = SimBackend.from_file(SCENARIO, node="gpu-h100-b").snapshot_at(0).gpus[0].info.uuid
    with KubeletDouble(tmp_path / "kubelet.sock") as kubelet:
        kubelet.set_pods([kd.pod("team-x", "real-pod", [kd.container("main", gpu=[gpu0 + "::2"])])])
        rc, fams = once(["--pod-resources-socket", str(tmp_path / "kubelet.sock")], capsys)
    assert rc == 0
    pods = {(s.labels.get("namespace"), s.labels.get("pod")) for s in fams["DCGM_FI_DEV_GPU_TEMP"]}
    assert pods == {("team-x", "real-pod"), (None, None)}
    assert kubelet.calls == 1


def test_missing_kubelet_socket_gives_series_without_pod_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, fams = once(["--pod-resources-socket", str(tmp_path / "absent.sock")], capsys)
    assert rc == 0
    assert all("pod" not in s.labels for s in fams["DCGM_FI_DEV_GPU_TEMP"])
    errors = {s.labels["kind"]: s.value for s in fams["gpupilot_exporter_collection_errors"]}
    assert errors["podresources"] == 1.0


@pytest.mark.parametrize("command", ["backfill", "cluster"])
def test_simulator_subcommands_are_dispatched(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    out, _ = capsys.readouterr()
    assert "usage:" in out and command in out


def test_dra_flag_and_the_in_cluster_api_address() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    on = cli.parse_settings(["--kubernetes", "--kubernetes-enable-dra"], environ=env)
    assert on.enable_dra is True and on.kube_api_url == "https://[fd00::1]:6443"
    off = cli.parse_settings(["--kubernetes"], environ={})
    assert off.enable_dra is False and off.kube_api_url == ""
