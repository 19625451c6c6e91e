"""The chart helm/elector rendered by the real Helm engine (helm-python-sdk), assembled with its library
dependency helm/elector-sidecar (conftest.py): lint, Kubernetes schemas, and what each template renders for
which values -- the NetworkPolicy's Redis ports, the PodDisruptionBudget and readiness that never block a
drain, the extension points, the app's ELECTOR_LEADER_URL."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm_python.chart import Chart, lint
from helm_python.errors import HelmRenderError, HelmValuesError

from tests.support.monitoring_schema import validate_monitoring

Render = Callable[..., list[dict[str, Any]]]
RenderChart = Callable[..., list[dict[str, Any]]]
NAMESPACE = "apps"  # the namespace the conftest fixtures render into

# Chart.yaml says kubeVersion >=1.27; 1.37 is the newest release kubernetes-validate ships schemas for.
OLDEST_KUBE = "1.27.0"
NEWEST_KUBE = kubernetes_validate.utils.latest_version()
CI_VALUES = sorted((Path(__file__).resolve().parents[2] / "helm/elector/ci").glob("*-values.yaml"))


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
        "extensions-values.yaml",
    } <= names


@pytest.mark.parametrize("values_file", CI_VALUES, ids=lambda p: p.name)
@pytest.mark.parametrize("kube_version", [OLDEST_KUBE, NEWEST_KUBE])
def test_ci_values_lint_and_validate(
    render: Render,
    built_chart_dir: Path,
    values_file: Path,
    kube_version: str,
    validate_leader_election: Callable[[dict[str, Any]], None],
) -> None:
    values = yaml.safe_load(values_file.read_text()) or {}
    result = lint(built_chart_dir, values, strict=True, kube_version=f"v{kube_version}")
    # severity 1 is INFO ("icon is recommended"); strict lint fails on warnings (2) and errors (3)
    assert result["errors"] == [] and all(m["severity"] < 2 for m in result["messages"]), result
    docs = render(values, kube_version=kube_version)
    assert docs
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        if doc["apiVersion"] == "monitoring.coreos.com/v1":
            validate_monitoring(doc)
        elif doc["apiVersion"] == "elector.io/v1alpha1":  # the elector-operator chart's CRD, strictly
            validate_leader_election(doc)
        else:
            kubernetes_validate.validate(doc, kube_version, strict=True)


def test_defaults_render_workload_objects(render: Render) -> None:
    docs = render({})
    assert kinds(docs) == ["Deployment", "Pod", "PodDisruptionBudget", "Service", "Service", "ServiceAccount"]
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
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": selector},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }


def test_sidecar_defaults(render: Render) -> None:
    sidecar = container(render({}), "elector")
    assert sidecar["image"] == "ghcr.io/elector-dev/elector:0.2.0"
    assert sidecar["args"] == ["run"]
    assert env_of(sidecar) == {
        "POD_NAME": {"fieldRef": {"fieldPath": "metadata.name"}},
        "ELECTOR_REDIS_URL": "redis://redis:6379/0",
        "ELECTOR_LOCK": "apps/demo-elector",
        "ELECTOR_PREDECESSOR_LOCK": "demo-elector",  # chart 0.1.0's name of the lock
        "ELECTOR_TTL": "10s",
        "ELECTOR_HTTP_ADDRESS": "0.0.0.0:9809",
        "ELECTOR_LOG_FORMAT": "json",
        "ELECTOR_LOG_LEVEL": "info",
    }
    assert sidecar["ports"] == [{"name": "elector-http", "containerPort": 9809, "protocol": "TCP"}]
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "elector-http"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "elector-http"}
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
    values = {"elector": {"shutdownLingerSeconds": 30}, "workload": {"terminationGracePeriodSeconds": 45}}
    docs = render(values)
    assert env_of(container(docs, "elector"))["ELECTOR_SHUTDOWN_LINGER"] == "30s"
    with pytest.raises(HelmRenderError, match="shutdownLingerSeconds"):
        render({"elector": {"shutdownLingerSeconds": 30}})  # 30 s grace < 5 + 30 + 10


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
        container(render({"elector": {"image": {"tag": "1.2.3"}}}), "elector")["image"]
        == "ghcr.io/elector-dev/elector:1.2.3"
    )
    digest = "sha256:" + "a" * 64
    image = container(render({"elector": {"image": {"digest": digest, "tag": "1.2.3"}}}), "elector")["image"]
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


GATED = {"elector": {"gateOnLeadership": True}, "podDisruptionBudget": {"maxUnavailable": "100%"}}


def test_gate_on_leadership_switches_readiness_and_leader_service(render: Render) -> None:
    docs = render(GATED)
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
        {"name": "elector-http", "port": 9809, "targetPort": "elector-http", "protocol": "TCP"}
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
    # The file's dashboard, with a uid and title of this release's (tests/helm/test_monitoring_values.py).
    rendered = json.loads(configmap["data"]["elector.json"])
    file = json.loads((chart_dir / "files/dashboard.json").read_text())
    assert rendered["uid"] != file["uid"] and "(apps/demo-elector)" in rendered["title"]
    assert {**rendered, "uid": file["uid"], "title": file["title"]} == file
    assert not [d for d in render({}) if d["kind"] == "ConfigMap"]


def egress_ports(policy: dict[str, Any]) -> list[list[int | str]]:
    return [[p["port"] for p in rule["ports"]] for rule in policy["spec"]["egress"]]


def with_url(url: str, **egress: Any) -> dict[str, Any]:
    return {"elector": {"redis": {"url": url}}, "networkPolicy": {"enabled": True, "egress": egress}}


def test_network_policy(render: Render) -> None:
    assert not [d for d in render({}) if d["kind"] == "NetworkPolicy"]
    policy = find(render({"networkPolicy": {"enabled": True}}), "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    ingress_ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert ingress_ports == ["elector-http", "http"]
    assert egress_ports(policy) == [[53, 53], [6379]]  # DNS, then the default URL's port
    assert all(p["protocol"] == "TCP" for p in policy["spec"]["egress"][1]["ports"])
    open_egress = find(
        render({"networkPolicy": {"enabled": True, "egress": {"enabled": False}}}), "NetworkPolicy"
    )
    assert open_egress["spec"]["policyTypes"] == ["Ingress"] and "egress" not in open_egress["spec"]


@pytest.mark.parametrize(
    ("url", "master_ports", "ports"),
    [
        ("redis://redis.data:6380/0", [], [6380]),
        ("rediss://redis.data/0", [], [6379]),  # no port: Redis' default
        ("redis://billing@[fd00::7]:6390/1", [], [6390]),
        # every Sentinel (default 26379), and the master's ports, which only the sentinels know
        ("redis+sentinel://s1:26379,s2:26380,s3/mymaster/0", [6379], [6379, 26379, 26380]),
        ("rediss+sentinel://s1:36379,s2:36379/mymaster", [6380, 16380], [6380, 16380, 36379]),
    ],
    ids=["port-6380", "default-port", "ipv6-with-user", "sentinel", "sentinel-tls"],
)
def test_network_policy_egress_follows_the_redis_url(
    render: Render, url: str, master_ports: list[int], ports: list[int]
) -> None:
    values = with_url(
        url, sentinelMasterPorts=master_ports, redisTo=[{"podSelector": {"matchLabels": {"a": "b"}}}]
    )
    policy = find(render(values), "NetworkPolicy")
    assert egress_ports(policy) == [[53, 53], ports]
    assert policy["spec"]["egress"][1]["to"] == [{"podSelector": {"matchLabels": {"a": "b"}}}]
    kubernetes_validate.validate(policy, NEWEST_KUBE, strict=True)


def test_network_policy_for_a_unix_socket_allows_dns_only(render: Render) -> None:
    policy = find(render(with_url("unix:///var/run/redis/redis.sock")), "NetworkPolicy")
    assert egress_ports(policy) == [[53, 53]]


def test_network_policy_refuses_what_it_cannot_derive(render: Render) -> None:
    with pytest.raises(HelmRenderError, match="sentinelMasterPorts") as error:
        render(with_url("redis+sentinel://s1:26379,s2:26379/mymaster/0"))
    assert "s1" not in str(error.value)  # the message never quotes the URL
    with pytest.raises(HelmRenderError, match=re.escape("not a number 1..65535")):
        render(with_url("redis://redis.data:99999/0"))
    with pytest.raises(HelmRenderError, match=re.escape("not a number 1..65535")):
        render(with_url("redis+sentinel://s1:26379,s2:x/mymaster", sentinelMasterPorts=[6379]))
    # without restricted egress nothing is derived, so nothing fails
    assert find(render(with_url("redis+sentinel://s1,s2/m", enabled=False)), "NetworkPolicy")


def test_the_fixed_redis_port_is_gone(chart: Chart) -> None:
    """networkPolicy.egress.redisPort never followed the URL: the schema refuses it, names its successor."""
    with pytest.raises(HelmValuesError, match=re.escape("the Redis ports now come from elector.redis.url")):
        chart.validate_schema({"networkPolicy": {"egress": {"redisPort": 6380}}})
    assert "redisPort" not in chart.values["networkPolicy"]["egress"]


def test_full_ci_values_reach_their_redis_port(render: Render, chart_dir: Path) -> None:
    values = yaml.safe_load((chart_dir / "ci" / "full-values.yaml").read_text())
    url = values["elector"]["redis"]["url"]
    port = int(re.search(r":(\d+)/", url).group(1))  # type: ignore[union-attr]
    assert port == 6380
    policy = find(render(values), "NetworkPolicy")
    assert [port] in egress_ports(policy)


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
    assert {d["metadata"]["name"] for d in docs} == {"jobs", "jobs-leader", "jobs-metrics", "jobs-test"}
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["team"] == "platform"
        assert labels["helm.sh/chart"] == "elector-0.2.0"
        assert labels["app.kubernetes.io/version"] == "0.2.0"
    assert env_of(container(docs, "elector"))["ELECTOR_LOCK"] == "apps/jobs"
    long_name = "x" * 70
    for doc in render({"fullnameOverride": long_name}):
        assert len(doc["metadata"]["name"]) <= 63


def test_release_name_containing_chart_name(chart: Chart, render_chart: RenderChart) -> None:
    docs = render_chart(chart, {}, name="elector")
    assert find(docs, "Deployment")["metadata"]["name"] == "elector"


def test_notes_tell_the_truth_about_the_leader_service(chart: Chart) -> None:
    notes = chart.render({}, name="demo", namespace=NAMESPACE)["elector/templates/NOTES.txt"]
    assert "NO endpoints" in notes and "elector.io/leader=true" in notes and "GET /healthz" in notes
    gated = chart.render(GATED, name="demo", namespace=NAMESPACE)
    gated_notes = gated["elector/templates/NOTES.txt"]
    assert "only the leader is ready" in gated_notes and "NO endpoints" not in gated_notes
    with_user = {"elector": {"redis": {"url": "rediss://billing@redis.data:6380/2?ssl_cert_reqs=required"}}}
    notes_with_user = chart.render(with_user, name="demo", namespace=NAMESPACE)["elector/templates/NOTES.txt"]
    assert "Redis: rediss://redis.data:6380/2\n" in notes_with_user and "billing@" not in notes_with_user
    # a Sentinel list with several ports, which Go's url.Parse (urlParse) refuses
    sentinels = {"elector": {"redis": {"url": "redis+sentinel://s1:26379,s2:26380/mymaster/0"}}}
    sentinel_notes = chart.render(sentinels, name="demo", namespace=NAMESPACE)["elector/templates/NOTES.txt"]
    assert "Redis: redis+sentinel://s1:26379,s2:26380/mymaster/0" in sentinel_notes
    assert "http://127.0.0.1:9809/leader" in notes
    forced = chart.render({"prometheusRule": {"enabled": True}}, name="demo", namespace=NAMESPACE)
    assert "PrometheusRule" in forced["elector/templates/NOTES.txt"]
    assert "skipped" in forced["elector/templates/NOTES.txt"]


# --- drains and readiness (issue 17, problem 5) ----------------------------------------------------------


@pytest.mark.parametrize("kube_version", [OLDEST_KUBE, "1.31.0", NEWEST_KUBE])
def test_unready_pods_never_block_a_drain(render: Render, kube_version: str) -> None:
    """unhealthyPodEvictionPolicy AlwaysAllow (beta, on by default, in 1.27; GA in 1.31): a follower that
    gateOnLeadership keeps unready, or every pod during a Redis outage, can be evicted whatever the budget."""
    pdb = find(render({}, kube_version=kube_version), "PodDisruptionBudget")
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    kubernetes_validate.validate(pdb, kube_version, strict=True)
    unset = {"podDisruptionBudget": {"unhealthyPodEvictionPolicy": ""}}
    assert "unhealthyPodEvictionPolicy" not in find(render(unset), "PodDisruptionBudget")["spec"]


def test_the_policy_needs_a_kubernetes_version_that_has_it(chart_dir: Path) -> None:
    # The engine renders nothing below Chart.yaml's kubeVersion (>= 1.27): the guard is checked in the source.
    assert ">=1.27.0-0" in yaml.safe_load((chart_dir / "Chart.yaml").read_text())["kubeVersion"]
    template = (chart_dir / "templates" / "pdb.yaml").read_text()
    assert 'semverCompare ">=1.27.0-0" .Capabilities.KubeVersion.Version' in template


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"podDisruptionBudget": {"maxUnavailable": 0}}, "maxUnavailable 0 with 3 replicas never allows"),
        ({"podDisruptionBudget": {"maxUnavailable": "0%"}}, "maxUnavailable 0% with 3 replicas never"),
        (
            {"podDisruptionBudget": {"minAvailable": 3, "maxUnavailable": ""}},
            "minAvailable 3 with 3 replicas",
        ),
        ({"podDisruptionBudget": {"minAvailable": "100%", "maxUnavailable": ""}}, "minAvailable 100% with 3"),
        (
            {
                "workload": {"replicaCount": 1},
                "podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": ""},
            },
            "minAvailable 1 with 1 replicas never allows",
        ),
        # only the leader is ready: anything that keeps one pod available keeps the leader forever
        (
            {"elector": {"gateOnLeadership": True}},
            re.escape("maxUnavailable 1 (of 3 replicas) never allows evicting it"),
        ),
        (
            {
                "elector": {"gateOnLeadership": True},
                "podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": ""},
            },
            "only the leader is ready, so minAvailable 1",
        ),
        ({"elector": {"gateOnLeadership": True}, "podDisruptionBudget": {"maxUnavailable": "66%"}}, "66%"),
        ({"podDisruptionBudget": {"maxUnavailable": ""}}, "set one of minAvailable and maxUnavailable"),
    ],
    ids=[
        "max-0",
        "max-0%",
        "min-all",
        "min-100%",
        "one-replica",
        "gated-default",
        "gated-min-1",
        "gated-66%",
        "neither",
    ],
)
def test_budgets_that_can_never_allow_an_eviction_are_refused(
    render: Render, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmRenderError, match=message):
        render(values)


@pytest.mark.parametrize(
    "budget",
    [
        {"maxUnavailable": "100%"},
        {"maxUnavailable": 3},
        {"maxUnavailable": "67%"},
        {"minAvailable": 0, "maxUnavailable": ""},
    ],
    ids=["max-100%", "max-all", "max-67%", "min-0"],
)
def test_gated_readiness_with_a_budget_that_lets_the_leader_go(
    render: Render, budget: dict[str, Any]
) -> None:
    docs = render({"elector": {"gateOnLeadership": True}, "podDisruptionBudget": budget})
    pdb = find(docs, "PodDisruptionBudget")
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    # Kubernetes rounds percentages up; desired healthy pods must be 0, as only the leader is ready
    replicas = 3
    if "minAvailable" in pdb["spec"]:
        desired = pdb["spec"]["minAvailable"]
    else:
        unavailable = pdb["spec"]["maxUnavailable"]
        if isinstance(unavailable, str):
            unavailable = math.ceil(int(unavailable.rstrip("%")) * replicas / 100)
        desired = replicas - unavailable
    assert desired <= 0
    assert find(
        render({"podDisruptionBudget": {"enabled": False}, "elector": {"gateOnLeadership": True}}),
        "Deployment",
    )


def probe_window(probe: dict[str, Any]) -> int:
    """Seconds from a leader's step-down to its readiness failing: every probe of the window fails."""
    return int(probe["periodSeconds"] * probe["failureThreshold"])


