"""``gpupilot-rightsizer validate FILE``: which mig-parted configs fit which GPUs, as NVIDIA decides.

Prints a table (config, device, verdict, reason) on stdout and one line per error on stderr.
Exit 0 when nothing is invalid, 1 when something is, 2 for usage errors (bad flags, unreadable file).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpupilot_common import output
from gpupilot_common.paths import file_problem
from gpupilot_common.table import Column, render
from mig_geometry.catalogue import by_device_id
from rightsizer.clients.kube import Kube, KubeError, KubeSettings
from rightsizer.migparted import applicability, manifest, nodeprofiles, timeslicing
from rightsizer.migparted.config import MigPartedError

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2

OUTPUT_SCHEMA = """
## Output with `-o json` / `-o yaml`

One document on stdout (error lines still go to stderr; the exit code is the same as with the table):

| key | type | what |
|---|---|---|
| `file` | string | the file checked |
| `ok` | boolean | nothing invalid (exit code 0) |
| `results` | list | one entry per config × device: `config`, `device`, `verdict` (`valid`, `invalid`, `not for this device`, …), `reason` |
| `notes` | list of strings | skipped objects, inferred models, node disagreements |
| `errors` | list of strings | one line per error, as printed on stderr |
| `summary` | string | the closing line (`…: OK: 2 mig-parted config(s) …`), empty on errors |

