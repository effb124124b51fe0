"""Every command of each install, run for real: one list per install, used for fresh venvs
(``make extras``, :mod:`devkit.extras`) and for the built images (``make images``, :mod:`devkit.images`).

An install is what ``pip install 'gpupilot[EXTRA]'`` gives (``base``: no extra). Its calls run each
console script's subcommands with real inputs, not ``--help`` only: ``plan``, ``report`` and
``replay-hpa`` against a real Prometheus over a day of the demo fleet's history, the same commands
against a closed port (their one-line error), ``explain-hpa --state`` and ``convert-config``
offline, ``serve`` of the rightsizer until its first report answers on ``/report/``, the adapter's
``serve`` until the metrics API answers, the exporter's ``--backend nvml --once`` to its no-GPU line.
A command that cannot work in an install (the simulator without its extra, any command without its
service's extra) must end with its one line naming the extra.

Arguments may hold placeholders, filled in where the call runs: ``{work}`` (a scratch folder,
``{work}/examples`` a copy of ``examples/``), ``{prom}`` (the Prometheus), ``{closed}`` (a URL whose
port nothing listens on) and ``{port}`` (a free port, fresh for each call). :data:`FILES` are written
into ``{work}`` before each call.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from devkit.process import free_port

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = "{work}/examples/fleet-demo.yaml"
HISTORY_DAYS = 1
NO_GPU = "gpupilot-exporter: backend nvml unavailable:"
TRACEBACK = "Traceback (most recent call last)"
RETRY_NOISE = "Retrying (Retry("
SERVE_TIMEOUT_S = 180.0
"""A server call's answer: the rightsizer's first report (a plan and a report of a day of 8 nodes)
takes 20 s on two busy cores; the rest answer in a second or two."""
RUN_TIMEOUT_S = 180.0
# buildah adds its own lines after a command that failed in a container
FOREIGN_LINES = ("Error: exit status", "subprocess exited with status", "error running container")


@dataclass(frozen=True)
class Call:
    """One command line and what it must do."""

    argv: tuple[str, ...]
    code: int = 0
    says: str = ""
    """Text the output (stdout and stderr) must hold; with ``serve``, the answer's body."""
    error: str = ""
    """A failure: stderr is this one line (its start), no traceback."""
    serve: str = ""
    """A server: this URL (placeholders filled) must answer 200 before it is stopped with SIGTERM."""
    prometheus: bool = False
    """Needs ``{prom}``: the Prometheus over the history."""

    @property
    def title(self) -> str:
        return " ".join(self.argv)


EXPORTER = "gpupilot-exporter"
ADAPTER = "gpupilot-adapter"
RIGHTSIZER = "gpupilot-rightsizer"
HPA = ("-f", "{work}/examples/hpa-llm-inference.yaml")
CHAT_HPA = ("-f", "{work}/examples/hpa-chat-inference.yaml")
CHAT_BOUND = ("--bound", 'inference_queue_wait_seconds{{quantile="0.95"}} <= 2')
SIM = ("--backend", "sim", "--scenario", SCENARIO)


def without_extra(argv: tuple[str, ...], extras: str) -> Call:
    """A command of an install without ``extras``: exit 2, one line naming them (any module)."""
    prog = argv[0]
    whose = " and the ".join(f"{e}'s" for e in extras.split(","))
    return Call(
        argv,
        code=2,
        error=f"{prog}: the {whose} dependencies are not installed (no module ",
        says=f"install them with: pip install 'gpupilot[{extras}]'",
    )


BASE_CALLS = (
    *(Call((prog, "--version"), says=f"{prog} ") for prog in (EXPORTER, ADAPTER, RIGHTSIZER)),
    without_extra((EXPORTER, "--help"), "exporter"),
    without_extra((EXPORTER, "--backend", "nvml", "--once"), "exporter"),
    without_extra((EXPORTER, *SIM, "--once"), "exporter,simulator"),
    without_extra((EXPORTER, "backfill", "--help"), "exporter,simulator"),
    without_extra((ADAPTER, "--help"), "adapter"),
    without_extra((ADAPTER, "explain-hpa", *HPA, "--state", "{work}/examples/hpa-state.yaml"), "adapter"),
    without_extra((ADAPTER, "serve", "--help"), "adapter"),
    Call((RIGHTSIZER, "--help"), says="usage: gpupilot-rightsizer"),  # its commands load when run
    without_extra((RIGHTSIZER, "plan", "--prometheus-url", "{closed}"), "rightsizer"),
    without_extra(
        (RIGHTSIZER, "validate", "{work}/examples/mig-configs/seed-002-mig-parted-config.yaml"), "rightsizer"
    ),
    without_extra((RIGHTSIZER, "serve", "--config", "{work}/serve.yaml"), "rightsizer"),
)

