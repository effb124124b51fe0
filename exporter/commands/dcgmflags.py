"""dcgm-exporter's command line and ``DCGM_EXPORTER_*`` environment, as its ``pkg/cmd/app.go``
defines them (urfave/cli v2), translated into this exporter's own flags before they are parsed.

Every option of dcgm-exporter is known here, so a GPU Operator spec written for dcgm-exporter either
works unchanged or stops with one line naming the option and why it cannot be honoured:

* **mapped**: the value becomes one of our flags (``-a :9400`` → ``--listen=:9400``,
  ``-c 30000`` → ``--interval=30``);
* **accepted**: the option changes nothing here and says so in the docs (``--dcgm-log-level``
  without ``--enable-dcgm-log``, ``--disable-startup-validate``: there is no DCGM to validate);
* **refused**: asking for it would silently do something else (``-r`` names a DCGM host engine;
  values come from NVML in this process). A boolean option is refused only when turned on.

As in urfave/cli a flag wins over its environment variable, and both ``-name`` and ``--name``, with
the value after ``=`` or as the next argument, are accepted. An empty variable counts as unset.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from exporter.errors import ConfigError

BOOL_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
BOOL_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})
"""Go's strconv.ParseBool, which urfave/cli uses for flags and variables alike."""

Mapper = Callable[[str], list[str]]


@dataclass(frozen=True)
class Option:
    name: str
    """dcgm-exporter's long name, without dashes."""
    aliases: tuple[str, ...]
    env: str
    kind: str
    """``bool``, ``string`` or ``int``."""
    mapper: Mapper
    """The value (``"true"``/``"false"`` for a boolean) → our own flags; raises ConfigError."""


def _refuse(why: str) -> Mapper:
    def refuse(_value: str) -> list[str]:
        raise ConfigError(why)

    return refuse


def _refuse_when_on(why: str) -> Mapper:
    def refuse(value: str) -> list[str]:
        if value == "true":
            raise ConfigError(why)
        return []

    return refuse


def _refuse_when_set(why: str, *, allowed: frozenset[str] = frozenset({""})) -> Mapper:
    def refuse(value: str) -> list[str]:
        if value not in allowed:
            raise ConfigError(why)
        return []

    return refuse


def _ignored(_value: str) -> list[str]:
    return []


def _to(flag: str) -> Mapper:
    return lambda value: [f"{flag}={value}"]


def _switch(flag: str) -> Mapper:
    return lambda value: [flag] if value == "true" else []


def _interval_ms(value: str) -> list[str]:
    ms = int(value)
    if not 100 <= ms <= 3_600_000:
        raise ConfigError(f"{ms}: must be between 100 and 3600000 milliseconds")
    return [f"--interval={ms / 1000:g}"]


def _window_ms(flag: str) -> Mapper:
    return lambda value: [f"{flag}={int(value)}"]


def _gpu_id_type(value: str) -> list[str]:
    if value == "uid":
        return []
    if value == "device-name":
        raise ConfigError(
            "device-name is not supported: pods are matched by the GPU and MIG UUIDs the device "
            "plugin reports (its default id strategy, uuid); leave this option out"
        )
    raise ConfigError(f"{value!r}: expected uid or device-name")


def _devices(value: str) -> list[str]:
    if value == "f":
        return ["--mig-series=per-instance"]  # dcgm-exporter's layout: each MIG instance on its own
    raise ConfigError(
        f"{value!r}: only f is supported (every GPU, and every MIG instance with "
        "--mig-series per-instance); devices cannot be chosen by index here"
    )


def _log_format(value: str) -> list[str]:
    """dcgm-exporter's ``text`` and ``json`` (logrus' formatters) are ours too."""
    if value in ("text", "json"):
        return [f"--log-format={value}"]
    raise ConfigError(f"{value!r} is not a log format: text or json")


def _dra(value: str) -> list[str]:
    return ["--kubernetes-enable-dra"] if value == "true" else []


NO_HOST_ENGINE = "no DCGM host engine is used: values come from NVML in this process; unset it"
NO_API_SERVER = (
    "pod labels and UIDs need the Kubernetes API; this exporter reads only the kubelet's "
    "pod-resources socket (pod, namespace, container labels)"
)