@pytest.mark.parametrize(
    ("ttl", "period", "threshold"),
    [
        ("10s", 1, 3),
        ("15s", 2, 2),
        ("1m30s", 15, 2),
        ("1m", 10, 2),
        ("4s", 1, 1),
        ("1.5s", 1, 1),
        ("500ms", 1, 1),
    ],
)
def test_readiness_timing_follows_the_ttl(render: Render, ttl: str, period: int, threshold: int) -> None:
    """A leader that stepped down answers 503 on /leader; with gateOnLeadership it must leave the leader
    Service within about ttl/3, not after the 5 s x 2 of a fixed probe (a whole 10 s ttl)."""
    docs = render(
        {"elector": {"ttl": ttl, "gateOnLeadership": True}, "podDisruptionBudget": {"enabled": False}}
    )
    probe = container(docs, "elector")["readinessProbe"]
    assert probe["httpGet"]["path"] == "/leader"
    assert (probe["periodSeconds"], probe["failureThreshold"]) == (period, threshold)
    seconds = float(re.sub(r"[a-z]+", "", ttl)) if re.fullmatch(r"[0-9.]+s", ttl) else None
    if seconds is None:
        minutes, _, rest = ttl.partition("m")
        seconds = 60 * float(minutes) + float(rest.rstrip("s") or 0)
    assert probe_window(probe) <= max(1.0, seconds / 3)
    assert probe["timeoutSeconds"] <= probe["periodSeconds"]
    kubernetes_validate.validate(find(docs, "Deployment"), NEWEST_KUBE, strict=True)


