"""Chart values an operator sets on day two reach the objects: log flags, install modes
(adapter.customMetrics beside externalMetrics and externalScaler), the rightsizer's config merged
over the chart's connection settings (timezone, report schedule, price, retention, replicas with
leader election), the checksum that rolls its pods, and each component's extension points
(extraEnv/Volumes/VolumeMounts/Args, security contexts, ServiceAccount annotations, topology
spread, update strategy, ServiceMonitor labels and relabelings, the exporter's counters CSV)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from exporter.commands.cli import parse_settings
from rightsizer.serve.config import parse as parse_serve
from tests.deploy.test_helm import CHART, run_helm
from tests.deploy.test_manifests import pod_spec

Objects = dict[tuple[str, str], dict[str, Any]]


def render(*sets: str, json_sets: tuple[str, ...] = ()) -> Objects:
    args = ["template", "gpupilot", str(CHART), "--namespace", "gpupilot"]
    for s in sets:
        args += ["--set", s]
    for s in json_sets:
        args += ["--set-json", s]
    res = run_helm(*args)
    assert res.returncode == 0, res.stderr
    return {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(res.stdout) if o}


def container(objs: Objects, kind: str, name: str) -> dict[str, Any]:
    (only,) = pod_spec(objs[(kind, name)])["containers"]
    return only  # type: ignore[no-any-return]


def serve_config(objs: Objects) -> dict[str, Any]:
    return yaml.safe_load(objs[("ConfigMap", "gpupilot-rightsizer")]["data"]["rightsizer.yaml"])  # type: ignore[no-any-return]


WORKLOADS = {
    "exporter": ("DaemonSet", "gpupilot-exporter"),
    "adapter": ("Deployment", "gpupilot-adapter"),
    "rightsizer": ("Deployment", "gpupilot-rightsizer"),
}


@pytest.mark.slow
def test_log_format_and_level_become_each_services_flags() -> None:
    defaults = render()
    sets = [f"{c}.logFormat=json,{c}.logLevel=debug" for c in WORKLOADS]
    objs = render(*sets)
    for component, (kind, name) in WORKLOADS.items():
        assert not {a for a in container(defaults, kind, name)["args"] if a.startswith("--log-")}
        args = container(objs, kind, name)["args"]
        assert "--log-format=json" in args and "--log-level=debug" in args, component
    exporter_args = container(objs, "DaemonSet", "gpupilot-exporter")["args"]
    settings = parse_settings(exporter_args, environ={"NODE_NAME": "n"})
    assert (settings.log_format, settings.log_level) == ("json", "debug")


@pytest.mark.slow
def test_the_schema_refuses_unknown_log_settings() -> None:
    res = run_helm("template", "gpupilot", str(CHART), "--set", "adapter.logFormat=logfmt")
    assert res.returncode != 0 and "/adapter/logFormat" in res.stderr


def apiservices(objs: Objects) -> set[str]:
    return {name for kind, name in objs if kind == "APIService"}


@pytest.mark.slow
def test_install_modes() -> None:
    """custom.metrics.k8s.io, external.metrics.k8s.io and KEDA's scaler are switched one by one: a
    scaler-only install beside prometheus-adapter registers no APIService and no `helm test` Pod."""
    assert apiservices(render()) == {"v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io"}
    scaler = render("adapter.customMetrics=false", "adapter.externalScaler.enabled=true")
    assert apiservices(scaler) == set()
    assert ("Pod", "gpupilot-adapter-test") not in scaler
    assert any(p["name"] == "keda" for p in container(scaler, "Deployment", "gpupilot-adapter")["ports"])
    external = render("adapter.customMetrics=false", "adapter.externalMetrics=true")
    assert apiservices(external) == {"v1beta1.external.metrics.k8s.io"}
    assert external[("Pod", "gpupilot-adapter-test")]["spec"]["containers"][0]["args"][1:] == [
        "external.metrics.k8s.io/v1beta1"
    ]


@pytest.mark.slow
def test_rightsizer_values_and_a_custom_config_merge() -> None:
    """rightsizer.config no longer replaces the chart's config: the Prometheus URL and auth stay, the
    values for time zone, schedule, price, retention and replicas land, and a null removes a key."""
    custom = "plan:\n  every: 2h\nreport: null\n"
    objs = render(
        "prometheus.url=https://thanos.example:9091",
        "prometheusAuth.bearerTokenFile=/var/run/secrets/kubernetes.io/serviceaccount/token",
        "rightsizer.timezone=Europe/Berlin",
        "rightsizer.report.schedule=mon-fri 07:30",
        "rightsizer.report.pricePerGpuHour=2.5",
        "rightsizer.report.retention.count=4",
        "rightsizer.report.retention.maxAge=90d",
        "rightsizer.replicas=2",
    )
    config = serve_config(objs)
    assert config["prometheus_url"] == "https://thanos.example:9091"
    assert config["prometheus_bearer_token_file"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert config["timezone"] == "Europe/Berlin"
    assert config["report"] == {
        "schedule": "mon-fri 07:30",
        "window": "7d",
        "price_per_gpu_hour": 2.5,
        "retention": {"count": 4, "max_age": "90d"},
    }
    assert config["auto_apply"]["leader_election"] == {"namespace": "gpupilot"}
    deployment = objs[("Deployment", "gpupilot-rightsizer")]
    assert deployment["spec"]["replicas"] == 2 and deployment["spec"]["strategy"] == {"type": "RollingUpdate"}
    parsed = parse_serve({**config, "prometheus_bearer_token_file": None}, source="rendered")
    assert parsed.report is not None and parsed.report.price_per_gpu_hour == 2.5
    assert parsed.report.retention.count == 4 and parsed.report.retention.max_age_s == 90 * 86400
    merged = serve_config(render("prometheus.url=https://thanos.example:9091", f"rightsizer.config={custom}"))
    assert merged["prometheus_url"] == "https://thanos.example:9091"
    assert merged["plan"]["every"] == "2h" and "report" not in merged
    assert merged["auto_apply"]["operator_namespace"] == "gpu-operator"
    as_map = serve_config(render(json_sets=('rightsizer.config={"plan": {"every": "3h"}}',)))
    assert as_map["plan"] == {"every": "3h", "window": "7d"}


@pytest.mark.slow
def test_a_config_that_is_not_yaml_fails_in_one_line() -> None:
    res = run_helm("template", "gpupilot", str(CHART), "--set", "rightsizer.config=a: [b")
    assert res.returncode != 0
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert "rightsizer.config is not YAML" in line


@pytest.mark.slow
def test_a_changed_config_rolls_the_rightsizer() -> None:
    """helm upgrade of prometheus.url (or anything in serve's config) changes the pod template's
    checksum, so the Deployment replaces its pods: serve reads its config at start."""

    def checksum(*sets: str) -> str:
        meta = render(*sets)[("Deployment", "gpupilot-rightsizer")]["spec"]["template"]["metadata"]
        return meta["annotations"]["checksum/config"]  # type: ignore[no-any-return]

    first = checksum()
    assert first == checksum()  # deterministic: GitOps diffs stay quiet
    assert checksum("prometheus.url=http://other:9090") != first
    assert checksum("rightsizer.autoApply.enabled=true") != first
    spec = pod_spec(render()[("Deployment", "gpupilot-rightsizer")])
    assert spec["terminationGracePeriodSeconds"] == 1800


EXTRAS = {
    "extraEnv": '[{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]',
    "extraVolumes": '[{"name": "extra-ca", "configMap": {"name": "corp-ca"}}]',
    "extraVolumeMounts": '[{"name": "extra-ca", "mountPath": "/etc/corp-ca", "readOnly": true}]',
    "extraArgs": '["--help-is-not-run"]',
    "securityContext": '{"seLinuxOptions": {"type": "spc_t"}, "readOnlyRootFilesystem": true}',
    "podSecurityContext": '{"supplementalGroups": [1000]}',
    "serviceAccount": '{"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/gpu"}}',
    "updateStrategy": '{"rollingUpdate": {"maxUnavailable": 2}}',
}


@pytest.mark.slow
@pytest.mark.parametrize("component", sorted(WORKLOADS))
def test_each_component_can_be_extended(component: str) -> None:
    kind, name = WORKLOADS[component]
    objs = render(json_sets=tuple(f"{component}.{k}={v}" for k, v in EXTRAS.items()))
    spec = pod_spec(objs[(kind, name)])
    (c,) = spec["containers"]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in c["env"]
    assert {"name": "extra-ca", "configMap": {"name": "corp-ca"}} in spec["volumes"]
    assert {"name": "extra-ca", "mountPath": "/etc/corp-ca", "readOnly": True} in c["volumeMounts"]
    assert c["args"][-1] == "--help-is-not-run"
    assert c["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False  # the chart's own stay
    assert spec["securityContext"]["supplementalGroups"] == [1000]
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sa = objs[("ServiceAccount", name)]
    assert sa["metadata"]["annotations"] == {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/gpu"}
    strategy = objs[(kind, name)]["spec"].get("updateStrategy") or objs[(kind, name)]["spec"]["strategy"]
    assert strategy["rollingUpdate"]["maxUnavailable"] == 2


@pytest.mark.slow
def test_topology_spread_and_service_monitor_settings() -> None:
    spread = '[{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "gpupilot-adapter"}}}]'
    relabel = '[{"targetLabel": "cluster", "replacement": "eu-1"}]'
    sets = [f"adapter.topologySpreadConstraints={spread}"]
    for component in WORKLOADS:
        sets += [
            f"{component}.serviceMonitor.labels={json.dumps({'team': 'gpu'})}",
            f"{component}.serviceMonitor.relabelings={relabel}",
            f"{component}.serviceMonitor.metricRelabelings={relabel}",
        ]
    objs = render(json_sets=tuple(sets))
    assert pod_spec(objs[("Deployment", "gpupilot-adapter")])["topologySpreadConstraints"] == json.loads(
        spread
    )
    for _kind, name in WORKLOADS.values():
        monitor = objs[("ServiceMonitor", name)]
        assert monitor["metadata"]["labels"]["team"] == "gpu"
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["relabelings"][-1] == {"targetLabel": "cluster", "replacement": "eu-1"}
        assert endpoint["metricRelabelings"][-1] == {"targetLabel": "cluster", "replacement": "eu-1"}
    exporter = objs[("ServiceMonitor", "gpupilot-exporter")]["spec"]["endpoints"][0]
    assert exporter["relabelings"][0]["targetLabel"] == "node"  # the chart's come first


@pytest.mark.slow
def test_counters_csv_from_a_configmap() -> None:
    csv = "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n"
    inline = render(json_sets=(f"exporter.counters.csv={json.dumps(csv)}",))
    cm = inline[("ConfigMap", "gpupilot-exporter-counters")]
    assert cm["data"]["counters.csv"].strip() == csv.strip()
    args = container(inline, "DaemonSet", "gpupilot-exporter")["args"]
    assert "--collectors=/etc/gpupilot-exporter-counters/counters.csv" in args
    own = render("exporter.counters.configMap=my-counters", "exporter.counters.csvKey=dcp.csv")
    assert ("ConfigMap", "gpupilot-exporter-counters") not in own
    spec = pod_spec(own[("DaemonSet", "gpupilot-exporter")])
    assert {"name": "counters", "configMap": {"name": "my-counters"}} in spec["volumes"]
    assert "--collectors=/etc/gpupilot-exporter-counters/dcp.csv" in spec["containers"][0]["args"]


def alerts(objs: Objects) -> dict[str, dict[str, Any]]:
    rule = objs[("PrometheusRule", "gpupilot-alerts")]
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}


@pytest.mark.slow
def test_alerts_can_be_switched_off_tuned_labelled_and_pointed_at_your_runbooks() -> None:
    default = alerts(render())
    tuned = alerts(
        render(
            "monitoring.prometheusRules.runbookBaseUrl=https://wiki.example/gpu/",
            json_sets=(
                'monitoring.prometheusRules.alerts={"GPULowUtilization": {"enabled": false}, '
                '"GPUHighTemperature": {"threshold": 80, "for": "10m", "severity": "critical", "labels": {"team": "infra"}}, '
                '"GPUAdapterCertificateExpiring": {"threshold": 30}}',
                'monitoring.prometheusRules.extraAlertLabels={"cluster": "eu-1"}',
            ),
        )
    )
    assert set(default) - set(tuned) == {"GPULowUtilization"}
    hot = tuned["GPUHighTemperature"]
    assert hot["expr"].strip().endswith("> 80") and default["GPUHighTemperature"]["expr"].strip().endswith(
        "> 85"
    )
    assert hot["for"] == "10m" and hot["labels"] == {
        "severity": "critical",
        "team": "infra",
        "cluster": "eu-1",
    }
    assert "< 30 * 86400" in tuned["GPUAdapterCertificateExpiring"]["expr"]
    assert tuned["GPUExporterDown"]["labels"] == {"severity": "critical", "cluster": "eu-1"}
    assert all(
        a["annotations"]["runbook_url"].startswith("https://wiki.example/gpu/") for a in tuned.values()
    )
    assert tuned["GPULost"]["annotations"]["runbook_url"] == "https://wiki.example/gpu/gpulost.md"


@pytest.mark.slow
def test_a_threshold_for_an_alert_without_one_fails_in_one_line() -> None:
    res = run_helm(
        "template", "gpupilot", str(CHART), "--set-json",
        'monitoring.prometheusRules.alerts={"GPULost": {"threshold": 2}}',
    )  # fmt: skip
    assert res.returncode != 0
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("Error:")]
    assert "monitoring.prometheusRules.alerts.GPULost.threshold: this alert has no single threshold" in line


@pytest.mark.slow
def test_dashboard_label_and_folder() -> None:
    objs = render(
        "monitoring.dashboards.folder=Platform/GPU",
        "monitoring.dashboards.folderAnnotation=k8s-sidecar-target-directory",
        json_sets=('monitoring.dashboards.labels={"grafana_dashboard": null, "grafana-dashboards": "gpu"}',),
    )
    boards = [
        o
        for (kind, name), o in objs.items()
        if kind == "ConfigMap" and name.startswith("gpupilot-dashboard-")
    ]
    assert len(boards) == 6
    for board in boards:
        assert board["metadata"]["labels"]["grafana-dashboards"] == "gpu"
        assert "grafana_dashboard" not in board["metadata"]["labels"]
        assert board["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "Platform/GPU"}
    default = render()[("ConfigMap", "gpupilot-dashboard-gpupilot-health")]["metadata"]
    assert default["labels"]["grafana_dashboard"] == "1" and default["annotations"] == {
        "grafana_folder": "GPU"
    }


@pytest.mark.slow
def test_network_policy_sources_are_a_list() -> None:
    peer = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}}}
    objs = render(json_sets=(f"networkPolicy.metricsFrom=[{json.dumps(peer)}]",))
    for name in ("gpupilot-exporter", "gpupilot-rightsizer"):
        (rule,) = objs[("NetworkPolicy", name)]["spec"]["ingress"]
        assert rule["from"][-1] == peer and len(rule["from"]) == 2
    only = render(
        "networkPolicy.monitoringNamespace=", json_sets=(f"networkPolicy.metricsFrom=[{json.dumps(peer)}]",)
    )
    assert only[("NetworkPolicy", "gpupilot-exporter")]["spec"]["ingress"][0]["from"] == [peer]
    res = run_helm("template", "gpupilot", str(CHART), "--set", "networkPolicy.monitoringNamespace=")
    assert res.returncode != 0 and "no source may scrape the metrics" in res.stderr


@pytest.mark.slow
def test_an_existing_secret_for_gitops() -> None:
    """adapter.existingSecret: no Secret rendered, so every render is the same (Argo CD, helm-diff);
    the adapter mounts that Secret; the APIServices trust caBundle, or cert-manager's CA injector
    copies the Secret's ca.crt when none is given."""
    first = render("adapter.existingSecret=my-adapter-tls")
    assert first == render("adapter.existingSecret=my-adapter-tls")
    assert not [name for kind, name in first if kind == "Secret"]
    spec = pod_spec(first[("Deployment", "gpupilot-adapter")])
    (volume,) = [v for v in spec["volumes"] if v["name"] == "serving-cert"]
    assert volume["secret"]["secretName"] == "my-adapter-tls"
    for kind, name in first:
        if kind == "APIService":
            meta = first[(kind, name)]["metadata"]
            assert meta["annotations"] == {"cert-manager.io/inject-ca-from-secret": "gpupilot/my-adapter-tls"}
            assert "caBundle" not in first[(kind, name)]["spec"]
    monitor = first[("ServiceMonitor", "gpupilot-adapter")]["spec"]["endpoints"][0]
    assert monitor["tlsConfig"]["ca"]["secret"]["name"] == "my-adapter-tls"
    given = render("adapter.existingSecret=my-adapter-tls", "adapter.caBundle=LS0tLS1CRUdJTi0tLS0t")
    for kind, name in given:
        if kind == "APIService":
            assert given[(kind, name)]["spec"]["caBundle"] == "LS0tLS1CRUdJTi0tLS0t"
            assert "annotations" not in given[(kind, name)]["metadata"]
    res = run_helm(
        "template",
        "gpupilot",
        str(CHART),
        "--set",
        "adapter.existingSecret=x,adapter.certManager.enabled=true",
    )
    assert res.returncode != 0 and "choose one" in res.stderr


@pytest.mark.slow
def test_openshift_values_reach_thanos_querier_with_the_pods_token_and_service_ca() -> None:
    """values-openshift.yaml (the file users start from; ci/openshift.yaml is the same file, which
    tests/deploy/test_helm.py compares with deploy/overlays/openshift): thanos-querier on 9091 with the
    pod's token and OpenShift's service CA, the readers bound to cluster-monitoring-view, the adapter's
    ServiceMonitor authorised from a Secret (user-workload monitoring refuses bearerTokenFile)."""
    users = CHART / "values-openshift.yaml"
    assert users.read_text() == (CHART / "ci" / "openshift.yaml").read_text()
    res = run_helm("template", "gpupilot", str(CHART), "--namespace", "gpupilot", "-f", str(users))
    assert res.returncode == 0, res.stderr
    objs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(res.stdout) if o}
    sa = "/var/run/secrets/kubernetes.io/serviceaccount"
    args = container(objs, "Deployment", "gpupilot-adapter")["args"]
    assert "--prometheus-url=https://thanos-querier.openshift-monitoring.svc:9091" in args
    assert f"--prometheus-bearer-token-file={sa}/token" in args
    assert f"--prometheus-ca-file={sa}/service-ca.crt" in args
    config = serve_config(objs)
    assert config["prometheus_url"] == "https://thanos-querier.openshift-monitoring.svc:9091"
    assert config["prometheus_ca_file"] == f"{sa}/service-ca.crt"
    binding = objs[("ClusterRoleBinding", "gpupilot-prometheus-reader")]
    assert binding["roleRef"]["name"] == "cluster-monitoring-view"
    assert {s["name"] for s in binding["subjects"]} == {"gpupilot-adapter", "gpupilot-rightsizer"}
    (endpoint,) = objs[("ServiceMonitor", "gpupilot-adapter")]["spec"]["endpoints"]
    assert "bearerTokenFile" not in endpoint
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "gpupilot-adapter-metrics-scraper", "key": "token"},
    }
    token = objs[("Secret", "gpupilot-adapter-metrics-scraper")]
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": "gpupilot-adapter-metrics-scraper"
    }
    assert ("SecurityContextConstraints", "gpupilot-exporter") in objs


