"""``apply`` does not trust plan.json: every plan is checked again before anything is touched.

A plan is a file people can edit (or damage). Before the first API write, ``apply`` refuses a plan when:

- a node is listed twice (it would be applied twice);
- a config it would write is not named ``gpupilot-<hash>`` (so it could overwrite a config such as
  ``all-1g.10gb`` that other nodes use), or its content does not hash to its name (edited by hand);
- a changed node's config is missing, or fails the mig-parted checks against the geometry catalogue
  for the node's GPU model (unknown profile, a layout with no placement);
- the plan id does not match what the plan proposes (``plan_id_for``: the id is a hash of its nodes,
  their configs and layouts, and the window).

Each refusal is one :class:`~rightsizer.plan.model.PlanError` line naming the node or config.
"""

from __future__ import annotations

from collections import Counter

from mig_geometry.catalogue import GpuModel, by_device_id, find_model
from rightsizer.apply.configmap import plan_configs
from rightsizer.migparted import applicability
from rightsizer.migparted import config as migparted
from rightsizer.plan.model import Plan, PlanError, config_name_for, plan_id_for

CONFIG_PREFIX = "gpupilot-"


def check_plan(plan: Plan, *, source: str = "plan") -> None:
    """Raise :class:`PlanError` when ``plan`` must not be applied (see the module docstring)."""
    counts = Counter((n.cluster, n.name) for n in plan.nodes)
    twice = sorted(key for key, c in counts.items() if c > 1)
    if twice:
        where = f" of cluster {twice[0][0]}" if twice[0][0] else ""
        raise PlanError(
            f"{source}: node {twice[0][1]}{where} is listed {counts[twice[0]]} times; a plan lists each "
            "node once (re-run 'plan')"
        )
    configs = plan_configs(plan)
    for name, entries in configs.items():
        if not name.startswith(CONFIG_PREFIX):
            raise PlanError(
                f"{source}: config {name!r} is not a {CONFIG_PREFIX}<hash> config; apply only adds its "
                "own content-named configs and never rewrites one that other nodes may use"
            )
        if not isinstance(entries, list) or config_name_for(entries) != name:
            raise PlanError(
                f"{source}: config {name} does not match its content hash (the plan was edited); "
                "re-run 'plan' instead of editing plan.json"
            )
    for node in plan.changed_nodes:
        if node.config_name not in configs:
            raise PlanError(f"{source}: node {node.name}: config {node.config_name} is not in the plan")
        model = _model_of(node.model, node.pci_device_id)
        if model is None:
            raise PlanError(
                f"{source}: node {node.name}: GPU model {node.model!r} ({node.pci_device_id}) is not in "
                "the geometry catalogue"
            )
        parsed = migparted.parse_document(
            {"version": "v1", "mig-configs": {node.config_name: configs[node.config_name]}},
            source=f"{source}: node {node.name}",
        )
        problems = [i.line() for i in parsed.issues]
        for entries in parsed.configs.values():
            for index, entry in enumerate(entries):
                if entry.device_filter and _device_id(node.pci_device_id) not in entry.device_filter:
                    continue
                reason = applicability.check_entry(model, entry)
                if reason:
                    problems.append(
                        f"{source}: node {node.name} config {node.config_name} entry {index}: {reason}"
                    )
        if problems:
            raise PlanError(problems[0])
    expected = plan_id_for(nodes=plan.nodes, window=plan.window)
    if plan.plan_id != expected:
        raise PlanError(
            f"{source}: plan_id {plan.plan_id} does not match the plan's content ({expected}); the plan was "
            "edited: re-run 'plan'"
        )


def _device_id(text: str) -> int:
    """``0x2330`` or ``0x233010DE`` → 0x2330; -1 when not hexadecimal."""
    try:
        value = int(text, 16)
    except ValueError:
        return -1
    return value >> 16 if value > 0xFFFF else value


def _model_of(model: str, pci_device_id: str) -> GpuModel | None:
    found = by_device_id(_device_id(pci_device_id)) if pci_device_id else None
    return found or find_model(model)