def test_explicit_readiness_timing_wins(render: Render) -> None:
    timing = {"periodSeconds": 4, "failureThreshold": 5, "timeoutSeconds": 3, "initialDelaySeconds": 0}
    probe = container(render({"elector": {"readinessProbe": timing}}), "elector")["readinessProbe"]
    assert {k: probe.get(k, 0) for k in timing} == timing
    only_period = container(render({"elector": {"readinessProbe": {"periodSeconds": 3}}}), "elector")
    assert only_period["readinessProbe"]["failureThreshold"] == 3  # /healthz: Kubernetes' default
    gated = {"elector": {"gateOnLeadership": True, "readinessProbe": {"periodSeconds": 3}}}
    only_period = container(render({**gated, "podDisruptionBudget": {"enabled": False}}), "elector")
    assert only_period["readinessProbe"]["failureThreshold"] == 1  # (10 s / 3) // 3 s, at least 1


@pytest.mark.parametrize("gate", [{}, {"gateOnRedis": True}])
def test_readiness_that_only_reads_memory_is_asked_every_10_s(render: Render, gate: dict[str, Any]) -> None:
    """Issue 42: /healthz (and /readyz) answer from the daemon's memory and change only when it is stuck or
    Redis is gone for a ttl; a probe every second of every replica was kubelet work for nothing."""
    probe = container(render({"elector": gate}), "elector")["readinessProbe"]
    assert (probe["periodSeconds"], probe["failureThreshold"]) == (10, 3)
    assert probe["initialDelaySeconds"] <= 1  # a new pod is still ready at its first probe