OPTIONS: tuple[Option, ...] = (
    Option("collectors", ("f",), "DCGM_EXPORTER_COLLECTORS", "string", _to("--collectors")),
    Option("config-file", (), "DCGM_EXPORTER_CONFIG_FILE", "string",
           _refuse_when_set("dcgm-exporter's YAML configuration is not read; use flags or DCGM_EXPORTER_* variables")),
    Option("address", ("a",), "DCGM_EXPORTER_LISTEN", "string", _to("--listen")),
    Option("web-read-timeout", (), "DCGM_EXPORTER_WEB_READ_TIMEOUT", "string",
           _refuse("the HTTP server's timeouts are fixed here (docs/exporter.md); leave this option out")),
    Option("web-write-timeout", (), "DCGM_EXPORTER_WEB_WRITE_TIMEOUT", "string",
           _refuse("the HTTP server's timeouts are fixed here (docs/exporter.md); leave this option out")),
    Option("collect-interval", ("c",), "DCGM_EXPORTER_INTERVAL", "int", _interval_ms),
    Option("kubernetes", ("k",), "DCGM_EXPORTER_KUBERNETES", "bool", _switch("--kubernetes")),
    Option("use-old-namespace", ("o",), "DCGM_EXPORTER_USE_OLD_NAMESPACE", "bool",
           _refuse_when_on("the 1.x metric names (dcgm_*) are not published; only DCGM_FI_*")),
    Option("cpu-devices", ("p",), "DCGM_EXPORTER_CPU_DEVICES_STR", "string",
           _refuse_when_set("CPU entities are not published (NVML: GPUs only)", allowed=frozenset({"f"}))),
    Option("configmap-data", ("m",), "DCGM_EXPORTER_CONFIGMAP_DATA", "string",
           _refuse_when_set("counters are read from a file: mount the ConfigMap and pass -f FILE",
                            allowed=frozenset({"", "none"}))),
    Option("remote-hostengine-info", ("r",), "DCGM_REMOTE_HOSTENGINE_INFO", "string", _refuse(NO_HOST_ENGINE)),
    Option("kubernetes-enable-pod-labels", (), "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_LABELS", "bool",
           _refuse_when_on(NO_API_SERVER)),
    Option("kubernetes-enable-pod-uid", (), "DCGM_EXPORTER_KUBERNETES_ENABLE_POD_UID", "bool",
           _refuse_when_on(NO_API_SERVER)),
    Option("kubernetes-gpu-id-type", (), "DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE", "string", _gpu_id_type),
    Option("kubernetes-pod-label-allowlist-regex", (), "DCGM_EXPORTER_KUBERNETES_POD_LABEL_ALLOWLIST_REGEX",
           "string", _refuse_when_set(NO_API_SERVER)),
    Option("devices", ("d",), "DCGM_EXPORTER_DEVICES_STR", "string", _devices),
    Option("no-hostname", ("n",), "DCGM_EXPORTER_NO_HOSTNAME", "bool",
           lambda v: ["--hostname-label=none"] if v == "true" else []),
    Option("switch-devices", ("s",), "DCGM_EXPORTER_OTHER_DEVICES_STR", "string",
           _refuse_when_set("NVSwitch entities are not published (NVML: GPUs only)", allowed=frozenset({"f"}))),
    Option("fake-gpus", (), "DCGM_EXPORTER_USE_FAKE_GPUS", "bool",
           _refuse_when_on("no fake GPUs here: use --backend sim --scenario FILE")),
    Option("web-config-file", (), "DCGM_EXPORTER_WEB_CONFIG_FILE", "string",
           lambda v: [f"--web-config={v}"] if v else []),
    Option("xid-count-window-size", ("x",), "DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE", "int",
           _window_ms("--xid-count-window-size")),
    Option("replace-blanks-in-model-name", ("rbmn",), "DCGM_EXPORTER_REPLACE_BLANKS_IN_MODEL_NAME", "bool",
           _refuse_when_on("modelName is published as NVML reports it")),
    Option("debug", (), "DCGM_EXPORTER_DEBUG", "bool", lambda v: ["--log-level=debug"] if v == "true" else []),
    Option("clock-events-count-window-size", (), "DCGM_EXPORTER_CLOCK_EVENTS_COUNT_WINDOW_SIZE", "int",
           _window_ms("--clock-events-count-window-size")),
    Option("enable-dcgm-log", (), "DCGM_EXPORTER_ENABLE_DCGM_LOG", "bool",
           _refuse_when_on("there is no DCGM library to log; use --log-level debug")),
    Option("dcgm-log-level", (), "DCGM_EXPORTER_DCGM_LOG_LEVEL", "string", _ignored),
    Option("log-format", (), "DCGM_EXPORTER_LOG_FORMAT", "string", _log_format),
    Option("pod-resources-kubelet-socket", (), "DCGM_POD_RESOURCES_KUBELET_SOCKET", "string",
           _to("--pod-resources-socket")),
    Option("hpc-job-mapping-dir", (), "DCGM_HPC_JOB_MAPPING_DIR", "string",
           _refuse_when_set("HPC job mapping is not supported; devices are attributed to pods only")),
    Option("container-labels", (), "DCGM_EXPORTER_CONTAINER_LABELS", "bool",
           _refuse_when_on("container runtime labels are not read; pod-resources gives the container name")),
    Option("container-runtime-socket", (), "DCGM_CONTAINER_RUNTIME_SOCKET", "string",
           _refuse_when_set("container runtime labels are not read; pod-resources gives the container name")),
    Option("nvidia-resource-names", (), "NVIDIA_RESOURCE_NAMES", "string",
           lambda v: [f"--nvidia-resource-names={v}"] if v else []),
    Option("kubernetes-virtual-gpus", (), "KUBERNETES_VIRTUAL_GPUS", "bool",
           lambda v: ["--kubernetes-virtual-gpus"] if v == "true" else []),
    Option("dump-enabled", (), "DCGM_EXPORTER_DUMP_ENABLED", "bool",
           _refuse_when_on("debug dumps are not written; use --once to see one collection")),
    Option("dump-directory", (), "DCGM_EXPORTER_DUMP_DIRECTORY", "string", _ignored),
    Option("dump-retention", (), "DCGM_EXPORTER_DUMP_RETENTION", "int", _ignored),
    Option("dump-compression", (), "DCGM_EXPORTER_DUMP_COMPRESSION", "bool", _ignored),
    Option("kubernetes-enable-dra", (), "KUBERNETES_ENABLE_DRA", "bool", _dra),
    Option("disable-startup-validate", (), "DISABLE_STARTUP_VALIDATE", "bool", _ignored),
    Option("enable-gpu-bind-unbind-watch", (), "DCGM_EXPORTER_ENABLE_GPU_BIND_UNBIND_WATCH", "bool",
           _refuse_when_on("GPU bind/unbind is not watched; restart the exporter after changing GPUs")),
    Option("gpu-bind-unbind-poll-interval", (), "DCGM_EXPORTER_GPU_BIND_UNBIND_POLL_INTERVAL", "string", _ignored),
    Option("enable-pprof", (), "DCGM_EXPORTER_ENABLE_PPROF", "bool",
           _refuse_when_on("there are no /debug/pprof endpoints (a Python process)")),
    Option("web-systemd-socket", (), "DCGM_EXPORTER_SYSTEMD_SOCKET", "bool",
           _refuse_when_on("systemd socket activation is not supported; use -a HOST:PORT")),
)  # fmt: skip