EXPORTER_CALLS = (
    Call((EXPORTER, "--version"), says=f"{EXPORTER} "),
    Call((EXPORTER, "--help"), says="usage: gpupilot-exporter"),
    Call((EXPORTER, "--backend", "nvml", "--once"), code=1, error=NO_GPU),
    Call(
        (EXPORTER, *SIM, "--once"),
        code=2,
        error=f"{EXPORTER}: --backend sim needs the simulator (missing module 'numpy'): "
        "pip install 'gpupilot[simulator]'",
    ),
    Call(
        (EXPORTER, "backfill", "--help"),
        code=2,
        error=f"{EXPORTER}: {EXPORTER} backfill needs the simulator (missing module 'numpy'): "
        "pip install 'gpupilot[simulator]'",
    ),
)

SIMULATOR_CALLS = (
    Call((EXPORTER, *SIM, "--once"), says="DCGM_FI_DEV_GPU_UTIL"),
    Call(
        (EXPORTER, *SIM, "--listen", "127.0.0.1:{port}", "--interval", "1"),
        serve="http://127.0.0.1:{port}/metrics",
        says="DCGM_FI_DEV_GPU_UTIL",
    ),
    Call(
        (EXPORTER, "cluster", "--scenario", SCENARIO, "--listen", "127.0.0.1:{port}"),
        serve="http://127.0.0.1:{port}/metrics",
        says="kube_pod_info",
    ),
    Call(
        (EXPORTER, "backfill", "--scenario", SCENARIO, "--days", "1", "--step", "5m"),
        code=2,
        error=f"{EXPORTER} backfill: error: the following arguments are required: --out",
    ),
    Call(
        (
            EXPORTER,
            "backfill",
            "--scenario",
            SCENARIO,
            "--days",
            "1",
            "--step",
            "5m",
            "--out",
            "{work}/blocks",
        ),
        says="samples of",
    ),
    Call((EXPORTER, "--backend", "nvml", "--once"), code=1, error=NO_GPU),
)

UNREACHABLE = "cannot reach Prometheus at {closed}: connection refused"

ADAPTER_CALLS = (
    Call((ADAPTER, "--version"), says=f"{ADAPTER} "),
    Call((ADAPTER, "--help"), says="usage: gpupilot-adapter"),
    Call(
        (ADAPTER, "explain-hpa", *HPA, "--state", "{work}/examples/hpa-state.yaml"),
        says="pods, values and replicas from",
    ),
    Call(
        (ADAPTER, "explain-hpa", *HPA, "--prometheus-url", "{closed}"),
        code=1,
        error=f"{ADAPTER} explain-hpa: {UNREACHABLE}",
    ),
    Call(
        (ADAPTER, "replay-hpa", *HPA, "--prometheus-url", "{prom}", "--since", "6h"),
        says="GPU-hours",
        prometheus=True,
    ),
    Call(
        (
            ADAPTER,
            "replay-hpa",
            *HPA,
            "--prometheus-url",
            "{prom}",
            "--since",
            "6h",
            "--chart",
            "{work}/replay.png",
        ),
        says="wrote {work}/replay.png",
        prometheus=True,
    ),
    Call(
        (
            ADAPTER,
            "recommend-hpa",
            *CHAT_HPA,
            "--prometheus-url",
            "{prom}",
            *CHAT_BOUND,
            "--since",
            "1d",
            "--held-out",
            "1d",
        ),
        code=2,
        error=f"{ADAPTER} recommend-hpa: --since 1d is not longer than --held-out 1d",
    ),
    Call(
        (ADAPTER, "recommend-hpa", *CHAT_HPA, "--prometheus-url", "{closed}", *CHAT_BOUND),
        code=1,
        error=f"{ADAPTER} recommend-hpa: {UNREACHABLE}",
    ),
    Call((ADAPTER, "convert-config", "{work}/prometheus-adapter.yaml"), says="name: gpu_utilization"),
    Call((ADAPTER, "convert-config", "{work}/missing.yaml"), code=2, error=f"{ADAPTER} convert-config:"),
    Call(
        (ADAPTER, "check-apiservices", "--kubeconfig", "{work}/kubeconfig"),
        code=2,
        says="check-apiservices: cannot tell: reading APIService v1beta2.custom.metrics.k8s.io failed: "
        "connection refused",
    ),
    Call(
        (
            ADAPTER,
            "serve",
            "--prometheus-url",
            "{prom}",
            "--self-signed-cert-dir",
            "{work}/certs",
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            "{port}",
            "--authorization-mode",
            "none",
            "--pod-source",
            "prometheus",
        ),
        serve="https://127.0.0.1:{port}/apis/custom.metrics.k8s.io/v1beta2",
        says="pods/DCGM_FI_DEV_GPU_UTIL",
        prometheus=True,
    ),
)

