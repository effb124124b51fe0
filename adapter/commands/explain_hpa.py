"""``gpupilot-adapter explain-hpa``: what an HPA would do now, metric by metric, from Prometheus (or
offline from a ``--state`` file)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from adapter.clients.kube import KubeClient
from adapter.commands import options
from adapter.config.mapping import load_config
from adapter.errors import ConfigError
from adapter.hpa import explain, replay, timeline
from adapter.hpa import spec as hpaspec
from adapter.hpa import state as hpastate
from adapter.provider.podsource import KubernetesPodSource, PodSource, PrometheusPodSource
from adapter.provider.values import MetricValues
from gpupilot_common import numbers, output
from hpa_controller import decide as hpa

OUTPUT_SCHEMA = """
## Output with `-o json` / `-o yaml`

One document on stdout; exit codes as with the table:

| key | type | what |
|---|---|---|
| `hpa` | object | `namespace`, `name`, `target` (`Deployment/llm-inference`) |
| `kubernetes` | string | the controller release whose decision is computed (`v1.35`) |
| `at` | string | the moment decided for, RFC 3339 UTC |
| `current_replicas`, `min_replicas`, `max_replicas` | integer | as the controller sees them |
| `tolerance` | object | `up`, `down` |
| `behavior` | boolean | whether the HPA has a `behavior` section (else the legacy rules) |
| `pods` | object | `total`, `ready` |
| `metrics` | list | per metric: `metric`, `type`, `target` (`type`, `value`), `current` (plain units; `utilization` in whole percent for Resource Utilization), `pods_with_value`, `proposal` (replicas), `ratio`, `error` (empty when read), `notes` (unready and missing pods) |
| `per_pod` | list | per pod: `name`, `state` (`ready`, `unready`, `pending`, `deleting` …), `values` (metric → value or null) |
| `decision` | object | `recommended` (largest proposal), `final`, `change` (`scale up`, `scale down`, `no change`), `failed`, `steps`: the reasons in order — a new HPA's first recommendation, stabilisation, the policy that limited the rate with the scale events it counted, min/max |
| `sources`, `caveats` | list of strings | where each input came from; what the answer could not see |

```bash
for f in hpas/*.yaml; do
  gpupilot-adapter explain-hpa -f "$f" --prometheus-url http://prometheus:9090 -o json | jq -c '{hpa: .hpa.name, final: .decision.final}'
done
```
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        type=Path,
        required=True,
        help="YAML file holding the HPA (and optionally its target)",
    )
    options.add_prometheus(parser, required=False)
    parser.add_argument(
        "--state",
        type=Path,
        help="answer offline from this file's pods, metric values, replicas and history "
        "(format: docs/adapter.md#the-state-file); no Prometheus needed",
    )
    parser.add_argument(
        "--current-replicas",
        type=numbers.whole(low=0, high=2**31 - 1),
        help="current replica count (default: pods matching the selector)",
    )
    parser.add_argument(
        "--selector", help="scale target's label selector (default: from the target in the file)"
    )
    parser.add_argument(
        "--no-history",
        action="store_true",
        help="do not rebuild the controller's recent recommendations and scale events from Prometheus",
    )
    output.add_argument(parser, what="the explanation")


def _print(args: argparse.Namespace, ex: explain.Explanation) -> None:
    if output.structured(args):
        output.emit(explain.document(ex), args.output)
    else:
        print(explain.render(ex, wide=args.output == "wide"))


def _explain_offline(args: argparse.Namespace, spec: hpaspec.HpaSpec) -> int:
    """explain-hpa --state FILE: pods, values, replicas (and history, if given) from the file."""
    state = hpastate.load_state(args.state, spec)
    inputs = explain.Inputs(
        pods=list(state.pods),
        observations=list(state.observations),
        current=args.current_replicas if args.current_replicas is not None else state.current,
        status=state.status,
        history=state.history,
        now=state.now,
        sources=[f"pods, values and replicas from {args.state}"],
    )
    if state.history_given:
        inputs.sources.append(f"history from {args.state}")
    else:
        inputs.caveats.append(explain.no_history_caveat(spec, inputs) or "")
    _print(args, explain.explain(spec, inputs))
    return 0


def run(args: argparse.Namespace) -> int:
    spec = hpaspec.load_hpa(args.filename)
    if args.current_replicas is not None and args.current_replicas < 0:
        raise ConfigError(f"--current-replicas {args.current_replicas}: must be 0 or more")
    if args.state is not None:
        return _explain_offline(args, spec)
    if not args.prometheus_url:
        raise ConfigError("explain-hpa needs --prometheus-url, or --state FILE to answer offline")
    config = load_config(args.config)
    prometheus = options.open_prometheus(args, timeout=args.prometheus_timeout)
    pods_source: PodSource | None
    mode = args.pod_source or "prometheus"
    kube = KubeClient(kubeconfig=args.kubeconfig) if mode == "kubernetes" or args.kubeconfig else None
    if mode == "kubernetes" and kube is not None:
        k8s = KubernetesPodSource(kube)
        if not k8s.wait_synced(30):
            raise ConfigError("the pod list from the Kubernetes API did not arrive within 30 s")
        pods_source = k8s
    elif mode == "prometheus":
        pods_source = PrometheusPodSource(prometheus, ttl=60)
    else:
        pods_source = None
    try:
        values = MetricValues(
            config=lambda: config, prometheus=prometheus, pods=pods_source, max_value_age=args.max_value_age
        )
        selector, origin = explain.target_selector(spec, args.selector)
        if kube is not None:
            pods = explain.cluster_pod_states(kube, spec.namespace, selector)
        else:
            listed = pods_source.select(spec.namespace, selector) if pods_source is not None else []
            pods = explain.pod_states(listed)
        observations, pods = explain.observe(
            spec, values=values, prometheus=prometheus, selector=selector, pods=pods, kube=kube
        )
        current = (
            args.current_replicas
            if args.current_replicas is not None
            else sum(1 for p in pods if not p.deleting and p.phase not in ("Succeeded", "Failed"))
        )
        now = time.time()
        inputs = explain.Inputs(
            pods=pods,
            observations=observations,
            current=current,
            status=current,
            history=hpa.History(started=True),
            now=now,
            sources=[
                f"selector from {origin}; pods from "
                + (
                    "the Kubernetes API; Resource metrics from metrics.k8s.io"
                    if kube
                    else f"the {mode} pod source"
                ),
                f"values from {prometheus.url}, newer than {args.max_value_age:g}s",
            ],
        )
        found = 0
        if not args.no_history:
            window = replay.history_window(spec.model)
            line = timeline.fetch(
                spec,
                values=values,
                prometheus=prometheus,
                selector=selector,
                start=now - window,
                end=now - 15,
                step=15,
            )
            inputs.history, found = replay.recorded_history(spec.model, line, pods=pods, now=now)
            events = len(inputs.history.scale_up_events) + len(inputs.history.scale_down_events)
            if found:
                inputs.sources.append(
                    f"history: {found} recommendation(s) of the last {window}s recomputed from Prometheus range "
                    f"queries of the same metrics (15 s steps); {events} scale event(s) from {line.recorded_from}"
                )
        if not found:
            inputs.history = hpa.History(started=True)
            inputs.caveats.append(explain.no_history_caveat(spec, inputs) or "")
        if kube is not None:
            explain.check_hpa_status(spec, inputs, kube=kube)
        _print(args, explain.explain(spec, inputs))
    finally:
        if pods_source is not None:
            pods_source.close()
        prometheus.close()
    return 0
