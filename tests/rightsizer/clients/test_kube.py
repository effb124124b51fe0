"""rightsizer.clients.kube: the typed error hierarchy (temporary vs permanent, wrapping the client's
exception) and kubeconfig loading, against the API double."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException

from rightsizer.clients import kube as k
from tests.support.kubedouble import KubeDouble


@pytest.fixture
def double():
    with KubeDouble() as d:
        d.add_node("gpu-a")
        yield d


@pytest.mark.slow
@pytest.mark.parametrize(
    ("status", "cls", "temporary"),
    [
        (409, k.ConflictError, True),
        (429, k.TooManyRequestsError, True),
        (500, k.TemporaryKubeError, True),
        (503, k.TemporaryKubeError, True),
        (404, k.NotFoundError, False),
        (403, k.PermanentKubeError, False),
        (422, k.PermanentKubeError, False),
    ],
)
def test_status_codes_map_to_typed_errors(double, status, cls, temporary):
    api = k.Kube(double.api_client())
    double.inject_fault(status, path_contains="/nodes/gpu-a", message="nope from the server")
    with pytest.raises(cls) as err:
        api.get_node("gpu-a")
    assert err.value.temporary is temporary and err.value.status == status
    assert "node gpu-a: HTTP" in str(err.value) and "nope from the server" in str(err.value)
    assert isinstance(err.value.__cause__, ApiException)


@pytest.mark.slow
def test_stale_resource_version_is_a_conflict(double):
    api = k.Kube(double.api_client())
    stale = api.get_node("gpu-a")["metadata"]["resourceVersion"]
    api.patch_node("gpu-a", {"metadata": {"labels": {"a": "1"}}})
    with pytest.raises(k.ConflictError):
        api.patch_node("gpu-a", {"metadata": {"resourceVersion": stale, "labels": {"a": "2"}}})


@pytest.mark.slow
def test_missing_configmap_is_none_and_cluster_policy_patch_uses_merge_patch(double):
    api = k.Kube(double.api_client())
    assert api.get_configmap("gpu-operator", "absent") is None
    [cp] = api.list_cluster_policies()
    api.patch_cluster_policy(cp["metadata"]["name"], {"spec": {"migManager": {"config": {"name": "x"}}}})
    assert double.cluster_policy()["spec"]["migManager"]["config"]["name"] == "x"


@pytest.mark.slow
def test_eviction_refused_by_pdb_is_too_many_requests(double):
    double.add_pod("p", node="gpu-a", labels={"app": "a"})
    double.add_pdb("a", match_labels={"app": "a"}, min_available=1)
    api = k.Kube(double.api_client())
    with pytest.raises(k.TooManyRequestsError, match="disruption budget"):
        api.evict_pod("default", "p")


@pytest.mark.slow
def test_connection_refused_is_temporary(tmp_path):
    with KubeDouble() as d:
        cfg = d.write_kubeconfig(tmp_path / "kc")
    api = k.Kube.connect(k.KubeSettings(kubeconfig=cfg, request_timeout_s=2))
    api._client.configuration.retries = 0
    with pytest.raises(k.TemporaryKubeError, match="cannot reach the API server"):
        api.get_node("gpu-a")


@pytest.mark.slow
def test_kubeconfig_errors_are_permanent_and_name_the_file(tmp_path, double):
    with pytest.raises(k.PermanentKubeError, match="kubeconfig file not found"):
        k.Kube.connect(k.KubeSettings(kubeconfig=tmp_path / "none"))
    cfg = double.write_kubeconfig(tmp_path / "kc")
    with pytest.raises(k.PermanentKubeError, match="nope"):
        k.Kube.connect(k.KubeSettings(kubeconfig=cfg, context="nope"))
    api = k.Kube.connect(k.KubeSettings(kubeconfig=cfg, context="kubedouble"))
    assert api.get_node("gpu-a")["metadata"]["name"] == "gpu-a"
    assert [p["metadata"]["name"] for p in api.pods_on_node("gpu-a")] == []