# --- extension points (problem 7) ------------------------------------------------------------------------


def test_extension_points_reach_the_pod(render: Render, chart_dir: Path) -> None:
    values = yaml.safe_load((chart_dir / "ci" / "extensions-values.yaml").read_text())
    docs = render(values)
    pod = find(docs, "Deployment")["spec"]["template"]
    spec = pod["spec"]
    app, sidecar = container(docs, "app"), container(docs, "elector")
    # global.imageRegistry replaces the registry of both images
    assert app["image"] == "registry.example.com/mirror/pause:3.9"
    assert sidecar["image"] == "registry.example.com/mirror/elector-dev/elector:0.2.0"
    # global.imagePullSecrets (a name), the elector image's pullSecrets ({name}), each once
    assert spec["imagePullSecrets"] == [{"name": "mirror-pull"}, {"name": "ghcr"}]
    assert [c["name"] for c in spec["initContainers"]] == ["wait-for-redis"]
    assert {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}} in spec["volumes"]
    assert app["volumeMounts"] == [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "app-secrets", "mountPath": "/etc/app/secrets", "readOnly": True},
    ]
    assert {"name": "tmp", "mountPath": "/tmp"} in sidecar["volumeMounts"]
    assert app["envFrom"] == [{"configMapRef": {"name": "app-settings"}}]
    assert sidecar["envFrom"] == [{"configMapRef": {"name": "elector-settings"}}]
    assert env_of(app)["MODE"] == "batch"
    assert pod["metadata"]["labels"]["team"] == "billing"
    assert pod["metadata"]["annotations"] == {"example.com/owner": "billing"}


