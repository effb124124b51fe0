"""`gpupilot-rightsizer apply` on the command line: --dry-run prints kubectl commands that change
nothing (and, run, do what apply does), confirmation rules, progress and one-line errors."""

from __future__ import annotations

import io
import os
import subprocess

import pytest

from rightsizer.apply import protocol as proto
from rightsizer.cli import main
from tests.support.kubedouble import KubeDouble
from tests.support.rightsizer.apply_support import Change, break_node, make_plan, seed_node, write_plan

GOOD = {"3g.40gb": 1, "1g.10gb": 4}


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def setup(tmp_path):
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a")
        kube.add_node("gpu-b", mig_config="all-balanced")
        plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD), Change("gpu-b", "all-1g.10gb", GOOD)])
        plan_file = write_plan(plan, tmp_path / "plan.json")
        kubeconfig = kube.write_kubeconfig(tmp_path / "kubeconfig")
        args = [
            "apply",
            "--plan",
            str(plan_file),
            "--kubeconfig",
            str(kubeconfig),
            "--configmap-sync",
            "0",
            "--repoint-cluster-policy",
        ]
        yield kube, plan, args, kubeconfig


@pytest.mark.slow
def test_dry_run_changes_nothing_and_prints_runnable_kubectl_commands(setup, capsys):
    kube, plan, args, kubeconfig = setup
    before = kube.snapshot()
    assert main([*args, "--dry-run"]) == 0
    script = capsys.readouterr().out
    assert kube.snapshot() == before
    target = plan.nodes[0].config_name
    for expected in (
        "kubectl create --validate=false -f -",
        "kubectl patch clusterpolicies.nvidia.com cluster-policy --type=merge",
        "kubectl cordon gpu-a",
        "kubectl create --raw /api/v1/namespaces/ml/pods/gpu-a-infer-0/eviction -f -",
        f"kubectl label node gpu-a --overwrite nvidia.com/mig.config={target} nvidia.com/mig.config.state-",
        "kubectl uncordon gpu-a",
        "# node gpu-b: skip: changed since the plan",
    ):
        assert expected in script, expected
    assert "gpu-a-cpu-job" not in script  # only pods holding GPUs are evicted
    assert (
        script.index("kubectl cordon gpu-a") < script.index("/eviction") < script.index("kubectl label node")
    )
    # The script is exact: run by bash + kubectl against the same API, it reconfigures the node.
    done = subprocess.run(
        ["bash", "-c", script],
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == target
    assert kube.labels("gpu-a")[proto.STATE_LABEL] == "success"
    assert kube.annotations("gpu-a")[proto.ANN_STEP] == "done"
    assert not kube.node("gpu-a")["spec"].get("unschedulable")
    assert [a.name for a in kube.actions(verb="evict")] == ["gpu-a-infer-0", "gpu-a-infer-1"]
    # stamped with the time of its cordon, as apply does (serve's daily budget counts it)
    assert proto.cordoned_at(proto.view(kube.node("gpu-a"))) is not None


@pytest.mark.slow
def test_refuses_without_yes_when_stdin_is_not_a_terminal(setup, capsys, monkeypatch):
    kube, _, args, _ = setup
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    before = kube.snapshot()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "refusing to change the cluster without --yes" in err and len(err.strip().splitlines()) == 1
    assert kube.snapshot() == before


@pytest.mark.slow
def test_terminal_answer_no_changes_nothing_and_yes_applies(setup, capsys, monkeypatch):
    kube, _, args, _ = setup
    monkeypatch.setattr("sys.stdin", Tty("n\n"))
    before = kube.snapshot()
    assert main(args) == 1
    assert kube.snapshot() == before
    assert "Continue? [y/N]" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", Tty("y\n"))
    assert main(args) == 0
    assert kube.labels("gpu-a")[proto.STATE_LABEL] == "success"


@pytest.mark.slow
def test_yes_applies_with_progress_on_stderr_and_a_table_on_stdout(setup, capsys):
    kube, plan, args, _ = setup
    assert main([*args, "--yes", "--max-parallel", "2", "--timeout", "30s"]) == 0
    out, err = capsys.readouterr()
    assert "[gpu-a] cordoned" in err and "[gpu-a] evicted ml/gpu-a-infer-0" in err
    assert "[gpu-a] nvidia.com/mig.config.state=success" in err
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()[3:] if not line.startswith(" ")}
    assert rows == {"gpu-a": "applied", "gpu-b": "skipped"}
    assert f"plan {plan.plan_id}" in out
    assert kube.labels("gpu-a")[proto.CONFIG_LABEL] == plan.nodes[0].config_name


