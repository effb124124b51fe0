"""Authentication over real TLS with a minted PKI: request-header auth as kube-apiserver does it
(allowed CN passes, wrong CN refused, headers without a client certificate refused, untrusted CA
refused at the handshake), client-certificate users, 401/403 as Status JSON."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Callable

import pytest
import requests
from cryptography import x509
from multidict import CIMultiDict

from adapter.config.settings import ServeSettings
from adapter.errors import Forbidden, Unauthorized
from adapter.serving.api import RequestInfo
from adapter.serving.app import Adapter
from adapter.serving.auth import Authenticator, Authorizer, RequestHeaderSettings, User
from tests.adapter.conftest import Client, PromEnv, base_settings
from tests.support.adapter.pki import Pki

PATH = (
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ai-serving/pods/llm-inference-7d9f-a/DCGM_FI_DEV_GPU_UTIL"
)
HPA_USER = {
    "X-Remote-User": "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
    "X-Remote-Group": "system:serviceaccounts",
}


def test_front_proxy_with_allowed_cn_passes(adapter_client: Client) -> None:
    r = adapter_client.as_hpa(PATH)
    assert r.status_code == 200
    assert r.json()["items"][0]["value"] == "90"


def test_wrong_cn_is_refused_even_with_a_valid_chain(adapter_client: Client, pki: Pki) -> None:
    r = adapter_client.get(PATH, cert=(pki.wrong_cn_proxy.cert, pki.wrong_cn_proxy.key), headers=HPA_USER)
    assert r.status_code == 401
    body = r.json()
    assert (body["kind"], body["reason"], body["code"]) == ("Status", "Unauthorized", 401)
    assert "'evil-proxy' is not in --requestheader-allowed-names" in body["message"]


def test_spoofed_headers_on_plain_tls_are_refused(adapter_client: Client) -> None:
    r = adapter_client.get(PATH, headers=HPA_USER)  # TLS, but no client certificate
    assert r.status_code == 401
    assert r.json()["reason"] == "Unauthorized"


def test_front_proxy_without_user_header_is_refused(adapter_client: Client, pki: Pki) -> None:
    r = adapter_client.get(PATH, cert=(pki.front_proxy.cert, pki.front_proxy.key))
    assert r.status_code == 401
    assert "sent no X-Remote-User" in r.json()["message"]


def test_client_ca_user_ignores_spoofed_headers(adapter_client: Client, pki: Pki) -> None:
    # alice's certificate comes from the client CA: she is alice, whatever headers she adds
    r = adapter_client.get(PATH, cert=(pki.alice.cert, pki.alice.key), headers=HPA_USER)
    assert r.status_code == 200


def test_certificate_from_an_untrusted_ca_fails_the_handshake(adapter_client: Client, pki: Pki) -> None:
    # the server ends the handshake; under TLS 1.3 the client learns it when it reads (an alert or EOF)
    with pytest.raises(requests.exceptions.ConnectionError):
        adapter_client.get(PATH, cert=(pki.rogue.cert, pki.rogue.key), headers=HPA_USER)
    assert adapter_client.get("/healthz").status_code == 200


def test_server_certificate_verifies_against_the_serving_ca(adapter_client: Client) -> None:
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(adapter_client.base + "/healthz", timeout=5)  # system CAs do not know ours
    ctx = ssl.create_default_context(cafile=str(adapter_client.pki.serving_ca.path))
    host, port = adapter_client.base.removeprefix("https://").split(":")
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=host) as tls,
    ):
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


def test_authenticator_unit_paths(pki: Pki) -> None:
    def cert(issued) -> x509.Certificate:
        return x509.load_pem_x509_certificate(issued.cert.read_bytes())

    rh = RequestHeaderSettings(
        ca_certs=(pki.front_proxy_ca.cert,), allowed_names=frozenset({"front-proxy-client"})
    )
    auth = Authenticator(requestheader=rh, client_cas=(pki.client_ca.cert,))
    user = auth.authenticate(
        peer_cert=cert(pki.front_proxy),
        headers={
            "x-remote-user": ["bob"],
            "X-Remote-Group": ["g1", "g2"],
            "X-Remote-Extra-Scopes": ["a", "b"],
        },
    )
    assert user == User("bob", ("g1", "g2"), {"scopes": ("a", "b")}, via="requestheader")
    alice = auth.authenticate(peer_cert=cert(pki.alice), headers={})
    assert (alice.name, alice.groups, alice.via) == ("alice", ("team-a",), "x509")
    with pytest.raises(Unauthorized, match="no client certificate or bearer token"):
        auth.authenticate(peer_cert=None, headers={"X-Remote-User": ["admin"]})
    # an empty allowed-names list accepts any CN from the request-header CA, as kube-apiserver does
    open_rh = Authenticator(
        requestheader=RequestHeaderSettings(ca_certs=(pki.front_proxy_ca.cert,), allowed_names=frozenset())
    )
    assert (
        open_rh.authenticate(peer_cert=cert(pki.wrong_cn_proxy), headers={"X-Remote-User": ["x"]}).name == "x"
    )


def test_authorizer_none_allows_and_unknown_mode_is_rejected() -> None:
    Authorizer(mode="none", kube=None).authorize(User("anyone"), RequestInfo("/x", False))
    with pytest.raises(ValueError, match="needs a Kubernetes client"):
        Authorizer(mode="subjectaccessreview", kube=None)
    assert issubclass(Forbidden, Exception)


def test_authorization_none_logs_a_warning(
    prom: PromEnv,
    pki: Pki,
    start_adapter: Callable[[ServeSettings], Adapter],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING"):
        start_adapter(base_settings(prom.url, pki))
    assert any(
        "--authorization-mode none" in r.message and "local use only" in r.message for r in caplog.records
    )


class _CountingKube:
    """SubjectAccessReview stand-in: allows everyone except ``mallory``, counts the reviews."""

    def __init__(self) -> None:
        self.reviews: list[tuple[str, tuple[str, ...], dict[str, str] | None]] = []

    def subject_access_review(self, *, user: str, groups: tuple[str, ...], resource, **_: object):
        self.reviews.append((user, groups, resource))
        return user != "mallory", "" if user != "mallory" else "not in the bench group"


def test_identities_are_memoised_per_authenticator_and_never_across_a_reload(pki: Pki) -> None:
    front_proxy = x509.load_pem_x509_certificate(pki.front_proxy.cert.read_bytes())
    rh = RequestHeaderSettings(
        ca_certs=(pki.front_proxy_ca.cert,), allowed_names=frozenset({"front-proxy-client"})
    )
    auth = Authenticator(requestheader=rh)
    hpa = {"X-Remote-User": ["hpa"], "X-Remote-Group": ["g1"], "Accept": ["*/*"]}
    first = auth.authenticate(peer_cert=front_proxy, headers=hpa)
    # the same identity (header names in any case) is the same object: its review key is built once
    again = auth.authenticate(
        peer_cert=front_proxy, headers={"x-remote-user": ["hpa"], "x-remote-group": ["g1"]}
    )
    assert again is first
    other = auth.authenticate(peer_cert=front_proxy, headers={**hpa, "X-Remote-Group": ["g1", "g2"]})
    assert other is not first and other.groups == ("g1", "g2")
    extra = auth.authenticate(peer_cert=front_proxy, headers={**hpa, "X-Remote-Extra-Scopes": ["s"]})
    assert extra is not first and extra.extra == {"scopes": ("s",)}
    # as the server passes them: one line per header (a multidict); the same lines are looked up
    lines = CIMultiDict([("X-Remote-User", "hpa"), ("X-Remote-Group", "g1"), ("x-remote-group", "g2")])
    by_lines = auth.authenticate(peer_cert=front_proxy, headers=lines)
    assert by_lines.groups == ("g1", "g2") and by_lines is other
    assert auth.authenticate(peer_cert=front_proxy, headers=CIMultiDict(lines)) is other
    for _ in range(2):  # "no user" is remembered too, and refused each time
        with pytest.raises(Unauthorized, match="sent no X-Remote-User"):
            auth.authenticate(peer_cert=front_proxy, headers=CIMultiDict([("X-Remote-Group", "g1")]))
    # a reloaded request-header CA that no longer lists the proxy's issuer is a new authenticator:
    # nothing it concluded about the certificate before survives
    reloaded = Authenticator(
        requestheader=RequestHeaderSettings(ca_certs=(pki.client_ca.cert,), allowed_names=frozenset())
    )
    with pytest.raises(Unauthorized):
        reloaded.authenticate(peer_cert=front_proxy, headers=hpa)
    # a CN outside the allowed names is refused every time, not only the first
    wrong = x509.load_pem_x509_certificate(pki.wrong_cn_proxy.cert.read_bytes())
    for _ in range(2):
        with pytest.raises(Unauthorized, match="not in --requestheader-allowed-names"):
            auth.authenticate(peer_cert=wrong, headers=hpa)


def test_authorisation_verdicts_are_cached_per_user_and_request_for_their_ttl() -> None:
    kube = _CountingKube()
    now = [1000.0]
    authz = Authorizer(mode="subjectaccessreview", kube=kube, ttl=10.0, clock=lambda: now[0])  # type: ignore[arg-type]
    info = RequestInfo(
        PATH, True, "custom.metrics.k8s.io", "v1beta2", "ai-serving", "pods", "x", "DCGM_FI_DEV_GPU_UTIL"
    )
    hpa = User("hpa", ("g1",))
    for _ in range(3):
        authz.authorize(hpa, info)
    authz.authorize(User("hpa", ("g1",)), info)  # an equal user is the same key
    assert len(kube.reviews) == 1
    assert kube.reviews[0][2] == {
        "verb": "get",
        "group": "custom.metrics.k8s.io",
        "version": "v1beta2",
        "resource": "pods",
        "namespace": "ai-serving",
        "name": "x",
        "subresource": "DCGM_FI_DEV_GPU_UTIL",
    }
    authz.authorize(User("hpa", ("g1", "g2")), info)  # other groups: reviewed on their own
    assert len(kube.reviews) == 2
    with pytest.raises(Forbidden, match="not in the bench group"):
        authz.authorize(User("mallory"), info)
    with pytest.raises(Forbidden):  # the denial is cached too, and still refuses
        authz.authorize(User("mallory"), info)
    assert len(kube.reviews) == 3
    now[0] += 10.5  # past the TTL: asked again
    authz.authorize(hpa, info)
    assert len(kube.reviews) == 4


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("X-Remote-Extra-Authentication.kubernetes.io%2fpod-name", "authentication.kubernetes.io/pod-name"),
        ("X-Remote-Extra-Authentication.Kubernetes.IO%2Fpod-uid", "authentication.kubernetes.io/pod-uid"),
        ("X-Remote-Extra-Example.com%2fa%20b", "example.com/a b"),
        ("X-Remote-Extra-A+b", "a+b"),  # PathUnescape: + is not a space
        ("X-Remote-Extra-Bad%zzkey", "bad%zzkey"),  # a malformed escape: kept as it came
        ("X-Remote-Extra-Scopes", "scopes"),
    ],
)
def test_extra_keys_are_percent_decoded_and_lower_cased_as_kube_apiserver_does(
    pki: Pki, header: str, key: str
) -> None:
    """The front proxy escapes what a header name cannot hold; the key the SubjectAccessReview carries
    is the decoded one (kube-apiserver's headerrequest unescapeExtraKey), so an authorizer matching
    authentication.kubernetes.io/pod-name sees it."""
    front_proxy = x509.load_pem_x509_certificate(pki.front_proxy.cert.read_bytes())
    rh = RequestHeaderSettings(
        ca_certs=(pki.front_proxy_ca.cert,), allowed_names=frozenset({"front-proxy-client"})
    )
    user = Authenticator(requestheader=rh).authenticate(
        peer_cert=front_proxy, headers={"X-Remote-User": ["hpa"], header: ["v1", "v2"]}
    )
    assert user.extra == {key: ("v1", "v2")}
    seen: list[dict[str, object]] = []

    class Reviews:
        def subject_access_review(self, **review: object) -> tuple[bool, str]:
            seen.append(review)
            return True, ""

    info = RequestInfo("/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu", True, resource="pods")
    Authorizer(mode="subjectaccessreview", kube=Reviews(), ttl=0).authorize(user, info)  # type: ignore[arg-type]
    (review,) = seen
    assert {k: tuple(v) for k, v in review["extra"].items()} == {key: ("v1", "v2")}  # type: ignore[attr-defined]
