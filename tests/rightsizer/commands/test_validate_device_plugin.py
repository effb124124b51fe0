"""``validate`` on k8s-device-plugin v0.20 config files: every form the plugin accepts passes
(flags only, MPS, imex, time-slicing with rename/renameByDefault/devices), bad values are one line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from rightsizer.cli import main
from rightsizer.migparted import timeslicing

VALID = {
    # the GPU Operator's documented per-node configs, one ConfigMap, several keys
    "operator-configmap.yaml": """\
apiVersion: v1
kind: ConfigMap
metadata: {name: device-plugin-config, namespace: gpu-operator}
data:
  default: |-
    version: v1
    flags:
      migStrategy: none
  mig-mixed: |-
    version: v1
    flags:
      migStrategy: mixed
      failOnInitError: true
      plugin:
        passDeviceSpecs: true
        deviceListStrategy: [envvar, cdi-annotations]
        deviceIDStrategy: uuid
  mps-4: |-
    version: v1
    sharing:
      mps:
        resources:
        - name: nvidia.com/gpu
          replicas: 4
  ts-rename: |-
    version: v1
    flags:
      migStrategy: mixed
    sharing:
      timeSlicing:
        renameByDefault: true
        failRequestsGreaterThanOne: true
        resources:
        - name: nvidia.com/gpu
          replicas: 4
        - name: nvidia.com/mig-1g.10gb
          rename: mig-1g.10gb.shared
          devices: ["0:0", 1, GPU-b1028956-cfa2-0990-bf4a-5da9abb51763]
          replicas: 2
""",
    "flags-only.yaml": "version: v1\nflags:\n  migStrategy: single\n  gfd:\n    oneshot: false\n",
    "imex.yaml": "version: v1\nimex:\n  channelIDs: [0]\n  required: true\n",
    "no-version-mps.yaml": (
        "sharing:\n  mps:\n    renameByDefault: false\n    resources:\n"
        "    - name: gpu\n      replicas: 10\n      devices: 2\n"
    ),
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_every_valid_device_plugin_config_validates(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    path.write_text(VALID[name])
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
    count = 4 if name == "operator-configmap.yaml" else 1
    assert f"OK: {count} device-plugin config(s)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "version: v1\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n",
            "sharing.mps.resources[0].replicas must be an integer >= 2, got 1",
        ),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    failRequestsGreaterThanOne: yes-please\n"
            "    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
            "sharing.timeSlicing.failRequestsGreaterThanOne must be true or false",
        ),
        (
            "version: v1\nsharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n"
            "      devices: some\n      replicas: 2\n",
            "sharing.timeSlicing.resources[0].devices: must be 'all', a count or a list of devices",
        ),
        ("version: v2\nflags:\n  migStrategy: none\n", "version must be v1, got 'v2'"),
        ("version: v1\nimex:\n  channelIDs: [-1]\n", "imex.channelIDs must be a list of channel numbers"),
        (
            "version: v1\nflags:\n  migStrategy: both\n",
            "flags.migStrategy must be one of none, single, mixed",
        ),
    ],
)
def test_invalid_device_plugin_values_are_one_line_each(
    text: str, error: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "dp.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if error in line] and err[-1] == f"{path}: 1 error(s)"


def test_generated_time_slicing_config_fails_requests_greater_than_one() -> None:
    doc = timeslicing.sharing_document(replicas=4)
    assert doc["sharing"]["timeSlicing"]["failRequestsGreaterThanOne"] is True
    assert timeslicing.check(timeslicing.SharingConfig("generated", doc)) == []