@pytest.mark.slow
def test_failed_node_makes_the_exit_code_non_zero(tmp_path, capsys):
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a", pods=0)
        break_node(kube, "gpu-a")
        plan = write_plan(make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), tmp_path / "p.json")
        cfg = kube.write_kubeconfig(tmp_path / "kc")
        code = main(
            [
                "apply",
                "--plan",
                str(plan),
                "--kubeconfig",
                str(cfg),
                "--configmap-sync",
                "0",
                "--yes",
                "--repoint-cluster-policy",
            ]
        )
        assert code == 1
        out = capsys.readouterr().out
        assert "rolled-back" in out and "mig.config.state=failed" in out


@pytest.mark.parametrize(
    ("extra", "content", "message"),
    [
        ([], "{not json", "(JSON syntax)"),
        ([], '{"schema": "gpupilot.plan/v1"}', ":1: plan_id: required, a string"),
        (["--kubeconfig", "/nonexistent/kc"], None, "/nonexistent/kc: kubeconfig file not found"),
    ],
)
def test_bad_inputs_are_one_line_errors(tmp_path, capsys, extra, content, message):
    plan = tmp_path / "plan.json"
    if content is None:
        write_plan(make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), plan)
    else:
        plan.write_text(content)
    code = main(["apply", "--plan", str(plan), *extra, "--dry-run"])
    err = capsys.readouterr().err
    assert code in (1, 2)
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow
def test_unreachable_api_server_is_one_line(tmp_path, capsys):
    plan = write_plan(make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), tmp_path / "plan.json")
    with KubeDouble() as kube:
        cfg = kube.write_kubeconfig(tmp_path / "kc")
    code = main(["apply", "--plan", str(plan), "--kubeconfig", str(cfg), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 1 and "cannot reach the API server: connection refused" in err
    assert len(err.strip().splitlines()) == 1 and "HTTPConnectionPool" not in err  # the cause, not the chain


def test_help_explains_every_flag(capsys):
    with pytest.raises(SystemExit):
        main(["apply", "--help"])
    text = capsys.readouterr().out
    for flag in (
        "--plan",
        "--kubeconfig",
        "--context",
        "--dry-run",
        "--yes",
        "--max-parallel",
        "--timeout",
        "--eviction-timeout",
        "--configmap",
        "--namespace",
        "--cluster-policy",
        "--configmap-sync",
        "--repoint-cluster-policy",
    ):
        assert flag in text


@pytest.mark.slow
def test_an_alias_bomb_in_the_mig_parted_configmap_is_one_line(setup, capsys):
    """A few hundred bytes of nested aliases in the ConfigMap the ClusterPolicy names (they ran
    `apply --dry-run` for 64 s, to 1.3 GiB, and printed a 34 MB script): refused by the bounded
    reader in one line naming the ConfigMap, quickly and without growing."""
    import resource  # noqa: PLC0415
    import time  # noqa: PLC0415

    from tests.common.test_yamlsafe import alias_bomb  # noqa: PLC0415

    kube, _, args, _ = setup
    name = kube.cluster_policy()["spec"]["migManager"]["config"]["name"]
    kube.add_configmap(name, data={"config.yaml": alias_bomb()})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    code = main([*args, "--dry-run"])
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert code != 0 and took < 10 and not out.strip()
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert f"ConfigMap gpu-operator/{name}" in line and "aliases expand to more than" in line, line
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB
