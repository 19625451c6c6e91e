"""The operator's part of the chart: CRD, Deployment, ServiceAccount, minimal RBAC (real Helm engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_python.chart import Chart

from elector.kube.operator import resource

KUBE = kubernetes_validate.utils.latest_version()
CRD_PATH = Path(__file__).resolve().parents[2] / "helm" / "elector" / "crds" / "leaderelection.yaml"
OPERATOR_KINDS = {"Deployment", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
#: Exactly what the operator does (docs/kubernetes.md#rbac); anything more is a finding.
EXPECTED_RULES = [
    {
        "apiGroups": ["elector.io"],
        "resources": ["leaderelections"],
        "verbs": ["get", "list", "watch", "patch"],
    },
    {"apiGroups": ["elector.io"], "resources": ["leaderelections/status"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]},
]


def _render(chart: Chart, values: dict[str, Any]) -> list[dict[str, Any]]:
    manifests = chart.render(values, name="demo", namespace="apps")
    docs: list[dict[str, Any]] = []
    for path, text in sorted(manifests.items()):
        if "/operator/" in path:
            docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CRD_PATH.read_text())
    return loaded


def test_the_operator_is_off_by_default(chart: Chart) -> None:
    assert _render(chart, {}) == []


def test_namespaced_operator_renders_valid_minimal_objects(chart: Chart) -> None:
    docs = _render(chart, {"operator": {"enabled": True, "namespaces": ["apps", "jobs"]}})
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE, strict=True)
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds == ["Deployment", "Role", "Role", "RoleBinding", "RoleBinding", "ServiceAccount"]
    roles = [doc for doc in docs if doc["kind"] == "Role"]
    assert {role["metadata"]["namespace"] for role in roles} == {"apps", "jobs"}
    for role in roles:
        assert role["rules"] == EXPECTED_RULES
    deployment = next(doc for doc in docs if doc["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "demo-elector-operator"
    container = pod["containers"][0]
    assert container["args"] == ["operator"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ELECTOR_NAMESPACE"] == "apps jobs"
    assert "ELECTOR_ALL_NAMESPACES" not in env
    assert env["ELECTOR_LOCK"] == "elector-operator"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_cluster_wide_operator_uses_one_cluster_role(chart: Chart) -> None:
    docs = _render(
        chart,
        {
            "operator": {
                "enabled": True,
                "clusterWide": True,
                "redis": {"url": "redis://r:6379/1", "existingSecret": "op"},
            },
        },
    )
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE, strict=True)
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount"]
    assert next(doc for doc in docs if doc["kind"] == "ClusterRole")["rules"] == EXPECTED_RULES
    container = next(doc for doc in docs if doc["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["ELECTOR_ALL_NAMESPACES"] == "true" and "ELECTOR_NAMESPACE" not in env
    assert env["ELECTOR_REDIS_URL"] == "redis://r:6379/1"
    assert env["ELECTOR_REDIS_PASSWORD_FILE"] == "/etc/elector/redis/password"


def test_no_rule_grants_more_than_the_operator_uses(chart: Chart) -> None:
    for values in ({"enabled": True}, {"enabled": True, "clusterWide": True}):
        for doc in _render(chart, {"operator": values}):
            for rule in doc.get("rules") or []:
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
                assert not {"delete", "deletecollection", "update", "create"} & set(rule["verbs"]) or rule[
                    "resources"
                ] in (["events"], ["leases"])


def test_crd_is_a_valid_leader_election_definition(crd: dict[str, Any]) -> None:
    kubernetes_validate.validate(crd, KUBE, strict=True)
    assert crd["spec"]["group"] == resource.GROUP
    assert crd["spec"]["names"]["plural"] == resource.PLURAL
    assert crd["spec"]["names"]["kind"] == resource.KIND
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert version["name"] == resource.VERSION
    assert "status" in version["subresources"]
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert columns == ["LOCK", "HOLDER", "TOKEN", "AGE"]


SPECS_BOTH_ACCEPT = [
    {"lock": "jobs", "redis": {"url": "redis://r:6379/0"}, "selector": {"matchLabels": {"app": "w"}}},
    {
        "lock": "a.b/c@d",
        "redis": {
            "urlSecretRef": {"name": "s", "key": "url"},
            "passwordSecretRef": {"name": "p", "key": "pw"},
        },
        "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["w"]}]},
        "leaderLabel": "example.com/leader",
        "handoffWindowSeconds": 5,
        "handoffTimeoutSeconds": 20.5,
        "kubernetesLease": {"enabled": True, "name": "jobs-leader.v1"},
    },
    {
        "lock": "j",
        "redis": {"url": "redis://r"},
        "selector": {"matchLabels": {"a": "b"}},
        "kubernetesLease": {"enabled": False},
    },
]
SPECS_BOTH_REFUSE = [
    {"redis": {"url": "redis://r"}, "selector": {"matchLabels": {"a": "b"}}},  # no lock
    {"lock": "bad lock", "redis": {"url": "redis://r"}, "selector": {"matchLabels": {"a": "b"}}},
    {
        "lock": "j",
        "redis": {"url": "redis://r"},
        "selector": {"matchLabels": {"a": "b"}},
        "handoffWindowSeconds": 0,
    },
    {"lock": "j", "redis": {"url": "redis://r"}},  # no selector
    {
        "lock": "j",
        "redis": {"url": "redis://r"},
        "selector": {"matchExpressions": [{"key": "a", "operator": "Near"}]},
    },
    {
        "lock": "j",
        "redis": {"url": "redis://r"},
        "selector": {"matchLabels": {"a": "b"}},
        "kubernetesLease": {"name": "Not_A_Name"},
    },
]


def _crd_accepts(crd: dict[str, Any], spec: dict[str, Any]) -> bool:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    # OpenAPI v3.0 (exclusiveMinimum as a boolean) is JSON Schema draft 4 in this respect.
    return jsonschema.Draft4Validator(schema).is_valid({"spec": spec})


def _operator_accepts(spec: dict[str, Any]) -> bool:
    try:
        resource.parse_spec(spec)
    except resource.SpecError:
        return False
    return True


@pytest.mark.parametrize("spec", SPECS_BOTH_ACCEPT)
def test_crd_schema_and_operator_accept_the_same_good_specs(
    crd: dict[str, Any], spec: dict[str, Any]
) -> None:
    assert _crd_accepts(crd, spec) and _operator_accepts(spec)


@pytest.mark.parametrize("spec", SPECS_BOTH_REFUSE)
def test_crd_schema_and_operator_refuse_the_same_bad_specs(crd: dict[str, Any], spec: dict[str, Any]) -> None:
    assert not _crd_accepts(crd, spec)
    assert not _operator_accepts(spec)


def test_crd_defaults_are_the_operators(crd: dict[str, Any]) -> None:
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    parsed = resource.parse_spec(SPECS_BOTH_ACCEPT[0])
    assert props["leaderLabel"]["default"] == parsed.leader_label
    assert props["handoffWindowSeconds"]["default"] == parsed.handoff_window_s
    assert props["handoffTimeoutSeconds"]["default"] == parsed.handoff_timeout_s