@pytest.mark.slow
def test_report_push_from_a_secret_and_to_a_claim() -> None:
    objs = render(
        "rightsizer.report.push.webhook.secretName=report-slack",
        "rightsizer.report.push.link=https://gpu.example/report/",
        "rightsizer.report.push.copyTo.existingClaim=report-archive",
    )
    push = serve_config(objs)["report"]["push"]
    assert push == {
        "webhook_url_file": "/etc/gpupilot-report-webhook/url",
        "format": "slack",
        "link": "https://gpu.example/report/",
        "copy_to": "/var/lib/gpupilot-report-archive",
    }
    spec = pod_spec(objs[("Deployment", "gpupilot-rightsizer")])
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["report-webhook"]["secret"]["secretName"] == "report-slack"
    assert volumes["report-archive"]["persistentVolumeClaim"]["claimName"] == "report-archive"
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    assert {"/etc/gpupilot-report-webhook", "/var/lib/gpupilot-report-archive"} <= mounts
    assert "push" not in serve_config(render())["report"]


@pytest.mark.slow
def test_a_second_release_under_its_own_prefix() -> None:
    """fullnameOverride (or nameOverride) renames every object and selector, cluster-wide ones too,
    and what points at them (the certificate's name, the APIServices' owner flag, the exporter's
    alert job); the names the services give what they make at run time and their commands stay."""
    import base64  # noqa: PLC0415

    from cryptography import x509  # noqa: PLC0415

    args = ["template", "gpupilot", str(CHART), "--namespace", "gpu"]
    res = run_helm(*args, "--set", "fullnameOverride=team-b,rightsizer.autoApply.enabled=true")
    assert res.returncode == 0, res.stderr
    objs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(res.stdout) if o}
    names = {name for _kind, name in objs}
    assert not {
        n for n in names if n.startswith(("gpupilot-exporter", "gpupilot-adapter", "gpupilot-rightsizer"))
    }
    assert {"team-b-exporter", "team-b-adapter", "team-b-rightsizer", "team-b-alerts"} <= names
    adapter = container(objs, "Deployment", "team-b-adapter")
    assert (
        adapter["command"] == ["gpupilot-adapter"]
        and "--apiservice-owner=gpu/team-b-adapter" in adapter["args"]
    )
    assert objs[("Deployment", "team-b-adapter")]["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "team-b-adapter"
    }
    cert = x509.load_pem_x509_certificate(
        base64.b64decode(objs[("Secret", "team-b-adapter-tls")]["data"]["tls.crt"])
    )
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName
    )
    assert "team-b-adapter.gpu.svc" in sans
    for kind, name in objs:
        if kind == "APIService":
            assert objs[(kind, name)]["spec"]["service"]["name"] == "team-b-adapter"
    serve = objs[("Role", "team-b-rightsizer-serve")]
    assert {n for r in serve["rules"] for n in r.get("resourceNames", [])} == {
        "gpupilot-rightsizer-leader",
        "gpupilot-rightsizer-ledger",
        "team-b-rightsizer",  # its own config: the emergency stop's annotations
    }
    lease = objs[("Role", "team-b-rightsizer-apply")]
    assert ["gpupilot-rightsizer-apply"] in [r.get("resourceNames") for r in lease["rules"]]
    rules = {
        r["alert"]: r
        for g in objs[("PrometheusRule", "team-b-alerts")]["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert ".*team-b-exporter.*" in rules["GPUExporterDown"]["expr"]
    policy = next(o for (k, _n), o in objs.items() if k == "ValidatingAdmissionPolicy")
    assert "system:serviceaccount:gpu:team-b-rightsizer" in json.dumps(policy)
    by_name = run_helm(*args[:1], "team", *args[2:], "--set", "nameOverride=gpu")
    assert by_name.returncode == 0, by_name.stderr
    assert "name: team-gpu-adapter\n" in by_name.stdout
