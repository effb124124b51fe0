"""dcgm-exporter's command line and DCGM_EXPORTER_* variables (its pkg/cmd/app.go), each mapped onto
the exporter's own settings or refused with one line saying why; flags win over variables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from exporter.commands import cli, dcgmflags
from exporter.errors import ConfigError
from exporter.settings import DEFAULT_POD_RESOURCES_SOCKET

COUNTERS = "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n"


def settings(*argv: str, **env: str):
    return cli.parse_settings(list(argv), environ=dict(env))


@pytest.mark.parametrize(
    "argv",
    [
        ["-a", ":9500", "-c", "30000"],
        ["--address", ":9500", "--collect-interval", "30000"],
        ["--address=:9500", "--collect-interval=30000"],
        ["-address", ":9500", "-collect-interval=30000"],  # Go's flag package: one dash is enough
    ],
)
def test_address_and_interval_in_every_spelling(argv: list[str]) -> None:
    s = settings(*argv)
    assert (s.listen.host, s.listen.port) == ("", 9500)
    assert s.collector.interval == 30.0  # milliseconds → seconds


def test_virtual_gpus_and_resource_names_are_taken_as_dcgm_exporter_4_5_3_takes_them() -> None:
    s = settings(KUBERNETES_VIRTUAL_GPUS="true", NVIDIA_RESOURCE_NAMES="example.com/a100, nvidia.com/gpu-big")
    assert s.layout.virtual_gpus and s.resource_names == ("example.com/a100", "nvidia.com/gpu-big")
    flags = settings("--kubernetes-virtual-gpus=false", "--nvidia-resource-names", "example.com/x")
    assert not flags.layout.virtual_gpus and flags.resource_names == ("example.com/x",)
    assert not settings().layout.virtual_gpus and settings().resource_names == ()


def test_variables_map_and_flags_win(tmp_path: Path) -> None:
    counters = tmp_path / "c.csv"
    counters.write_text(COUNTERS)
    env = {
        "DCGM_EXPORTER_LISTEN": "127.0.0.1:9600",
        "DCGM_EXPORTER_INTERVAL": "5000",
        "DCGM_EXPORTER_KUBERNETES": "true",
        "DCGM_POD_RESOURCES_KUBELET_SOCKET": "/run/k.sock",
        "DCGM_EXPORTER_COLLECTORS": str(counters),
        "DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE": "60000",
        "DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE": "120000",
        "DCGM_EXPORTER_NO_HOSTNAME": "1",
        "DCGM_EXPORTER_DEBUG": "True",
        "KUBERNETES_ENABLE_DRA": "true",
        "DCGM_EXPORTER_DEVICES_STR": "f",
    }
    s = settings(**env)
    assert (s.listen.host, s.listen.port, s.collector.interval) == ("127.0.0.1", 9600, 5.0)
    assert s.kubernetes and s.pod_resources_socket == Path("/run/k.sock")
    assert [m.name for m in s.layout.selection.metrics] == ["DCGM_FI_DEV_GPU_UTIL"]
    assert (s.layout.xid_window_s, s.layout.clock_events_window_s) == (60.0, 120.0)
    assert s.layout.hostname_label == "none"
    assert s.log_level == "debug" and s.enable_dra and s.layout.mig_series == "per-instance"
    # A flag beats its variable, dcgm-exporter's or ours.
    s = settings("-a", ":9700", "--interval", "2", "-k=false", **env)
    assert (s.listen.port, s.collector.interval) == (9700, 2.0)
    assert settings("--listen", ":9800", **env).listen.port == 9800
    assert settings("--kubernetes-enable-dra=false", **env).enable_dra is False


def test_defaults_without_any_option() -> None:
    s = settings()
    assert (s.listen.port, s.collector.interval, s.kubernetes, s.enable_dra) == (9400, 10.0, False, False)
    assert s.pod_resources_socket == DEFAULT_POD_RESOURCES_SOCKET
    assert settings("--kubernetes-enable-dra").enable_dra


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["-r", "localhost:5555"], {}, "-r: no DCGM host engine is used"),
        (
            [],
            {"DCGM_REMOTE_HOSTENGINE_INFO": "nv-hostengine:5555"},
            "$DCGM_REMOTE_HOSTENGINE_INFO: no DCGM host engine",
        ),
        (["--kubernetes-enable-pod-labels"], {}, "pod labels and UIDs need the Kubernetes API"),
        (["--kubernetes-enable-pod-uid=true"], {}, "need the Kubernetes API"),
        (["--kubernetes-pod-label-allowlist-regex", "app.*"], {}, "need the Kubernetes API"),
        (["--kubernetes-gpu-id-type", "device-name"], {}, "device-name is not supported"),
        (["--kubernetes-gpu-id-type=serial"], {}, "expected uid or device-name"),
        (["-d", "g:0,1"], {}, "only f is supported"),
        (["-o"], {}, "1.x metric names"),
        (["-m", "gpu-operator:metrics"], {}, "mount the ConfigMap and pass -f FILE"),
        (["--config-file", "c.yaml"], {}, "YAML configuration is not read"),
        (["--web-read-timeout", "5s"], {}, "timeouts are fixed"),
        (["--log-format=logfmt"], {}, "'logfmt' is not a log format: text or json"),
        ([], {"DCGM_EXPORTER_LOG_FORMAT": "xml"}, "$DCGM_EXPORTER_LOG_FORMAT: 'xml' is not a log format"),
        (["--fake-gpus"], {}, "--backend sim"),
        (["--enable-dcgm-log"], {}, "no DCGM library"),
        (["--hpc-job-mapping-dir", "/x"], {}, "HPC job mapping"),
        (["--enable-pprof"], {}, "pprof"),
        (["-s", "g"], {}, "NVSwitch"),
        (["-c", "abc"], {}, "-c: 'abc' is not a whole number"),
        (["-c", "50"], {}, "between 100 and 3600000 milliseconds"),
        (["-k=maybe"], {}, "-k: 'maybe' is not a boolean"),
        (["-a"], {}, "-a: needs a value"),
        ([], {"DCGM_EXPORTER_INTERVAL": "30s"}, "$DCGM_EXPORTER_INTERVAL: '30s' is not a whole number"),
        ([], {"DCGM_EXPORTER_USE_OLD_NAMESPACE": "true"}, "$DCGM_EXPORTER_USE_OLD_NAMESPACE"),
    ],
)
def test_refused_with_one_line_why(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        settings(*argv, **env)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["--kubernetes-enable-pod-labels=false"],
        ["-o=false", "--fake-gpus=0"],
        ["--kubernetes-gpu-id-type", "uid"],
        ["-p", "f", "-s", "f"],
        ["--dcgm-log-level", "ERROR", "--disable-startup-validate"],
        ["--dump-directory", "/tmp/d", "--dump-retention", "0", "--dump-compression=false"],
        ["--log-format", "text", "--gpu-bind-unbind-poll-interval", "2s"],
        ["-m", "none"],
    ],
)
def test_options_that_change_nothing_here_are_accepted(argv: list[str]) -> None:
    assert settings(*argv) == settings()


@pytest.mark.parametrize(
    ("argv", "env", "log_format", "level"),
    [
        (["--log-format=json"], {}, "json", "info"),
        (["--log-format", "text"], {"DCGM_EXPORTER_LOG_FORMAT": "json"}, "text", "info"),
        ([], {"DCGM_EXPORTER_LOG_FORMAT": "json", "DCGM_EXPORTER_DEBUG": "true"}, "json", "debug"),
        (["--debug"], {}, "text", "debug"),
        (["--log-level", "warning"], {"DCGM_EXPORTER_DEBUG": "true"}, "text", "warning"),
    ],
)
def test_dcgm_exporter_log_settings_become_ours(
    argv: list[str], env: dict[str, str], log_format: str, level: str
) -> None:
    """A GPU Operator spec copied from dcgm-exporter (DCGM_EXPORTER_LOG_FORMAT=json, --debug) starts the
    exporter with the same log format and level; our own flags win over the variables."""
    got = settings(*argv, **env)
    assert (got.log_format, got.log_level) == (log_format, level)


def test_every_option_of_app_go_is_known() -> None:
    """The names of dcgm-exporter's pkg/cmd/app.go (CLI* constants) and their variables."""
    names = {o.name for o in dcgmflags.OPTIONS}
    assert names >= {
        "collectors", "address", "collect-interval", "kubernetes", "kubernetes-gpu-id-type",
        "kubernetes-enable-pod-labels", "kubernetes-enable-pod-uid", "kubernetes-enable-dra",
        "kubernetes-pod-label-allowlist-regex", "pod-resources-kubelet-socket", "web-config-file",
        "xid-count-window-size", "clock-events-count-window-size", "remote-hostengine-info",
        "devices", "no-hostname", "use-old-namespace", "config-file", "web-systemd-socket",
    }  # fmt: skip
    envs = {o.env for o in dcgmflags.OPTIONS}
    assert len(envs) == len(dcgmflags.OPTIONS)
    assert {
        "DCGM_EXPORTER_LISTEN",
        "DCGM_EXPORTER_INTERVAL",
        "DCGM_EXPORTER_KUBERNETES",
        "KUBERNETES_ENABLE_DRA",
    } <= envs


@pytest.mark.slow
def test_a_gpu_operator_command_line_runs_the_process(tmp_path: Path) -> None:
    """As the GPU Operator starts dcgm-exporter: flags in the argv, settings in the environment;
    on this machine without a GPU, --once ends with the one no-GPU line, not a usage error."""
    env = {"DCGM_EXPORTER_LISTEN": ":9400", "DCGM_EXPORTER_KUBERNETES": "true", "PATH": "/usr/bin:/bin"}
    res = subprocess.run(
        [sys.executable, "-m", "exporter", "-c", "30000", "-a", ":0", "--once"],
        capture_output=True, text=True, check=False, timeout=60, env=env,
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("gpupilot-exporter: backend nvml unavailable:")
    res = subprocess.run(
        [sys.executable, "-m", "exporter", "-r", "localhost:5555"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.strip() == (
        "gpupilot-exporter: -r: no DCGM host engine is used: values come from NVML in this process; unset it"
    )
