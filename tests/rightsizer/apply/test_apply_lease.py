"""One apply at a time through a coordination.k8s.io Lease, and apply under the RBAC of deploy/."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from rightsizer.apply.applier import Applier, ApplyError
from rightsizer.apply.lease import LEASE_NAME
from rightsizer.clients.kube import Kube
from tests.support.kubedouble import KubeDouble, MigManagerSettings
from tests.support.rightsizer.apply_support import FAST, GOOD, Change, make_plan, seed_node

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
LEASED = dataclasses.replace(FAST, lease_duration_s=3)


def lease(kube: KubeDouble) -> dict:  # type: ignore[type-arg]
    found = kube.store.get("coordination.k8s.io/leases", "gpu-operator", LEASE_NAME)
    assert found is not None
    return found


@pytest.mark.slow
def test_a_second_run_refuses_while_the_first_holds_the_lease():
    with KubeDouble(mig_manager=MigManagerSettings(apply_s=1.0)) as kube:
        seed_node(kube, "gpu-a")
        plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD)])
        first: list = []  # type: ignore[type-arg]
        t = threading.Thread(
            target=lambda: first.append(Applier(Kube(kube.api_client()), plan, LEASED).run()), daemon=True
        )
        t.start()
        kube.wait_for(lambda: bool(kube.actions(verb="evict")), timeout=10, what="the first run evicting")
        holder = lease(kube)["spec"]["holderIdentity"]
        with pytest.raises(ApplyError) as err:
            Applier(Kube(kube.api_client()), plan, LEASED).run()
        assert f"another apply is running: Lease gpu-operator/{LEASE_NAME} is held by {holder}" in str(
            err.value
        )
        t.join(timeout=30)
        assert [o.result for o in first[0].outcomes] == ["applied"]
        assert len(kube.actions(verb="evict")) == 2  # each pod once: the second run touched nothing
        assert lease(kube)["spec"].get("holderIdentity") is None  # given back
        again = Applier(Kube(kube.api_client()), plan, LEASED).run()
        assert [o.result for o in again.outcomes] == ["already-applied"]


def seed_lease(kube: KubeDouble, *, renew_time: str, duration_s: int) -> None:
    kube.store.put(
        "coordination.k8s.io/leases",
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": LEASE_NAME, "namespace": "gpu-operator"},
            "spec": {
                "holderIdentity": "killed-run",
                "leaseDurationSeconds": duration_s,
                "renewTime": renew_time,
                "leaseTransitions": 4,
            },
        },
        event="ADDED",
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "renew_time",
    ["2026-01-01T00:00:00.000000Z", "2099-01-01T00:00:00.000000Z"],
    ids=["renewed-long-ago", "holder-clock-far-ahead"],
)
def test_a_lease_not_renewed_in_time_is_taken_over(renew_time):
    """Expiry is judged from when this run saw the record, whatever renewTime says (client-go): an
    old renewTime is not taken at once (its holder's clock may be behind), a future one not refused."""
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a")
        seed_lease(kube, renew_time=renew_time, duration_s=1)
        lines: list[str] = []
        started = time.monotonic()
        report = Applier(
            Kube(kube.api_client()),
            make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]),
            LEASED,
            progress=lambda node, message: lines.append(message),
        ).run()
        assert time.monotonic() - started >= 1.0  # watched for the Lease's duration first
        assert report.ok
        assert lease(kube)["spec"]["leaseTransitions"] == 5
        assert any("held by killed-run: watching it for up to 1s" in m for m in lines)


@pytest.mark.slow
def test_a_lease_renewed_while_watched_is_refused_even_with_an_old_renew_time():
    with KubeDouble() as kube:
        seed_node(kube, "gpu-a")
        seed_lease(kube, renew_time="2026-01-01T00:00:00.000000Z", duration_s=2)

        def renew() -> None:  # the holder is alive; its clock is just far behind ours
            found = lease(kube)
            found["spec"]["renewTime"] = "2026-01-01T00:00:01.000000Z"
            kube.store.put("coordination.k8s.io/leases", found, event="MODIFIED")

        timer = threading.Timer(0.5, renew)
        timer.start()
        with pytest.raises(ApplyError) as err:
            Applier(Kube(kube.api_client()), make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), LEASED).run()
        timer.join()
        assert "renewed while this run watched it" in str(err.value)
        assert kube.annotations("gpu-a").get("gpupilot.io/step") is None  # nothing touched