RIGHTSIZER_CALLS = (
    Call((RIGHTSIZER, "--version"), says=f"{RIGHTSIZER} "),
    Call((RIGHTSIZER, "--help"), says="usage: gpupilot-rightsizer"),
    Call((RIGHTSIZER, "validate", "{work}/examples/mig-configs/seed-002-mig-parted-config.yaml"), says="OK:"),
    Call(
        (RIGHTSIZER, "validate", "{work}/examples/time-slicing/seed-002-time-slicing-config.yaml"), says="OK:"
    ),
    Call(
        (RIGHTSIZER, "plan", "--prometheus-url", "{closed}", "--timeout", "2", "--quiet"),
        code=1,
        error=f"error: {UNREACHABLE}",
    ),
    Call(
        (
            RIGHTSIZER,
            "report",
            "--prometheus-url",
            "{closed}",
            "--out",
            "{work}/r0",
            "--timeout",
            "2",
            "--quiet",
        ),
        code=1,
        error=f"error: {UNREACHABLE}",
    ),
    Call(
        (
            RIGHTSIZER,
            "plan",
            "--prometheus-url",
            "{prom}",
            "--window",
            "1d",
            "--out",
            "{work}/plan.json",
            "--quiet",
        ),
        says="wrote {work}/plan.json",
        prometheus=True,
    ),
    Call(
        (
            RIGHTSIZER,
            "report",
            "--prometheus-url",
            "{prom}",
            "--window",
            "1d",
            "--plan",
            "{work}/plan.json",
            "--out",
            "{work}/report",
            "--quiet",
        ),
        says="wrote {work}/report/report.html",
        prometheus=True,
    ),
    Call(
        (RIGHTSIZER, "apply", "--plan", "{work}/plan.json", "--dry-run", "--kubeconfig", "{work}/kubeconfig"),
        code=1,
        error="error: list clusterpolicies.nvidia.com: cannot reach the API server: connection refused;",
        prometheus=True,  # the plan above
    ),
    Call(
        (
            RIGHTSIZER,
            "drain",
            "--namespace",
            "gpupilot",
            "--configmap",
            "gpupilot-rightsizer",
            "--lease-namespace",
            "gpu-operator",
            "--kubeconfig",
            "{work}/kubeconfig",
        ),
        code=1,
        error="error: configmap gpupilot/gpupilot-rightsizer: cannot reach the API server: connection refused;",
    ),
    Call(
        (RIGHTSIZER, "serve", "--config", "{work}/serve.yaml", "--check"),
        says="plan: next run",
        prometheus=True,
    ),
    Call(
        (RIGHTSIZER, "serve", "--config", "{work}/serve.yaml"),
        serve="http://127.0.0.1:{port}/report/",
        says="<html",
        prometheus=True,
    ),
)

CALLS: dict[str, tuple[Call, ...]] = {
    "base": BASE_CALLS,
    "exporter": EXPORTER_CALLS,
    "exporter,simulator": SIMULATOR_CALLS,
    "adapter": ADAPTER_CALLS,
    "rightsizer": RIGHTSIZER_CALLS,
}
"""Each install (its extras, comma-separated; ``base``: none) and its calls."""

FILES: dict[str, str] = {
    # rightsizer serve: a first report right after its first plan, into a fresh state folder
    "serve.yaml": (
        "prometheus_url: {prom}\n"
        "timezone: UTC\n"
        "listen: 127.0.0.1:{port}\n"
        "state_dir: {work}/serve-state-{port}\n"
        'report: {{schedule: "mon 06:00", window: 1d}}\n'
        "plan: {{every: 6h, window: 1d}}\n"
    ),
    # convert-config: NVIDIA's DCGM rule in prometheus-adapter's format
    "prometheus-adapter.yaml": (
        "rules:\n"
        '  - seriesQuery: \'DCGM_FI_DEV_GPU_UTIL{{exported_namespace!="",exported_pod!=""}}\'\n'
        "    resources:\n"
        "      overrides:\n"
        "        exported_namespace: {{resource: namespace}}\n"
        "        exported_pod: {{resource: pod}}\n"
        '    name: {{matches: "^DCGM_FI_DEV_GPU_UTIL$", as: "gpu_utilization"}}\n'
        "    metricsQuery: avg by (<<.GroupBy>>) (<<.Series>>{{<<.LabelMatchers>>}})\n"
    ),
    # check-apiservices: an API server nothing answers for
    "kubeconfig": (
        "apiVersion: v1\nkind: Config\ncurrent-context: walk\n"
        'clusters: [{{name: walk, cluster: {{server: "https://{closed_host}", insecure-skip-tls-verify: true}}}}]\n'
        "users: [{{name: walk, user: {{token: walk}}}}]\n"
        "contexts: [{{name: walk, context: {{cluster: walk, user: walk}}}}]\n"
    ),
}


@dataclass
class Place:
    """Where the calls run: the values of the placeholders there."""

    work: str
    prom: str = ""
    closed_port: int = field(default_factory=free_port)
    port: int = 0

    def values(self) -> dict[str, str]:
        return {
            "work": self.work,
            "prom": self.prom,
            "closed": f"http://127.0.0.1:{self.closed_port}",
            "closed_host": f"127.0.0.1:{self.closed_port}",
            "port": str(self.port),
        }

    def fill(self, text: str) -> str:
        return text.format(**self.values())


@dataclass(frozen=True)
class Outcome:
    call: Call
    command: str
    ok: bool
    seconds: float
    why: str = ""


def prepare(host_work: Path) -> None:
    """``examples/`` into the scratch folder (the calls' inputs)."""
    host_work.mkdir(parents=True, exist_ok=True)
    shutil.copytree(ROOT / "examples", host_work / "examples", dirs_exist_ok=True)


def write_files(host_work: Path, place: Place) -> None:
    for name, template in FILES.items():
        (host_work / name).write_text(place.fill(template))


def lines_of(stderr: str) -> list[str]:
    return [ln for ln in stderr.strip().splitlines() if ln.strip() and not ln.startswith(FOREIGN_LINES)]


def judge(call: Call, place: Place, code: int, stdout: str, stderr: str) -> str:
    """Why the call's result is wrong ("" when it is right)."""
    if TRACEBACK in stdout + stderr:
        return f"a traceback: {lines_of(stderr)[-1:] or stderr[-200:]}"
    if RETRY_NOISE in stdout + stderr:
        return "urllib3's retry warnings in the output (before the command's own line)"
    if code != call.code:
        last = (lines_of(stderr) or stdout.strip().splitlines() or ["(no output)"])[-1]
        return f"exit {code}, expected {call.code}: {last}"
    if call.error:
        lines = lines_of(stderr)
        if len(lines) != 1 or not lines[0].startswith(place.fill(call.error)):
            shown = " | ".join(lines[-3:]) if lines else "(nothing on stderr)"
            return f"stderr is not the one line {place.fill(call.error)!r}...: {shown}"
    if call.says and place.fill(call.says) not in stdout + stderr:
        tail = " | ".join((stdout.strip().splitlines() + lines_of(stderr))[-2:]) or "(no output)"
        return f"the output does not hold {place.fill(call.says)!r}: {tail}"
    return ""


def fetch(url: str, *, timeout: float = 5.0) -> tuple[int, str]:
    context = ssl._create_unverified_context() if url.startswith("https:") else None  # noqa: S323
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as res:
            return res.status, res.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (OSError, ValueError):
        return 0, ""


