"""The adapter without cert-manager: the generated component renders with the overlay, its Secret
is the one the Deployment mounts, and every APIService's caBundle verifies the serving certificate."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from devkit import adapter_tls
from tests.deploy.test_manifests import DEPLOY, OVERLAY, pod_spec
from tests.support.yamldocs import load_all


def render_with(tmp_path: Path, components: list[Path]) -> list[dict[str, Any]]:
    top = tmp_path / "overlay"
    top.mkdir()
    (top / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(DEPLOY / OVERLAY, top)],
                "components": [os.path.relpath(c, top) for c in components],
            }
        )
    )
    res = subprocess.run(["kubectl", "kustomize", str(top)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    return load_all(res.stdout)


@pytest.mark.slow
def test_generated_component_serves_the_apiservices(tmp_path: Path) -> None:
    certs = tmp_path / "adapter-tls"
    assert adapter_tls.main(["--out", str(certs), "--external", "--days", "30"]) == 0
    assert (certs / "tls.key").stat().st_mode & 0o077 == 0
    # Components apply in order: the external APIService must exist before the caBundle patches.
    objs = render_with(tmp_path, [DEPLOY / "adapter" / "external", certs])
    (secret,) = [o for o in objs if o["kind"] == "Secret"]
    assert (secret["metadata"]["name"], secret["metadata"]["namespace"], secret["type"]) == (
        "gpupilot-adapter-tls",
        "gpupilot",
        "kubernetes.io/tls",
    )
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpupilot-adapter")
    mounted = {v["secret"]["secretName"] for v in pod_spec(dep)["volumes"] if "secret" in v}
    assert secret["metadata"]["name"] in mounted
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    apiservices = [o for o in objs if o["kind"] == "APIService"]
    assert len(apiservices) == 3
    for api in apiservices:
        ref = api["spec"]["service"]
        assert f"{ref['name']}.{ref['namespace']}.svc" in sans, (
            "the aggregator dials <service>.<namespace>.svc"
        )
        ca = x509.load_pem_x509_certificate(base64.b64decode(api["spec"]["caBundle"]))
        ca_key, digest = ca.public_key(), leaf.signature_hash_algorithm
        assert isinstance(ca_key, ec.EllipticCurvePublicKey) and digest is not None
        ca_key.verify(leaf.signature, leaf.tbs_certificate_bytes, ec.ECDSA(digest))
        assert "cert-manager.io/inject-ca-from" not in (api["metadata"].get("annotations") or {})
        assert api["spec"]["insecureSkipTLSVerify"] is False


def test_days_out_of_range_is_one_line(tmp_path: Path, capsys) -> None:
    assert adapter_tls.main(["--out", str(tmp_path / "x"), "--days", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --days 0") and err.count("\n") == 1