@pytest.mark.slow
def test_the_lease_is_renewed_during_a_long_run():
    with KubeDouble(mig_manager=MigManagerSettings(apply_s=2.5)) as kube:
        seed_node(kube, "gpu-a", pods=0)
        settings = dataclasses.replace(LEASED, lease_duration_s=1)
        report = Applier(
            Kube(kube.api_client()), make_plan([Change("gpu-a", "all-1g.10gb", GOOD)]), settings
        ).run()
        assert report.ok
        renewals = [a for a in kube.actions(verb="update", resource="leases")]
        assert len(renewals) >= 4  # every ~0.33 s during 2.5 s, then the release


@pytest.mark.slow
def test_apply_runs_with_nothing_but_the_rightsizer_rbac_of_deploy():
    with KubeDouble() as kube:
        assert kube.load_rbac(DEPLOY / "rightsizer") > 0
        token = kube.add_service_account("gpupilot", "gpupilot-rightsizer")
        seed_node(kube, "gpu-a")
        plan = make_plan([Change("gpu-a", "all-1g.10gb", GOOD)])
        lines: list[str] = []
        report = Applier(
            Kube(kube.api_client(token)), plan, LEASED, progress=lambda n, m: lines.append(m)
        ).run()
        assert [o.result for o in report.outcomes] == ["applied"]
        # the node's own MIG profile list is read (none here): no 403, nothing said about it
        assert not any("HTTP 403" in m for m in lines), lines
        assert kube.configmap("gpupilot-mig-parted-config") is not None
        assert any(e["reason"] == "MigReconfigured" for e in kube.events(involving="gpu-a"))
        # and it is enforced: the same token cannot delete a pod or touch ConfigMaps elsewhere
        other = Kube(kube.api_client(token))
        with pytest.raises(Exception) as err:
            other.create_configmap("default", "x", {"a": "b"})
        assert "HTTP 403" in str(err.value)


def test_a_renewal_answered_409_forever_gives_up_after_a_few_rereads():
    """A server that answers every Lease update with 409 while the Lease still names us: the renewal
    re-reads and retries a bounded number of times, then waits for the next one (it used to recurse
    until the interpreter's limit)."""
    from rightsizer.apply import lease as lease_mod  # noqa: PLC0415
    from rightsizer.clients.kube import ConflictError  # noqa: PLC0415

    ours = {"metadata": {"name": LEASE_NAME}, "spec": {"holderIdentity": "me", "leaseDurationSeconds": 3}}

    class Conflicting:
        updates = 0

        def replace_lease(self, body: dict) -> dict:  # type: ignore[type-arg]
            Conflicting.updates += 1
            raise ConflictError("409 Conflict")

        def get_lease(self, namespace: str, name: str) -> dict:  # type: ignore[type-arg]
            return ours

    held = lease_mod.ApplyLease(Conflicting(), "gpu-operator", identity="me", duration_s=3)  # type: ignore[arg-type]
    held._current = ours
    assert held.renew() is True and not held.lost.is_set()
    assert Conflicting.updates == lease_mod.RENEW_CONFLICT_RETRIES + 1


def test_a_renewal_that_raises_anything_is_counted_and_the_next_one_comes():
    """The renewal thread outlives an exception nobody foresaw (here a KeyError from an odd Lease):
    one line, counted, and the Lease is renewed again at the next period."""
    from rightsizer.apply.lease import ApplyLease  # noqa: PLC0415

    with KubeDouble() as kube:
        failures: list[BaseException] = []
        held = ApplyLease(Kube(kube.api_client()), "gpu-operator", duration_s=1, on_failure=failures.append)
        held.acquire()
        real, calls = held.renew, {"n": 0}

        def odd() -> bool:
            calls["n"] += 1
            if calls["n"] == 1:
                raise KeyError("spec")
            return real()

        held.renew = odd  # type: ignore[method-assign]
        try:
            deadline = time.monotonic() + 5
            while calls["n"] < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            held.stop_renewing()
        assert calls["n"] >= 3 and [type(f) for f in failures] == [KeyError]
        assert held.held() and not held.lost.is_set()