def test_pull_secrets_from_every_level_once(render: Render) -> None:
    values = {
        "global": {"imagePullSecrets": ["a", {"name": "b"}]},
        "imagePullSecrets": [{"name": "b"}, {"name": "c"}],
        "elector": {"image": {"pullSecrets": ["a", "d"]}},
    }
    spec = find(render(values), "Deployment")["spec"]["template"]["spec"]
    assert spec["imagePullSecrets"] == [{"name": n} for n in "abdc"]
    assert "imagePullSecrets" not in find(render({}), "Deployment")["spec"]["template"]["spec"]


def test_every_extension_point_is_in_the_schema(chart: Chart) -> None:
    schema = chart.schema
    assert schema is not None
    workload = schema["properties"]["workload"]["properties"]
    sidecar = schema["properties"]["elector"]["properties"]
    for key in (
        "extraVolumes",
        "extraVolumeMounts",
        "envFrom",
        "extraEnv",
        "initContainers",
        "podAnnotations",
        "podLabels",
    ):
        assert key in workload, key
    for key in ("extraVolumeMounts", "envFrom", "extraEnv"):
        assert key in sidecar, key
    assert {"imageRegistry", "imagePullSecrets"} <= set(schema["properties"]["global"]["properties"])
    assert "pullSecrets" in sidecar["image"]["properties"] and "imagePullSecrets" in schema["properties"]
    with pytest.raises(HelmValuesError, match="/workload/extraVolumes/0"):
        chart.validate_schema({"workload": {"extraVolumes": [{"emptyDir": {}}]}})  # a Volume needs its name