```json
{"file": "configs.yaml", "ok": true,
 "results": [{"config": "all-1g.10gb", "device": "0x2330 H100 80GB", "verdict": "valid", "reason": ""}],
 "notes": [], "errors": [], "summary": "configs.yaml: OK: 1 mig-parted config(s), 1 entry(ies) checked against …"}
```
"""


def _device_id(text: str) -> int:
    try:
        value = int(text, 16)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a PCI device id like 0x2330 or 0x233010DE"
        ) from None
    if value > 0xFFFF:
        if value > 0xFFFFFFFF or value & 0xFFFF != 0x10DE:
            raise argparse.ArgumentTypeError(f"{text!r}: the 32-bit form is 0xDDDD10DE (NVIDIA's vendor id)")
        value >>= 16
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check the mig-parted configs in FILE (bare, or in ConfigMaps anywhere in a multi-document "
        "manifest, as NVIDIA ships them) against the MIG geometry catalogue, per config × device: "
        "exact profile names as mig-parted matches them, counts, compute-instance profiles and "
        "whether a placement exists. NVIDIA device-plugin configs (time-slicing, MPS, flags, imex) are checked too; other "
        "Kubernetes objects are skipped with a note. Exit 0 when nothing is invalid, 1 when "
        "something is, 2 for usage errors."
    )
    parser.add_argument("file", type=Path, metavar="FILE", help="YAML file with mig-parted config(s)")
    parser.add_argument(
        "--device-id",
        type=_device_id,
        default=None,
        metavar="ID",
        help=(
            "PCI device id of the GPU to check for, e.g. 0x2330 or 0x233010DE. Without it, entries with "
            "a device-filter are checked against each device the filter names and entries without one "
            "against every catalogued MIG GPU (an entry must fit at least one). With it, entries whose "
            "filter excludes the device are skipped and entries made of another GPU's profiles are "
            "shown as 'not for this device'."
        ),
    )
    parser.add_argument(
        "--node",
        metavar="NAME",
        default=None,
        help=(
            "Check for this node: read the profile list its MIG Manager (v26.3+) wrote to the "
            "per-node ConfigMap and use it as the authority for the node's GPU, reporting where it "
            "disagrees with the catalogue. Needs a kubeconfig (--kubeconfig or the usual defaults)."
        ),
    )
    parser.add_argument("--kubeconfig", type=Path, default=None, metavar="PATH", help="kubeconfig for --node")
    parser.add_argument(
        "--namespace",
        default="gpu-operator",
        metavar="NS",
        help="namespace of the MIG Manager's per-node ConfigMap (default: gpu-operator)",
    )
    output.add_argument(parser, what="the verdicts")


COLUMNS = (Column("CONFIG"), Column("DEVICE"), Column("VERDICT"), Column("REASON", wrap=True))


def _table(rows: list[tuple[str, str, str, str]], *, wide: bool = False) -> str:
    return render(COLUMNS, rows, wide=wide)


def _document(
    path: Path, rows: list[tuple[str, str, str, str]], notes: list[str], errors: list[str], summary: str
) -> dict[str, object]:
    return {
        "file": str(path),
        "ok": not errors,
        "results": [dict(zip(("config", "device", "verdict", "reason"), r, strict=True)) for r in rows],
        "notes": notes,
        "errors": errors,
        "summary": summary,
    }


def run(args: argparse.Namespace) -> int:  # noqa: PLR0912 (one branch per exit path, in order)
    path: Path = args.file
    if problem := file_problem(path):
        print(f"error: {path}: cannot read: {problem}", file=sys.stderr)
        return EXIT_USAGE
    node = None
    node_notes: list[str] = []
    if args.node:
        try:
            node, node_notes = _node(args)
        except (KubeError, MigPartedError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    try:
        text = manifest.read_text(path)
    except MigPartedError as exc:  # unreadable or oversized: the wrong file was given
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        found = manifest.load_manifest(text, source=str(path))
    except MigPartedError as exc:  # not YAML: the file is invalid
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if not found.mig and not found.sharing:
        missing = (
            f"{path}: no mig-parted config found (expected 'version: v1' and 'mig-configs', "
            "bare or in a ConfigMap's data)"
        )
        if output.structured(args):
            output.emit(_document(path, [], list(found.notes), [missing], ""), args.output)
        else:
            for note in found.notes:
                print(f"note: {note}")
        print(f"error: {missing}", file=sys.stderr)
        return EXIT_INVALID
    result = applicability.validate(found.mig, device_id=args.device_id, node=node)
    errors = [issue.line() for issue in result.issues]
    for cfg in found.sharing:
        errors += timeslicing.check(cfg)
    rows = applicability.summarise(result.verdicts)
    notes = [*found.notes, *node_notes, *_inferred_notes(result.verdicts)]
    structured = output.structured(args)
    if rows and not structured:
        print(_table(rows, wide=args.output == "wide"))
    if not structured:
        for note in notes:
            print(f"note: {note}")
    for line in errors:
        print(line, file=sys.stderr)
    if errors:
        if structured:
            output.emit(_document(path, rows, notes, errors, ""), args.output)
        print(f"{path}: {len(errors)} error(s)", file=sys.stderr)
        return EXIT_INVALID
    parts = []
    if found.mig:
        target = _target(args.device_id)
        part = f"{result.configs} mig-parted config(s), {result.entries_checked} entry(ies) checked against {target}"
        if result.entries_skipped:
            part += f", {result.entries_skipped} skipped (device-filter excludes it)"
        parts.append(part)
    if found.sharing:
        parts.append(f"{len(found.sharing)} device-plugin config(s)")
    summary = f"{path}: OK: {'; '.join(parts)}"
    if structured:
        output.emit(_document(path, rows, notes, [], summary), args.output)
    else:
        print(summary)
    return EXIT_OK


def _node(args: argparse.Namespace) -> tuple[applicability.NodeProfiles | None, list[str]]:
    """The node's MIG Manager profile list (None where it wrote none) and where it disagrees."""
    kube = Kube.connect(KubeSettings(kubeconfig=args.kubeconfig))
    try:
        labels = (kube.get_node(args.node).get("metadata") or {}).get("labels") or {}
        cm = kube.get_configmap(args.namespace, nodeprofiles.configmap_name(args.node))
    finally:
        kube.close()
    model = nodeprofiles.model_from_labels(labels)
    if args.device_id is None and model is not None:
        args.device_id = model.device_id
    if cm is None:
        where = f"{args.namespace}/{nodeprofiles.configmap_name(args.node)}"
        return None, [
            f"node {args.node}: no ConfigMap {where} (MIG Manager before v26.3?); using the catalogue"
        ]
    node = nodeprofiles.from_configmap(cm, node=args.node, device_id=args.device_id)
    if args.device_id is None:
        args.device_id = node.device_id
    return node, nodeprofiles.disagreements(node, model if model is not None else None)


def _target(device_id: int | None) -> str:
    if device_id is None:
        return "their device-filter, else every catalogued MIG GPU"
    model = by_device_id(device_id)
    return f"0x{device_id:04x} {model.key if model else '(not in catalogue)'}"


def _inferred_notes(verdicts: list[applicability.Verdict] | tuple[applicability.Verdict, ...]) -> list[str]:
    out = []
    seen = set()
    for v in verdicts:
        if (
            v.device_id is None
            or not v.named
            or v.verdict not in (applicability.VALID, applicability.INVALID)
        ):
            continue
        model = by_device_id(v.device_id)
        if model is not None and model.inferred and model.key not in seen:
            seen.add(model.key)
            out.append(f"{model.key} is inferred (not confirmed on hardware): {model.source}")
    return out
