"""The chart's placement and image values as operators of its peers (dcgm-exporter,
prometheus-adapter, KEDA) name them, each rendered with the real Helm and found on every pod spec:
per component nodeSelector, tolerations, affinity, podAnnotations, podLabels, priorityClassName;
imagePullSecrets (top level and global, merged); image digests; a private-registry install that
passes ``helm lint --strict`` and the schema."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.test_helm import CHART, NAMESPACE, ROOT, run_helm
from tests.deploy.test_manifests import pod_spec
from tests.support.yamldocs import load_all

# component values → the pod it places (kind, name).
PODS = {
    "exporter": ("DaemonSet", "gpupilot-exporter"),
    "adapter": ("Deployment", "gpupilot-adapter"),
    "rightsizer": ("Deployment", "gpupilot-rightsizer"),
    "adapter.test": ("Pod", "gpupilot-adapter-test"),
}
DIGESTS = {
    "exporter": "sha256:" + "1" * 64,
    "adapter": "sha256:" + "2" * 64,
    "rightsizer": "sha256:" + "3" * 64,
}
PRIVATE_REGISTRY = {
    "image": {"repository": "registry.example.com/platform/gpupilot", "digest": DIGESTS},
    "imagePullSecrets": ["regcred", {"name": "mirror"}],
    "global": {"imagePullSecrets": [{"name": "regcred"}, "platform-pull"]},
}


def render(tmp_path: Path, values: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    res = run_helm("template", "gpupilot", str(CHART), "--namespace", NAMESPACE, "-f", str(path))
    assert res.returncode == 0, res.stderr
    return {(o["kind"], o["metadata"]["name"]): o for o in load_all(res.stdout)}


def placement(component: str) -> dict[str, Any]:
    """Values of each kind, distinct per component (a value landing on the wrong pod shows)."""
    return {
        "nodeSelector": {"example.com/pool": component},
        "tolerations": [{"key": "example.com/dedicated", "value": component, "effect": "NoSchedule"}],
        "affinity": {
            "podAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "podAffinityTerm": {
                            "topologyKey": "topology.kubernetes.io/zone",
                            "labelSelector": {"matchLabels": {"example.com/near": component}},
                        },
                    }
                ]
            }
        },
        "podAnnotations": {"example.com/owner": component},
        "podLabels": {"example.com/team": component, "app.kubernetes.io/name": "overridden"},
        "priorityClassName": f"prio-{component.replace('.', '-')}",
    }


def nested(dotted: str, value: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = value
    for part in reversed(dotted.split(".")):
        out = {part: out}
    return out


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.mark.slow
def test_each_placement_value_lands_on_its_pod(tmp_path: Path) -> None:
    values: dict[str, Any] = {}
    for component in PODS:
        values = merge(values, nested(component, placement(component)))
    objs = render(tmp_path, values)
    for component, key in PODS.items():
        obj = objs[key]
        spec = obj["spec"] if key[0] == "Pod" else pod_spec(obj)
        meta = obj["metadata"] if key[0] == "Pod" else obj["spec"]["template"]["metadata"]
        want = placement(component)
        where = f"{component} → {key[0]}/{key[1]}"
        assert spec["priorityClassName"] == want["priorityClassName"], where
        if component == "exporter":  # the chart's GPU selector stays beside the operator's
            assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", **want["nodeSelector"]}, where
        else:
            assert spec["nodeSelector"] == want["nodeSelector"], where
        assert spec["tolerations"] == want["tolerations"], where
        assert spec["affinity"]["podAffinity"] == want["affinity"]["podAffinity"], where
        assert meta["annotations"]["example.com/owner"] == component, where
        assert meta["labels"]["example.com/team"] == component, where
        if key[0] != "Pod":  # the selector's label wins over podLabels
            selector = obj["spec"]["selector"]["matchLabels"]
            assert meta["labels"]["app.kubernetes.io/name"] == selector["app.kubernetes.io/name"], where
    # Helm merges maps: the adapter's default spreading stays beside an affinity of one's own and
    # goes only when set to null.
    assert "podAntiAffinity" in pod_spec(objs[PODS["adapter"]])["affinity"]
    dropped = render(tmp_path, {"adapter": {"affinity": {"podAntiAffinity": None}}})
    assert "affinity" not in pod_spec(dropped[PODS["adapter"]])
    default = render(tmp_path, {})
    spread = pod_spec(default[PODS["adapter"]])["affinity"]["podAntiAffinity"]
    assert spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == (
        "kubernetes.io/hostname"
    )
    for component, key in PODS.items():
        obj = default[key]
        meta = obj["metadata"] if key[0] == "Pod" else obj["spec"]["template"]["metadata"]
        assert not any(k.startswith("example.com/") for k in meta.get("labels", {})), component
        spec = obj["spec"] if key[0] == "Pod" else pod_spec(obj)
        assert "imagePullSecrets" not in spec, component


@pytest.mark.slow
def test_exporter_affinity_keeps_the_charts_own_node_expressions(tmp_path: Path) -> None:
    """Required node terms are ORed: the chart's opt-out and MIG-pause expressions go into each of
    the operator's terms, so no term schedules the exporter on a node that opted out."""
    mine = [
        {"matchExpressions": [{"key": "example.com/rack", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "example.com/rack", "operator": "In", "values": ["b"]}]},
    ]
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": mine}}
    }
    objs = render(tmp_path, {"exporter": {"affinity": affinity}})
    terms = pod_spec(objs[PODS["exporter"]])["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert len(terms) == 2
    for term, own in zip(terms, mine, strict=True):
        keys = [e["key"] for e in term["matchExpressions"]]
        assert keys == [
            "example.com/rack",
            "nvidia.com/gpu.deploy.gpupilot-exporter",
            "nvidia.com/gpu.deploy.dcgm-exporter",
        ]
        assert term["matchExpressions"][0] == own["matchExpressions"][0]


@pytest.mark.slow
def test_private_registry_renders_pull_secrets_and_digests_and_lints(tmp_path: Path) -> None:
    objs = render(tmp_path, PRIVATE_REGISTRY)
    images = {}
    for component, key in PODS.items():
        obj = objs[key]
        spec = obj["spec"] if key[0] == "Pod" else pod_spec(obj)
        # global's first, then the chart's own, each name once
        assert spec["imagePullSecrets"] == [
            {"name": "regcred"},
            {"name": "platform-pull"},
            {"name": "mirror"},
        ], component
        (container,) = spec["containers"]
        images[component] = container["image"]
    assert images == {
        "exporter": f"registry.example.com/platform/gpupilot-exporter@{DIGESTS['exporter']}",
        "adapter": f"registry.example.com/platform/gpupilot-adapter@{DIGESTS['adapter']}",
        "rightsizer": f"registry.example.com/platform/gpupilot-rightsizer@{DIGESTS['rightsizer']}",
        "adapter.test": f"registry.example.com/platform/gpupilot-adapter@{DIGESTS['adapter']}",
    }
    path = tmp_path / "private.yaml"
    path.write_text(yaml.safe_dump(PRIVATE_REGISTRY))
    res = run_helm("lint", "--strict", str(CHART), "-f", str(path))
    assert res.returncode == 0 and "0 chart(s) failed" in res.stdout, res.stdout + res.stderr
    # One digest alone pins that image; the others keep the tag.
    only = render(tmp_path, {"image": {"digest": {"adapter": DIGESTS["adapter"]}}})
    assert (
        pod_spec(only[PODS["exporter"]])["containers"][0]["image"]
        == "localhost/gpupilot/gpupilot-exporter:0.1.0"
    )
    assert pod_spec(only[PODS["adapter"]])["containers"][0]["image"].endswith(
        f"-adapter@{DIGESTS['adapter']}"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("image.digest.exporter=sha256:abc", "/image/digest/exporter"),
        ("image.digest.adapter=latest", "/image/digest/adapter"),
        ("imagePullSecrets[0].secret=regcred", "/imagePullSecrets/0"),
        ("global.imagePullSecrets[0]=Bad_Name", "/global/imagePullSecrets/0"),
        ("rightsizer.tolerations=none", "/rightsizer/tolerations"),
        ("adapter.podLabels.team=1", "/adapter/podLabels/team"),
    ],
)
def test_schema_refuses_bad_image_and_placement_values(setting: str, message: str) -> None:
    res = run_helm("template", "gpupilot", str(CHART), "--namespace", NAMESPACE, "--set", setting)
    assert res.returncode != 0, setting
    assert message in res.stderr, res.stderr


def test_default_image_name_is_the_one_make_images_gives() -> None:
    """No default in a registry namespace the project does not control: the chart, the overlays,
    `make images` and devkit.images all say localhost/gpupilot/gpupilot."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["repository"] == "localhost/gpupilot/gpupilot"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^IMAGE_REPOSITORY \?= localhost/gpupilot/gpupilot$", makefile, re.M)
    assert 'default="localhost/gpupilot/gpupilot"' in (ROOT / "devkit" / "images.py").read_text()
    for overlay in ("gpu-operator", "openshift/app"):
        images = yaml.safe_load((ROOT / "deploy" / "overlays" / overlay / "kustomization.yaml").read_text())[
            "images"
        ]
        assert {i["newName"] for i in images} == {
            f"localhost/gpupilot/gpupilot-{s}" for s in ("exporter", "adapter", "rightsizer")
        }
