"""The chart rendered by the real Helm engine (helm-python-sdk): lint, Kubernetes schemas, and what each
template renders for which values."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_python.chart import Chart, lint
from helm_python.errors import HelmRenderError

Render = Callable[[dict[str, Any]], list[dict[str, Any]]]
RenderChart = Callable[..., list[dict[str, Any]]]
NAMESPACE = "apps"  # the namespace the conftest fixtures render into

# Chart.yaml says kubeVersion >=1.27; 1.37 is the newest release kubernetes-validate ships schemas for.
OLDEST_KUBE = "1.27.0"
NEWEST_KUBE = kubernetes_validate.utils.latest_version()
CI_VALUES = sorted((Path(__file__).resolve().parents[2] / "helm/elector/ci").glob("*-values.yaml"))

# kubernetes-validate only knows built-in kinds. The Prometheus operator's kinds are checked against this
# small schema instead: the envelope plus the spec fields this chart uses, no unknown fields allowed.
_MONITOR_ENDPOINT = {
    "type": "object",
    "additionalProperties": False,
    "required": ["port"],
    "properties": {
        "port": {"type": "string"},
        "path": {"type": "string"},
        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
    },
}
_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["matchLabels"],
    "properties": {
        "matchLabels": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}}
    },
}
_NAMESPACE_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}},
}
_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["alert", "expr"],
    "properties": {
        "alert": {"type": "string"},
        "expr": {"type": "string"},
        "for": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}
MONITORING_SPECS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector", "endpoints"],
        "properties": {
            "selector": _SELECTOR,
            "namespaceSelector": _NAMESPACE_SELECTOR,
            "endpoints": {"type": "array", "minItems": 1, "items": _MONITOR_ENDPOINT},
        },
    },
    "PodMonitor": {
        "type": "object",
        "additionalProperties": False,
        "required": ["selector", "podMetricsEndpoints"],
        "properties": {
            "selector": _SELECTOR,
            "namespaceSelector": _NAMESPACE_SELECTOR,
            "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _MONITOR_ENDPOINT},
        },
    },
    "PrometheusRule": {
        "type": "object",
        "additionalProperties": False,
        "required": ["groups"],
        "properties": {
            "groups": {
                "type": "array",
                "minItems": 1,
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name", "rules"],
                    "properties": {
                        "name": {"type": "string"},
                        "interval": {"type": "string"},
                        "rules": {"type": "array", "minItems": 1, "items": _RULE},
                    },
                },
            }
        },
    },
}


def validate_monitoring(doc: dict[str, Any]) -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"enum": sorted(MONITORING_SPECS)},
            "metadata": {
                "type": "object",
                "required": ["name", "namespace", "labels"],
                "properties": {"name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}},
            },
            "spec": MONITORING_SPECS[doc["kind"]],
        },
    }
    jsonschema.validate(doc, schema)


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, (
        f"expected one {kind} {name or ''}, got {[d['metadata']['name'] for d in matches]}"
    )
    return matches[0]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def container(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


def test_ci_value_sets_exist() -> None:
    names = {p.name for p in CI_VALUES}
    assert {
        "default-values.yaml",
        "full-values.yaml",
        "gate-on-leadership-values.yaml",
        "leader-election-values.yaml",
    } <= names


@pytest.mark.parametrize("values_file", CI_VALUES, ids=lambda p: p.name)
@pytest.mark.parametrize("kube_version", [OLDEST_KUBE, NEWEST_KUBE])
def test_ci_values_lint_and_validate(
    render: Render,
    chart_dir: Path,
    values_file: Path,
    kube_version: str,
    validate_leader_election: Callable[[dict[str, Any]], None],
) -> None:
    values = yaml.safe_load(values_file.read_text()) or {}
    result = lint(chart_dir, values, strict=True, kube_version=f"v{kube_version}")
    # severity 1 is INFO ("icon is recommended"); strict lint fails on warnings (2) and errors (3)
    assert result["errors"] == [] and all(m["severity"] < 2 for m in result["messages"]), result
    docs = render(values)
    assert docs
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            validate_monitoring(doc)
        elif doc["apiVersion"] == "elector.io/v1alpha1":  # the chart's own CRD (crds/), strictly
            validate_leader_election(doc)
        else:
            kubernetes_validate.validate(doc, kube_version, strict=True)


def test_defaults_render_workload_objects(render: Render) -> None:
    docs = render({})
    assert kinds(docs) == ["Deployment", "PodDisruptionBudget", "Service", "Service", "ServiceAccount"]
    deployment = find(docs, "Deployment", "demo-elector")
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["spec"]["replicas"] == 3
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "elector", "app.kubernetes.io/instance": "demo"}
    pod = deployment["spec"]["template"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["serviceAccountName"] == "demo-elector"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert [c["name"] for c in pod["spec"]["containers"]] == ["app", "elector"]
    assert container(docs, "app")["image"] == "registry.k8s.io/pause:3.9"
    assert "volumes" not in pod["spec"]
    pdb = find(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}


def test_sidecar_defaults(render: Render) -> None:
    sidecar = container(render({}), "elector")
    assert sidecar["image"] == "ghcr.io/elector-dev/elector:0.1.0"
    assert sidecar["args"] == ["run"]
    assert env_of(sidecar) == {
        "POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
        "ELECTOR_REDIS_URL": "redis://redis:6379/0",
        "ELECTOR_LOCK": "demo-elector",
        "ELECTOR_TTL": "10s",
        "ELECTOR_HTTP_ADDRESS": "0.0.0.0:8080",
        "ELECTOR_LOG_FORMAT": "json",
        "ELECTOR_LOG_LEVEL": "info",
    }
    assert sidecar["ports"] == [{"name": "elector-http", "containerPort": 8080, "protocol": "TCP"}]
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "elector-http"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "elector-http"}
    assert sidecar["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "5"]
    assert "volumeMounts" not in sidecar


@pytest.mark.parametrize("name", ["app", "elector"])
def test_security_contexts(render: Render, name: str) -> None:
    docs = render({})
    ctx = container(docs, name)["securityContext"]
    assert ctx["runAsNonRoot"] is True
    assert ctx["runAsUser"] == 10001
    assert ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False
    assert ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    pod_ctx = find(docs, "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert pod_ctx["runAsNonRoot"] is True and pod_ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container(docs, name)["resources"]["limits"]["memory"]


def test_grace_period_covers_prestop_and_release(render: Render) -> None:
    pod = find(render({}), "Deployment")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 5 + 10
    with pytest.raises(HelmRenderError, match="terminationGracePeriodSeconds"):
        render({"workload": {"terminationGracePeriodSeconds": 10}})


def test_the_shutdown_linger_reaches_the_sidecar_and_the_grace_period_covers_it(render: Render) -> None:
    assert "ELECTOR_SHUTDOWN_LINGER" not in env_of(container(render({}), "elector"))
    values = {"sidecar": {"shutdownLingerSeconds": 30}, "workload": {"terminationGracePeriodSeconds": 45}}
    docs = render(values)
    assert env_of(container(docs, "elector"))["ELECTOR_SHUTDOWN_LINGER"] == "30s"
    with pytest.raises(HelmRenderError, match="shutdownLingerSeconds"):
        render({"sidecar": {"shutdownLingerSeconds": 30}})  # 30 s grace < 5 + 30 + 10


def test_optional_daemon_settings_only_when_set(render: Render) -> None:
    sidecar = container(
        render(
            {
                "elector": {
                    "renewInterval": "2s",
                    "renewDeadline": "5s",
                    "requestTimeout": "300ms",
                    "lock": "x",
                }
            }
        ),
        "elector",
    )
    env = env_of(sidecar)
    assert env["ELECTOR_RENEW_INTERVAL"] == "2s"
    assert env["ELECTOR_RENEW_DEADLINE"] == "5s"
    assert env["ELECTOR_REQUEST_TIMEOUT"] == "300ms"
    assert env["ELECTOR_LOCK"] == "x"


def test_redis_password_from_existing_secret(render: Render) -> None:
    values = {"elector": {"redis": {"existingSecret": "redis-auth", "existingSecretPasswordKey": "pw"}}}
    docs = render(values)
    sidecar = container(docs, "elector")
    assert env_of(sidecar)["ELECTOR_REDIS_PASSWORD_FILE"] == "/etc/elector/redis/password"
    assert sidecar["volumeMounts"] == [
        {"name": "elector-redis-password", "mountPath": "/etc/elector/redis", "readOnly": True}
    ]
    volumes = find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert volumes == [
        {
            "name": "elector-redis-password",
            "secret": {
                "secretName": "redis-auth",
                "defaultMode": 0o444,
                "items": [{"key": "pw", "path": "password"}],
            },
        }
    ]
    assert "ELECTOR_REDIS_PASSWORD" not in env_of(sidecar)  # only the file, never the password itself


def test_image_tag_and_digest(render: Render) -> None:
    assert (
        container(render({"image": {"tag": "1.2.3"}}), "elector")["image"]
        == "ghcr.io/elector-dev/elector:1.2.3"
    )
    digest = "sha256:" + "a" * 64
    image = container(render({"image": {"digest": digest, "tag": "1.2.3"}}), "elector")["image"]
    assert image == f"ghcr.io/elector-dev/elector@{digest}"


def test_leader_service_default_selects_operator_label(render: Render) -> None:
    docs = render({})
    service = find(docs, "Service", "demo-elector-leader")
    assert service["spec"]["publishNotReadyAddresses"] is False
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/name": "elector",
        "app.kubernetes.io/instance": "demo",
        "elector.io/leader": "true",
    }
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert container(docs, "app")["ports"][0]["name"] == "http"


def test_gate_on_leadership_switches_readiness_and_leader_service(render: Render) -> None:
    docs = render({"readiness": {"gateOnLeadership": True}})
    assert container(docs, "elector")["readinessProbe"]["httpGet"] == {
        "path": "/leader",
        "port": "elector-http",
    }
    assert container(docs, "elector")["livenessProbe"]["httpGet"]["path"] == "/healthz"
    selector = find(docs, "Service", "demo-elector-leader")["spec"]["selector"]
    assert "elector.io/leader" not in selector
    assert selector == find(docs, "Deployment")["spec"]["selector"]["matchLabels"]


def test_metrics_service_is_headless_on_the_sidecar_port(render: Render) -> None:
    service = find(render({}), "Service", "demo-elector-metrics")
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "elector-http", "port": 8080, "targetPort": "elector-http", "protocol": "TCP"}
    ]


def test_monitoring_objects_need_the_api_or_force(render: Render) -> None:
    enabled = {k: {"enabled": True} for k in ("serviceMonitor", "podMonitor", "prometheusRule")}
    # the offline engine reports no monitoring.coreos.com/v1 API: enabled alone renders nothing
    assert kinds(render(enabled)) == kinds(render({}))
    forced = {k: {"enabled": True, "force": True} for k in enabled}
    docs = render(forced)
    service_monitor = find(docs, "ServiceMonitor")
    metrics_service = find(docs, "Service", "demo-elector-metrics")
    assert (
        service_monitor["spec"]["selector"]["matchLabels"].items()
        <= metrics_service["metadata"]["labels"].items()
    )
    assert service_monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == "metrics"
    assert service_monitor["spec"]["endpoints"][0]["port"] == "elector-http"
    pod_monitor = find(docs, "PodMonitor")
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "elector-http"
    assert (
        pod_monitor["spec"]["selector"]["matchLabels"]
        == find(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    )
    # enabled and forced, but off: nothing
    off = {k: {"enabled": False, "force": True} for k in enabled}
    assert kinds(render(off)) == kinds(render({}))


def test_monitoring_templates_check_the_api(chart_dir: Path) -> None:
    # The engine here cannot report extra APIs, so the capability branch is checked in the source.
    helpers = (chart_dir / "templates/_helpers.tpl").read_text()
    assert '.Capabilities.APIVersions.Has "monitoring.coreos.com/v1"' in helpers
    for name in ("servicemonitor.yaml", "podmonitor.yaml", "prometheusrule.yaml"):
        assert 'include "elector.monitoringApi"' in (chart_dir / "templates" / name).read_text()


def test_prometheus_rule_wraps_the_alerts_file(render: Render, chart_dir: Path) -> None:
    docs = render({"prometheusRule": {"enabled": True, "force": True, "labels": {"release": "kps"}}})
    rule = find(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    expected = yaml.safe_load((chart_dir / "files/alerts.rules.yaml").read_text())
    assert rule["spec"]["groups"] == expected["groups"]
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"ElectorNoLeader", "ElectorMultipleLeaders", "ElectorRedisUnreachable"} <= alerts


def test_dashboard_configmap(render: Render, chart_dir: Path) -> None:
    docs = render({"dashboard": {"enabled": True, "namespace": "monitoring"}})
    configmap = find(docs, "ConfigMap", "demo-elector-dashboard")
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"]["elector.json"] == (chart_dir / "files/dashboard.json").read_text().rstrip("\n")
    assert not [d for d in render({}) if d["kind"] == "ConfigMap"]


def test_network_policy(render: Render) -> None:
    assert not [d for d in render({}) if d["kind"] == "NetworkPolicy"]
    docs = render({"networkPolicy": {"enabled": True, "egress": {"redisPort": 6380}}})
    policy = find(docs, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    ingress_ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert ingress_ports == ["elector-http", "http"]
    egress_ports = [p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]]
    assert egress_ports == [53, 53, 6380]
    open_egress = find(
        render({"networkPolicy": {"enabled": True, "egress": {"enabled": False}}}), "NetworkPolicy"
    )
    assert open_egress["spec"]["policyTypes"] == ["Ingress"] and "egress" not in open_egress["spec"]


def test_pdb_min_available(render: Render) -> None:
    pdb = find(
        render({"podDisruptionBudget": {"minAvailable": 2, "maxUnavailable": ""}}), "PodDisruptionBudget"
    )
    assert pdb["spec"]["minAvailable"] == 2 and "maxUnavailable" not in pdb["spec"]
    with pytest.raises(HelmRenderError, match="only one of minAvailable and maxUnavailable"):
        render({"podDisruptionBudget": {"minAvailable": 2}})


def test_workload_disabled_renders_no_workload_objects(render: Render) -> None:
    docs = render({"workload": {"enabled": False}, "networkPolicy": {"enabled": True}})
    assert docs == []


def test_names_and_labels(render: Render) -> None:
    docs = render({"fullnameOverride": "jobs", "commonLabels": {"team": "platform"}})
    assert {d["metadata"]["name"] for d in docs} == {"jobs", "jobs-leader", "jobs-metrics"}
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["team"] == "platform"
        assert labels["helm.sh/chart"] == "elector-0.1.0"
        assert labels["app.kubernetes.io/version"] == "0.1.0"
    assert env_of(container(docs, "elector"))["ELECTOR_LOCK"] == "jobs"
    long_name = "x" * 70
    for doc in render({"fullnameOverride": long_name}):
        assert len(doc["metadata"]["name"]) <= 63


def test_release_name_containing_chart_name(chart: Chart, render_chart: RenderChart) -> None:
    docs = render_chart(chart, {}, name="elector")
    assert find(docs, "Deployment")["metadata"]["name"] == "elector"


def test_notes_tell_the_truth_about_the_leader_service(chart: Chart) -> None:
    notes = chart.render({}, name="demo", namespace=NAMESPACE)["elector/templates/NOTES.txt"]
    assert "NO endpoints" in notes and "elector.io/leader=true" in notes and "GET /readyz" in notes
    gated = chart.render({"readiness": {"gateOnLeadership": True}}, name="demo", namespace=NAMESPACE)
    gated_notes = gated["elector/templates/NOTES.txt"]
    assert "only the leader is ready" in gated_notes and "NO endpoints" not in gated_notes
    with_password = {"elector": {"redis": {"url": "rediss://user:hunter2@redis.data:6380/2"}}}
    notes_with_password = chart.render(with_password, name="demo", namespace=NAMESPACE)[
        "elector/templates/NOTES.txt"
    ]
    assert "rediss://redis.data:6380/2" in notes_with_password and "hunter2" not in notes_with_password
    forced = chart.render({"prometheusRule": {"enabled": True}}, name="demo", namespace=NAMESPACE)
    assert "PrometheusRule" in forced["elector/templates/NOTES.txt"]
    assert "skipped" in forced["elector/templates/NOTES.txt"]


def test_sidecar_template_in_a_parent_chart(
    tmp_path: Path, chart_dir: Path, render_chart: RenderChart
) -> None:
    """The docs/helm.md example: a chart depending on elector adds the sidecar to its own Deployment."""
    parent = tmp_path / "billing"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(chart_dir, parent / "charts" / "elector")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: billing\nversion: 1.0.0\nappVersion: '9.9.9'\n"
        "dependencies:\n  - name: elector\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text(
        "elector:\n  workload:\n    enabled: false\n  elector:\n    lock: billing-cron\n"
        "    redis:\n      url: redis://redis.data:6379/0\n      existingSecret: redis-auth\n"
    )
    docs_md = (chart_dir.parents[1] / "docs" / "helm.md").read_text()
    example = docs_md.split("```yaml\n# templates/deployment.yaml\n")[1].split("```")[0]
    (parent / "templates" / "deployment.yaml").write_text(example)
    docs = render_chart(Chart.load(parent), {})
    deployment = find(docs, "Deployment", "billing")
    pod = deployment["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "elector")
    assert (
        sidecar["image"] == "ghcr.io/elector-dev/elector:0.1.0"
    )  # the elector chart's appVersion, not 9.9.9
    env = env_of(sidecar)
    assert env["ELECTOR_LOCK"] == "billing-cron"
    assert env["ELECTOR_REDIS_URL"] == "redis://redis.data:6379/0"
    assert env["ELECTOR_REDIS_PASSWORD_FILE"] == "/etc/elector/redis/password"
    assert pod["volumes"][0]["secret"]["secretName"] == "redis-auth"
    for kube_version in (OLDEST_KUBE, NEWEST_KUBE):
        kubernetes_validate.validate(deployment, kube_version, strict=True)