Runner = Callable[[Sequence[str]], list[str]]
"""The command line that runs argv where the calls run (a venv's PATH, ``buildah run``)."""


def run_call(
    call: Call,
    place: Place,
    *,
    wrap: Runner,
    env: Mapping[str, str],
    host_work: Path,
    output_files: tuple[Path, Path] | None = None,
) -> Outcome:
    """Run ``call`` where ``wrap`` says. ``output_files``: where the command's stdout and stderr land
    when ``wrap`` sends them to files (read before what came through the pipes)."""
    place.port = free_port()
    write_files(host_work, place)
    for path in output_files or ():
        path.unlink(missing_ok=True)
    argv = [place.fill(a) for a in call.argv]
    command = " ".join(argv)
    started = time.monotonic()

    def captured(out: str, err: str) -> tuple[str, str]:
        if output_files is None:
            return out, err
        out_file, err_file = (p.read_text(errors="replace") if p.is_file() else "" for p in output_files)
        return out_file + out, err_file + err

    if call.serve:
        why = _serve(call, place, wrap(argv), env, captured)
    else:
        try:
            res = subprocess.run(
                wrap(argv), env=dict(env), capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
            )
            why = judge(call, place, res.returncode, *captured(res.stdout, res.stderr))
        except subprocess.TimeoutExpired:
            why = f"no answer within {RUN_TIMEOUT_S:.0f} s"
    return Outcome(call, command, not why, time.monotonic() - started, why)


def _serve(
    call: Call,
    place: Place,
    cmd: list[str],
    env: Mapping[str, str],
    captured: Callable[[str, str], tuple[str, str]],
) -> str:
    """Start, wait for the URL to answer 200 with ``says``, SIGTERM, expect a clean exit."""
    url, says = place.fill(call.serve), place.fill(call.says)
    proc = subprocess.Popen(
        cmd,
        env=dict(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    status, body = 0, ""
    while time.monotonic() < deadline and proc.poll() is None:
        status, body = fetch(url)
        if status == 200 and says in body:
            break
        time.sleep(0.5)
    answered = status == 200 and says in body
    if proc.poll() is None:
        terminate(proc.pid)
    try:
        output, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return f"{url}: still running 30 s after SIGTERM"
    output = "".join(captured(output, ""))
    last = (lines_of(output) or ["(no output)"])[-1]
    if TRACEBACK in output:
        return f"a traceback: {last}"
    if not answered:
        return f"{url} answered {status or 'nothing'} within {SERVE_TIMEOUT_S:.0f} s: {last}"
    if proc.returncode not in (0, -signal.SIGTERM):
        return f"exit {proc.returncode} after SIGTERM: {last}"
    return ""


def terminate(pid: int) -> None:
    """SIGTERM to the command itself, as Kubernetes stops a container: the process ``pid``, or under
    ``buildah run`` the first process of its tree that is not buildah's (buildah, signalled, kills
    its command rather than passing the signal on)."""
    try:
        top = psutil.Process(pid)
        tree = [top, *top.children(recursive=True)]
        # buildah's own processes: "buildah", "memfd:buildah-chroot-runtime" / "-exec" (their name cut)
        target = next((p for p in tree if "buildah" not in p.name()), top)
        target.send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:  # it ended meanwhile
        pass


def history(out: Path, *, python: str) -> Path:
    """A day of the demo fleet's history as TSDB blocks (``gpupilot-exporter backfill``), for ``{prom}``."""
    data = out / "data"
    if not (data.is_dir() and any(data.iterdir())):
        subprocess.run(
            [
                python, "-m", "exporter", "backfill", "--scenario", str(ROOT / "examples" / "fleet-demo.yaml"),
                "--days", str(HISTORY_DAYS), "--step", "60s", "--out", str(data), "--quiet", "--jobs", "1",
            ],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
    return data


def summary(rows: Sequence[tuple[str, Outcome]]) -> list[str]:
    """One line per call: where, ok/FAILED, seconds, the command (and why it failed)."""
    out = []
    for where, o in rows:
        mark = "ok    " if o.ok else "FAILED"
        line = f"{mark} {where:<20} {o.seconds:6.1f} s  {o.command}"
        out.append(line if o.ok else f"{line}\n       {o.why}")
    return out


def shorten(text: str, work: str) -> str:
    return re.sub(re.escape(work), "{work}", text)