OWN_EQUIVALENT = {
    "collectors": "--collectors",
    "address": "--listen",
    "collect-interval": "--interval",
    "kubernetes": "--kubernetes",
    "web-config-file": "--web-config",
    "pod-resources-kubelet-socket": "--pod-resources-socket",
    "debug": "--log-level",
    "log-format": "--log-format",
    "no-hostname": "--hostname-label",
    "devices": "--mig-series",
    "kubernetes-enable-dra": "--kubernetes-enable-dra",
    "kubernetes-virtual-gpus": "--kubernetes-virtual-gpus",
    "nvidia-resource-names": "--nvidia-resource-names",
}
"""A dcgm-exporter option whose variable is not read when our own flag for it is on the command line."""

_BY_NAME: dict[str, Option] = {}
for _opt in OPTIONS:
    for _n in (_opt.name, *_opt.aliases):
        _BY_NAME[_n] = _opt


def _parse_bool(value: str, where: str) -> str:
    if value in BOOL_TRUE:
        return "true"
    if value in BOOL_FALSE:
        return "false"
    raise ConfigError(f"{where}: {value!r} is not a boolean (true or false)")


def _checked(opt: Option, value: str, where: str) -> list[str]:
    if opt.kind == "bool":
        value = _parse_bool(value, where)
    elif opt.kind == "int":
        try:
            number = int(value, 10)
        except ValueError:
            raise ConfigError(f"{where}: {value!r} is not a whole number") from None
        value = str(number)
    try:
        return opt.mapper(value)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _split(arg: str) -> tuple[str, str | None] | None:
    """``-a``, ``--address``, ``-address=:9400`` → (name, inline value); None for anything else."""
    if not arg.startswith("-") or arg in ("-", "--"):
        return None
    name, eq, value = arg.lstrip("-").partition("=")
    return name, (value if eq else None)


@dataclass(frozen=True)
class Translated:
    argv: list[str]
    """Our own flags only: what argparse parses."""
    given: frozenset[str]
    """dcgm-exporter option names given as flags (their variables are then not read)."""


def translate_flags(argv: Sequence[str]) -> Translated:
    out: list[str] = []
    given: set[str] = set()
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            out.extend(args[i - 1 :])
            break
        split = _split(arg)
        opt = _BY_NAME.get(split[0]) if split else None
        if split is None or opt is None:
            out.append(arg)
            continue
        name, inline = split
        where = ("-" if len(name) == 1 else "--") + name
        if opt.kind == "bool":
            value = "true" if inline is None else inline
        elif inline is not None:
            value = inline
        elif i < len(args):
            value = args[i]
            i += 1
        else:
            raise ConfigError(f"{where}: needs a value")
        given.add(opt.name)
        out.extend(_checked(opt, value, where))
    return Translated(argv=out, given=frozenset(given))


def _own_flags_given(argv: Sequence[str]) -> set[str]:
    return {"--" + split[0] for arg in argv if arg.startswith("--") and (split := _split(arg))}


def translate(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """dcgm-exporter's flags and variables → our own argv (variables first, so flags win)."""
    env = os.environ if environ is None else environ
    flags = translate_flags(argv)
    own = _own_flags_given(flags.argv)
    from_env: list[str] = []
    for opt in OPTIONS:
        value = env.get(opt.env, "")
        if not value or opt.name in flags.given or OWN_EQUIVALENT.get(opt.name, f"--{opt.name}") in own:
            continue
        from_env.extend(_checked(opt, value, f"${opt.env}"))
    return [*from_env, *flags.argv]
