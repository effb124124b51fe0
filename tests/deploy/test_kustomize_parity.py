"""kustomize gives what the chart gives: the exporter DaemonSet placed as the chart places it, and
no APIService without a trust path in any rendering (the overlays, deploy/adapter itself, the chart
with each certificate mode): each APIService's caBundle verifies the serving certificate the
rendering creates, or cert-manager's CA injector fills it from a Certificate in the rendering whose
Secret is the one the adapter mounts and whose Issuer is there too."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from tests.deploy.test_helm import template
from tests.deploy.test_manifests import OVERLAY, pod_spec, render

Objects = tuple[dict[str, Any], ...]
KUSTOMIZE = [OVERLAY, "overlays/openshift", "adapter"]


def one(objs: Objects, kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def placement(objs: Objects) -> dict[str, Any]:
    spec = pod_spec(one(objs, "DaemonSet", "gpupilot-exporter"))
    return {k: spec.get(k) for k in ("nodeSelector", "affinity", "tolerations", "priorityClassName")}


@pytest.mark.slow
@pytest.mark.parametrize("overlay", [OVERLAY, "overlays/openshift"])
def test_exporter_placement_is_the_charts(overlay: str) -> None:
    chart = placement(template("defaults"))
    assert chart["nodeSelector"] == {"nvidia.com/gpu.present": "true"}, "every GPU node, every operator"
    assert placement(render(overlay)) == chart
    selectors = str(chart) + str(placement(render(overlay)))
    assert "nvidia.com/gpu.deploy.client" not in selectors, "set only by GPU Operator >= v26.7"


def trust_paths(objs: Objects) -> dict[str, str]:
    """APIService → how the API server comes to trust the adapter; fails on one without a path."""
    adapter = pod_spec(one(objs, "Deployment", "gpupilot-adapter"))
    (mounted,) = [v["secret"]["secretName"] for v in adapter["volumes"] if v["name"] == "serving-cert"]
    service = one(objs, "Service", "gpupilot-adapter")
    dns = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    secrets = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Secret"}
    paths = {}
    for api in (o for o in objs if o["kind"] == "APIService"):
        name = api["metadata"]["name"]
        assert api["spec"]["insecureSkipTLSVerify"] is False, name
        ref = api["spec"]["service"]
        assert (ref["name"], ref["namespace"]) == (
            service["metadata"]["name"],
            service["metadata"]["namespace"],
        )
        inject = (api["metadata"].get("annotations") or {}).get("cert-manager.io/inject-ca-from")
        if api["spec"].get("caBundle"):
            assert not inject, f"{name}: caBundle and cert-manager's injection both"
            assert mounted in secrets, f"{name}: nothing in the rendering creates Secret {mounted}"
            leaf = x509.load_pem_x509_certificate(base64.b64decode(secrets[mounted]["data"]["tls.crt"]))
            ca = x509.load_pem_x509_certificate(base64.b64decode(api["spec"]["caBundle"]))
            key, digest = ca.public_key(), leaf.signature_hash_algorithm
            assert digest is not None
            if isinstance(key, ec.EllipticCurvePublicKey):
                key.verify(leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(digest))
            else:
                leaf.verify_directly_issued_by(ca)
            sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            assert dns in sans.get_values_for_type(x509.DNSName), name
            paths[name] = "caBundle"
        else:
            assert inject, f"{name}: registered without a trust path (no caBundle, no CA injection)"
            namespace, cert_name = inject.split("/")
            cert = one(objs, "Certificate", cert_name)
            assert cert["metadata"]["namespace"] == namespace, name
            if cert["spec"].get("isCA"):
                # The CA's own Certificate (its Secret outlives the serving certificate's renewals):
                # a CA Issuer on that Secret must sign the certificate the adapter mounts.
                (issuer,) = [
                    o
                    for o in objs
                    if o["kind"] == "Issuer"
                    and (o["spec"].get("ca") or {}).get("secretName") == cert["spec"]["secretName"]
                ]
                (cert,) = [
                    o
                    for o in objs
                    if o["kind"] == "Certificate"
                    and o["spec"]["issuerRef"]["name"] == issuer["metadata"]["name"]
                ]
            assert cert["spec"]["secretName"] == mounted, f"{name}: the adapter mounts another Secret"
            assert dns in cert["spec"]["dnsNames"], name
            one(objs, cert["spec"]["issuerRef"].get("kind", "Issuer"), cert["spec"]["issuerRef"]["name"])
            paths[name] = "cert-manager"
    assert paths, "no APIService rendered"
    return paths


@pytest.mark.slow
@pytest.mark.parametrize("rel", KUSTOMIZE)
def test_kustomize_registers_no_apiservice_without_a_trust_path(rel: str) -> None:
    paths = trust_paths(render(rel))
    assert set(paths.values()) == {"cert-manager"}
    assert set(paths) == {"v1beta2.custom.metrics.k8s.io", "v1beta1.custom.metrics.k8s.io"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sets", "mode"), [((), "caBundle"), (("adapter.certManager.enabled=true",), "cert-manager")]
)
def test_chart_registers_no_apiservice_without_a_trust_path(sets: tuple[str, ...], mode: str) -> None:
    paths = trust_paths(template("defaults", *sets))
    assert set(paths.values()) == {mode}
    assert set(paths) == set(trust_paths(render(OVERLAY))), "the same APIServices as kustomize"