# --- the application's ELECTOR_LEADER_URL (problem 9b) ---------------------------------------------------


@pytest.mark.parametrize(
    ("sidecar", "url", "address"),
    [
        ({}, "http://127.0.0.1:9809/leader", "0.0.0.0:9809"),
        ({"port": 9090}, "http://127.0.0.1:9090/leader", "0.0.0.0:9090"),
        ({"port": 9191, "bindAddress": "::"}, "http://[::1]:9191/leader", "[::]:9191"),
    ],
    ids=["default", "port", "ipv6"],
)
def test_the_leader_url_follows_the_sidecar(
    render: Render, sidecar: dict[str, Any], url: str, address: str
) -> None:
    docs = render({"elector": sidecar})
    elector = container(docs, "elector")
    assert env_of(elector)["ELECTOR_HTTP_ADDRESS"] == address
    assert env_of(container(docs, "app"))["ELECTOR_LEADER_URL"] == url
    port = int(address.rpartition(":")[2])
    assert elector["ports"] == [{"name": "elector-http", "containerPort": port, "protocol": "TCP"}]
    metrics = find(docs, "Service", "demo-elector-metrics")
    assert metrics["spec"]["ports"][0]["port"] == port


def test_the_http_address_is_set_by_port_and_bind_address_only(chart: Chart, render: Render) -> None:
    with pytest.raises(HelmValuesError, match=re.escape("set elector.port and elector.bindAddress")):
        chart.validate_schema({"elector": {"extraEnv": [{"name": "ELECTOR_HTTP_ADDRESS", "value": ":9000"}]}})
    with pytest.raises(HelmValuesError, match="/elector/bindAddress"):
        chart.validate_schema({"elector": {"bindAddress": "127.0.0.1"}})  # the kubelet probes the pod's IP


# --- topology spread (issue 42) ---------------------------------------------------------------------------


def test_replicas_spread_over_nodes_and_zones_by_default(render: Render) -> None:
    """One node or zone going down must not take every candidate for the lock with it; a preference
    (ScheduleAnyway) so that a small cluster never leaves a replica pending, per revision
    (pod-template-hash) so that a rolling update's old pods do not skew the new ones."""
    docs = render({})
    deployment = find(docs, "Deployment")
    constraints = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in constraints] == [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    ]
    for constraint in constraints:
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway" and constraint["maxSkew"] == 1
        assert constraint["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
        assert constraint["matchLabelKeys"] == ["pod-template-hash"]
    for version in (OLDEST_KUBE, NEWEST_KUBE):
        kubernetes_validate.validate(deployment, version, strict=True)
    strict = render({"workload": {"topologySpread": {"whenUnsatisfiable": "DoNotSchedule"}}})
    spec = find(strict, "Deployment")["spec"]["template"]["spec"]
    assert {c["whenUnsatisfiable"] for c in spec["topologySpreadConstraints"]} == {"DoNotSchedule"}
    off = find(render({"workload": {"topologySpread": {"enabled": False}}}), "Deployment")
    assert "topologySpreadConstraints" not in off["spec"]["template"]["spec"]
    own = [{"topologyKey": "kubernetes.io/hostname", "maxSkew": 2, "whenUnsatisfiable": "DoNotSchedule"}]
    given = find(render({"workload": {"topologySpreadConstraints": own}}), "Deployment")
    assert given["spec"]["template"]["spec"]["topologySpreadConstraints"] == own
