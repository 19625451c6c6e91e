"""The elector-operator chart (helm/elector-operator): Deployment, least-privilege RBAC, the LeaderElection
CRD, Redis TLS, scheduling and security values, the PodDisruptionBudget and the ValidatingAdmissionPolicy,
rendered by the real Helm engine. The pre-delete hook has its own module (test_operator_uninstall.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import pytest
import yaml
from helm_python.chart import Chart
from helm_python.errors import HelmError, HelmRenderError, HelmValuesError

from elector.kube.operator import resource
from tests.helm.operator_support import (
    CRD_PATH,
    KUBE_VERSIONS,
    NAMESPACE,
    OPERATOR_CHART_DIR,
    Doc,
    cel_violations,
    is_hook,
    notes,
    of_kind,
    one,
    operator_chart,
    render_operator,
    validate_kubernetes,
)

CI_VALUES = sorted((OPERATOR_CHART_DIR / "ci").glob("*-values.yaml"))
#: Exactly what the operator does (docs/kubernetes.md#rbac); anything more is a finding.
# Exactly what the operator's code calls (test_operator_rbac.py derives it from elector/kube/operator).
LEADER_ELECTIONS = {
    "apiGroups": ["elector.io"],
    "resources": ["leaderelections"],
    "verbs": ["list", "watch", "patch"],
}
STATUS = {"apiGroups": ["elector.io"], "resources": ["leaderelections/status"], "verbs": ["patch"]}
PODS = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch", "patch"]}
SECRETS = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
EVENTS = {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}
LEASES = {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
#: A namespaced operator's Role by default: no Secret (only rbac.secretNames, by name).
EXPECTED_RULES = [LEADER_ELECTIONS, STATUS, PODS, EVENTS, LEASES]
TLS = {
    "redis": {
        "url": "rediss://redis.data:6380/0",
        "existingSecret": "redis-auth",
        "tls": {"existingSecret": "redis-client-tls"},
    }
}


def operator_objects(docs: list[Doc]) -> list[Doc]:
    """The release's own objects (no hooks, no CRD)."""
    return [d for d in docs if not is_hook(d) and d["kind"] != "CustomResourceDefinition"]


def deployment(docs: list[Doc]) -> Doc:
    return one(docs, "Deployment")


def pod_spec(docs: list[Doc]) -> Doc:
    spec: Doc = deployment(docs)["spec"]["template"]["spec"]
    return spec


def env_of(container: Doc) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.fixture(scope="module")
def crd() -> Doc:
    loaded: Doc = yaml.safe_load(CRD_PATH.read_text())
    return loaded


# --- every ci values file: valid Kubernetes, Pod Security "restricted" ----------------------------------


@pytest.mark.parametrize("values_file", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_every_ci_values_file_renders_valid_kubernetes(values_file: Path) -> None:
    docs = render_operator(yaml.safe_load(values_file.read_text()) or {})
    assert of_kind(docs, "Deployment")
    for doc in docs:
        # the Prometheus operator's kinds: promtool checks those (test_operator_monitoring)
        if doc["apiVersion"] != "monitoring.coreos.com/v1":
            validate_kubernetes(doc)


def _restricted(pod: Doc) -> None:
    """The Pod Security Standard "restricted" as far as the chart sets it."""
    pod_context = pod.get("securityContext") or {}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is True
        assert (context.get("seccompProfile") or pod_context["seccompProfile"])["type"] == "RuntimeDefault"


@pytest.mark.parametrize("values_file", CI_VALUES, ids=[p.name for p in CI_VALUES])
def test_every_pod_meets_the_restricted_pod_security_standard(values_file: Path) -> None:
    docs = render_operator(yaml.safe_load(values_file.read_text()) or {})
    for workload in of_kind(docs, "Deployment") + of_kind(docs, "Job"):
        _restricted(workload["spec"]["template"]["spec"])


def test_no_uid_is_hard_coded_by_default() -> None:
    """OpenShift's restricted SCC assigns a UID from the namespace's range: a fixed runAsUser is refused."""
    docs = render_operator({})
    for workload in of_kind(docs, "Deployment") + of_kind(docs, "Job"):
        pod = workload["spec"]["template"]["spec"]
        contexts = [pod.get("securityContext") or {}] + [
            c.get("securityContext") or {} for c in pod["containers"]
        ]
        for context in contexts:
            assert not {"runAsUser", "runAsGroup", "fsGroup"} & set(context), context
    pinned = {"podSecurityContext": {"runAsNonRoot": True, "runAsUser": 10001, "fsGroup": 10001}}
    context = pod_spec(render_operator(pinned))["securityContext"]
    assert context == {**pinned["podSecurityContext"], "seccompProfile": {"type": "RuntimeDefault"}}


# --- the operator's Deployment and RBAC ------------------------------------------------------------------


def test_namespaced_operator_renders_minimal_objects() -> None:
    docs = operator_objects(render_operator({"namespaces": ["apps", "jobs"]}))
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds == [
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    roles = of_kind(docs, "Role")
    assert {role["metadata"]["namespace"] for role in roles} == {"apps", "jobs"}
    for role in roles:
        assert role["rules"] == EXPECTED_RULES
    for binding in of_kind(docs, "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "demo-elector-operator", "namespace": NAMESPACE}
        ]
    assert deployment(docs)["spec"]["replicas"] >= 2
    pod = pod_spec(docs)
    assert pod["serviceAccountName"] == "demo-elector-operator"
    (container,) = pod["containers"]
    assert container["args"] == ["operator"]
    env = env_of(container)
    assert env["ELECTOR_NAMESPACE"] == "apps jobs"
    assert "ELECTOR_ALL_NAMESPACES" not in env
    assert env["ELECTOR_LOCK"] == f"elector-operator/{NAMESPACE}/demo"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def _operator_lock(values: Doc, *, name: str, namespace: str) -> str:
    rendered = operator_chart().render(values, name=name, namespace=namespace)
    docs = [
        d
        for path, text in rendered.items()
        if not path.endswith("NOTES.txt")
        for d in yaml.safe_load_all(text)
        if d
    ]
    (container,) = pod_spec(docs)["containers"]
    lock: str = env_of(container)["ELECTOR_LOCK"]
    return lock


def test_each_release_has_its_own_operator_lock() -> None:
    """Operator A (team-a's namespaces) held the one global lock "elector-operator", so operator B (for
    apps) never led: no status, no labels. Each release's replicas share a lock; releases never do."""
    team_a = _operator_lock({"namespaces": ["team-a"]}, name="ops", namespace="team-a-system")
    apps = _operator_lock({"namespaces": ["apps"]}, name="ops", namespace="apps-system")
    other_release = _operator_lock({"namespaces": ["jobs"]}, name="jobs-ops", namespace="apps-system")
    assert len({team_a, apps, other_release}) == 3
    assert team_a == "elector-operator/team-a-system/ops"
    assert _operator_lock({}, name="ops", namespace="team-a-system") == team_a  # replicas, upgrades
    assert _operator_lock({"lock": "shared"}, name="ops", namespace="x") == "shared"
    # the longest release name and namespace still make a valid lock name (<= 200 characters)
    longest = _operator_lock({}, name="r" * 53, namespace="n" * 63)
    resource_lock = resource._LOCK_NAME  # the operator's own check of lock names
    assert resource_lock.fullmatch(longest), longest


def test_cluster_wide_operator_uses_one_cluster_role_and_reads_no_secret_by_default() -> None:
    """Problem 8b: clusterWide must not grant get on every Secret of the cluster."""
    docs = operator_objects(
        render_operator({"clusterWide": True, "redis": {"url": "redis://r:6379/1", "existingSecret": "op"}})
    )
    assert sorted(doc["kind"] for doc in docs) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]
    rules = one(docs, "ClusterRole")["rules"]
    # no Leases cluster-wide: they would include kube-system's and kube-node-lease (rbac.leaseNamespaces)
    assert rules == [LEADER_ELECTIONS, STATUS, PODS, EVENTS]
    env = env_of(pod_spec(docs)["containers"][0])
    assert env["ELECTOR_ALL_NAMESPACES"] == "true" and "ELECTOR_NAMESPACE" not in env
    assert env["ELECTOR_REDIS_URL"] == "redis://r:6379/1"
    assert env["ELECTOR_REDIS_PASSWORD_FILE"] == "/etc/elector/redis/password"
    assert "Secrets: none readable" in notes({"clusterWide": True})


@pytest.mark.parametrize("cluster_wide", [False, True], ids=["namespaced", "cluster-wide"])
def test_secrets_are_limited_to_the_named_ones(cluster_wide: bool) -> None:
    values = {"clusterWide": cluster_wide, "rbac": {"secretNames": ["redis-auth", "redis-url"]}}
    docs = operator_objects(render_operator(values))
    (role,) = of_kind(docs, "ClusterRole" if cluster_wide else "Role")
    secret_rules = [rule for rule in role["rules"] if "secrets" in rule["resources"]]
    assert secret_rules == [{**SECRETS, "resourceNames": ["redis-auth", "redis-url"]}]
    for doc in docs:
        validate_kubernetes(doc)


def test_no_rule_grants_more_than_the_operator_uses() -> None:
    for values in ({}, {"clusterWide": True}, {"clusterWide": True, "rbac": {"secretNames": ["s"]}}):
        for doc in operator_objects(render_operator(values)):
            for rule in doc.get("rules") or []:
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"]
                assert not {"delete", "deletecollection", "update", "create"} & set(rule["verbs"]) or rule[
                    "resources"
                ] in (["events"], ["leases"])
                if rule["resources"] == ["secrets"] and doc["kind"] == "ClusterRole":
                    assert rule["resourceNames"]


def test_an_existing_service_account_is_bound() -> None:
    docs = render_operator({"serviceAccount": {"create": False, "name": "platform-operator"}})
    assert not [d for d in of_kind(docs, "ServiceAccount") if not is_hook(d)]
    assert pod_spec(docs)["serviceAccountName"] == "platform-operator"
    for binding in [d for d in of_kind(docs, "RoleBinding") if not is_hook(d)]:
        assert binding["subjects"][0]["name"] == "platform-operator"
    with pytest.raises(HelmRenderError, match="name the existing ServiceAccount"):
        render_operator({"serviceAccount": {"create": False}})


def test_image_registry_mirror_and_pull_secrets() -> None:
    values = {
        "global": {"imageRegistry": "mirror.example.com", "imagePullSecrets": [{"name": "mirror"}]},
        "imagePullSecrets": [{"name": "ghcr"}],
    }
    docs = render_operator(values)
    pod = pod_spec(docs)
    assert pod["containers"][0]["image"] == "mirror.example.com/elector-dev/elector:0.2.0"
    assert pod["imagePullSecrets"] == [{"name": "mirror"}, {"name": "ghcr"}]
    job = one(docs, "Job")["spec"]["template"]["spec"]
    assert job["containers"][0]["image"] == pod["containers"][0]["image"]
    assert job["imagePullSecrets"] == pod["imagePullSecrets"]
    pinned = pod_spec(render_operator({"image": {"digest": "sha256:" + "ab" * 32}}))
    assert pinned["containers"][0]["image"] == "ghcr.io/elector-dev/elector@sha256:" + "ab" * 32


# --- problem 4: Redis TLS for the operator's own lease -----------------------------------------------------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_tls_files_from_a_secret(kube_version: str) -> None:
    docs = render_operator(TLS)
    container = pod_spec(docs)["containers"][0]
    env = env_of(container)
    assert env["ELECTOR_REDIS_URL"] == "rediss://redis.data:6380/0"
    assert env["ELECTOR_REDIS_PASSWORD_FILE"] == "/etc/elector/redis/password"
    assert env["ELECTOR_REDIS_TLS_CA"] == "/etc/elector/redis-tls/ca.crt"
    assert env["ELECTOR_REDIS_TLS_CERT"] == "/etc/elector/redis-tls/tls.crt"
    assert env["ELECTOR_REDIS_TLS_KEY"] == "/etc/elector/redis-tls/tls.key"
    assert container["volumeMounts"] == [
        {"name": "redis-password", "mountPath": "/etc/elector/redis", "readOnly": True},
        {"name": "redis-tls", "mountPath": "/etc/elector/redis-tls", "readOnly": True},
    ]
    volume = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "redis-tls")
    assert volume["secret"] == {
        "secretName": "redis-client-tls",
        "items": [
            {"key": "ca.crt", "path": "ca.crt"},
            {"key": "tls.crt", "path": "tls.crt"},
            {"key": "tls.key", "path": "tls.key"},
        ],
    }
    validate_kubernetes(deployment(docs), [kube_version])


def test_the_ci_tls_values_reach_the_operator() -> None:
    """The combination the old chart's ci/leader-election-values.yaml rendered without any TLS file."""
    values = yaml.safe_load((OPERATOR_CHART_DIR / "ci" / "tls-values.yaml").read_text())
    env = env_of(pod_spec(render_operator(values))["containers"][0])
    assert env["ELECTOR_REDIS_URL"].startswith("rediss+sentinel://")
    assert {"ELECTOR_REDIS_TLS_CA", "ELECTOR_REDIS_TLS_CERT", "ELECTOR_REDIS_TLS_KEY"} <= set(env)


def test_the_env_names_are_the_operator_options() -> None:
    """Every ELECTOR_* variable the chart sets is one `elector operator` reads."""
    from elector.cli.operator import operator

    envvars = {param.envvar for param in operator.params if getattr(param, "envvar", None)}
    env = env_of(pod_spec(render_operator(TLS))["containers"][0])
    assert {name for name in env if name.startswith("ELECTOR_")} <= envvars


def test_tls_ca_only() -> None:
    values = {
        "redis": {
            "url": "rediss+sentinel://s1:26379,s2:26379/mymaster",
            "tls": {"existingSecret": "redis-ca", "caKey": "bundle.pem", "certKey": "", "keyKey": ""},
        }
    }
    docs = render_operator(values)
    env = env_of(pod_spec(docs)["containers"][0])
    assert env["ELECTOR_REDIS_TLS_CA"] == "/etc/elector/redis-tls/ca.crt"
    assert "ELECTOR_REDIS_TLS_CERT" not in env and "ELECTOR_REDIS_TLS_KEY" not in env
    (volume,) = pod_spec(docs)["volumes"]
    assert volume["secret"]["items"] == [{"key": "bundle.pem", "path": "ca.crt"}]


@pytest.mark.parametrize(
    ("redis", "message"),
    [
        (
            {"url": "redis://r:6379/0", "tls": {"existingSecret": "t"}},
            "needs a rediss:// or rediss\\+sentinel://",
        ),
        (
            {"url": "rediss://r:6380/0", "tls": {"existingSecret": "t", "keyKey": ""}},
            "set certKey and keyKey",
        ),
        (
            {
                "url": "rediss://r:6380/0",
                "tls": {"existingSecret": "t", "caKey": "", "certKey": "", "keyKey": ""},
            },
            "nothing to mount",
        ),
    ],
    ids=["tls-without-rediss", "cert-without-key", "tls-nothing"],
)
def test_tls_value_combinations_are_checked(redis: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmRenderError, match=message):
        render_operator({"redis": redis})


def test_credentials_in_the_url_are_refused(tmp_path: Path) -> None:
    """Problem 8c for the operator: the schema refuses them and names the Secret value; the template's own
    check (for --skip-schema-validation) says so too, without echoing the password."""
    url = "redis://app:hunter2@redis.data:6379/0"
    with pytest.raises(HelmValuesError, match="/redis/url") as failure:
        render_operator({"redis": {"url": url}})
    assert "redis.existingSecret" in str(failure.value)
    unchecked = Path(operator_chart().save_dir(tmp_path))
    (unchecked / "values.schema.json").unlink()
    with pytest.raises(
        HelmRenderError, match=r"put the password in the Secret named by redis\.existingSecret"
    ) as failure:
        Chart.load(unchecked).render({"redis": {"url": url}}, name="demo", namespace=NAMESPACE)
    assert "hunter2" not in str(failure.value)


# --- problem 7: scheduling, security contexts, PodDisruptionBudget ----------------------------------------


def test_scheduling_values_reach_the_pods() -> None:
    values = yaml.safe_load((OPERATOR_CHART_DIR / "ci" / "cluster-wide-values.yaml").read_text())
    docs = render_operator(values)
    pod = pod_spec(docs)
    for key in ("nodeSelector", "tolerations", "affinity", "topologySpreadConstraints", "priorityClassName"):
        assert pod[key] == values[key], key
    assert pod["securityContext"] == values["podSecurityContext"]
    assert pod["containers"][0]["resources"] == values["resources"]
    template = deployment(docs)["spec"]["template"]["metadata"]
    assert template["annotations"] == values["podAnnotations"]
    assert template["labels"]["team"] == "platform"
    # the hook's Job lands where the operator may run (but takes no pod (anti-)affinity meant for it)
    job = one(docs, "Job")["spec"]["template"]["spec"]
    assert (job["nodeSelector"], job["tolerations"]) == (values["nodeSelector"], values["tolerations"])
    assert job["priorityClassName"] == values["priorityClassName"]


def test_pod_disruption_budget_lets_drains_through() -> None:
    pdb = one(render_operator({}), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert (
        pdb["spec"]["selector"]["matchLabels"]
        == deployment(render_operator({}))["spec"]["selector"]["matchLabels"]
    )
    on_1_26 = one(render_operator({}, kube_version="1.26.0"), "PodDisruptionBudget")
    assert "unhealthyPodEvictionPolicy" not in on_1_26["spec"]  # the field is beta from 1.27 on
    by_min = one(
        render_operator({"podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": ""}}),
        "PodDisruptionBudget",
    )
    assert by_min["spec"]["minAvailable"] == 1 and "maxUnavailable" not in by_min["spec"]
    assert not of_kind(render_operator({"podDisruptionBudget": {"enabled": False}}), "PodDisruptionBudget")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"podDisruptionBudget": {"maxUnavailable": 0}}, "never allows an eviction"),
        ({"podDisruptionBudget": {"maxUnavailable": "0%"}}, "never allows an eviction"),
        ({"podDisruptionBudget": {"minAvailable": 2, "maxUnavailable": ""}}, "with 2 replicas never allows"),
        ({"podDisruptionBudget": {"minAvailable": "100%", "maxUnavailable": ""}}, "never allows an eviction"),
        ({"podDisruptionBudget": {"minAvailable": 1}}, "only one of minAvailable and maxUnavailable"),
    ],
    ids=["max-0", "max-0%", "min-replicas", "min-100%", "both"],
)
def test_pod_disruption_budgets_that_block_every_drain_are_refused(
    values: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmRenderError, match=message):
        render_operator(values)


@pytest.mark.parametrize(
    "values",
    [
        {"nodeSelector": {"a": 1}},
        {"tolerations": {"key": "x"}},
        {"priorityClassName": 5},
        {"podDisruptionBudget": {"maxUnavailable": "one"}},
        {"operator": {"enabled": True}},
        {"redis": {"password": "x"}},
        {"rbac": {"secretNames": ["Not_A_Name"]}},
        {"admissionPolicy": {"validationActions": ["Deny", "Warn"]}},
        {"logLevel": "verbose"},
    ],
)
def test_the_schema_refuses_wrong_values(values: dict[str, Any]) -> None:
    with pytest.raises(HelmValuesError):
        render_operator(values)


# --- the CRD ---------------------------------------------------------------------------------------------


def test_crd_is_a_template_kept_on_uninstall(crd: Doc) -> None:
    rendered = one(render_operator({}), "CustomResourceDefinition")
    assert rendered["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert rendered["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    # the very file `kubectl apply -f` takes, and tests/kube serves to kopf
    expected = copy.deepcopy(crd)
    expected["metadata"] |= {k: rendered["metadata"][k] for k in ("labels", "annotations")}
    assert rendered == expected
    assert not of_kind(render_operator({"crds": {"enabled": False}}), "CustomResourceDefinition")
    assert not (OPERATOR_CHART_DIR / "crds").exists()  # Helm would install crds/ whatever crds.enabled says


def test_crd_is_a_valid_leader_election_definition(crd: Doc) -> None:
    validate_kubernetes(crd)
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


def _crd_accepts(crd: Doc, spec: Doc) -> bool:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    # OpenAPI v3.0 (exclusiveMinimum as a boolean) is JSON Schema draft 4 in this respect; then the CEL
    # rules (x-kubernetes-validations), as the API server runs both.
    return bool(jsonschema.Draft4Validator(schema).is_valid({"spec": spec})) and not cel_violations(
        crd, {"spec": spec}
    )


def _operator_accepts(spec: Doc) -> bool:
    try:
        resource.parse_spec(spec)
    except resource.SpecError:
        return False
    return True


@pytest.mark.parametrize("spec", SPECS_BOTH_ACCEPT)
def test_crd_schema_and_operator_accept_the_same_good_specs(crd: Doc, spec: Doc) -> None:
    assert _crd_accepts(crd, spec) and _operator_accepts(spec)


@pytest.mark.parametrize("spec", SPECS_BOTH_REFUSE)
def test_crd_schema_and_operator_refuse_the_same_bad_specs(crd: Doc, spec: Doc) -> None:
    assert not _crd_accepts(crd, spec)
    assert not _operator_accepts(spec)


def test_crd_defaults_are_the_operators(crd: Doc) -> None:
    props = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    parsed = resource.parse_spec(SPECS_BOTH_ACCEPT[0])
    assert props["leaderLabel"]["default"] == parsed.leader_label
    assert props["handoffWindowSeconds"]["default"] == parsed.handoff_window_s
    assert props["handoffTimeoutSeconds"]["default"] == parsed.handoff_timeout_s


# --- problem 8a: the ValidatingAdmissionPolicy on the operator's pod patches ------------------------------

POLICY = {"admissionPolicy": {"enabled": True}}
OPERATOR_USER = f"system:serviceaccount:{NAMESPACE}:demo-elector-operator"
POD = {
    "metadata": {
        "name": "worker-0",
        "labels": {"app": "worker", "elector.io/leader": "false"},
        "annotations": {"example.com/owner": "team"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "worker-x", "uid": "1"}],
    },
    "spec": {"containers": [{"name": "main", "image": "example/worker:1"}]},
}


def _changed(change: str) -> Doc:
    pod = copy.deepcopy(POD)
    meta, spec = pod["metadata"], pod["spec"]
    if change == "leader label set":
        meta["labels"]["elector.io/leader"] = "true"
    elif change == "leader label removed":
        del meta["labels"]["elector.io/leader"]
    elif change == "leader label added to a pod without labels":
        meta["labels"] = {"elector.io/leader": "true"}
    elif change == "other label changed":
        meta["labels"]["app"] = "evil"
    elif change == "label added":
        meta["labels"]["extra"] = "x"
    elif change == "label removed":
        del meta["labels"]["app"]
    elif change == "annotation changed":
        meta["annotations"]["example.com/owner"] = "me"
    elif change == "annotations removed":
        del meta["annotations"]
    elif change == "finalizer added":
        meta["finalizers"] = ["example.com/keep"]
    elif change == "owner removed":
        del meta["ownerReferences"]
    elif change == "image changed":
        spec["containers"][0]["image"] = "evil/miner:1"
    elif change != "nothing":
        raise AssertionError(change)
    return pod


class Policy:
    """The rendered policy, evaluated as the API server does (cel-python for Kubernetes' CEL)."""

    def __init__(self, doc: Doc) -> None:
        env = celpy.Environment()
        spec = doc["spec"]

        def program(expression: str) -> Any:
            return env.program(env.compile(expression))

        self.conditions = [program(c["expression"]) for c in spec["matchConditions"]]
        self.variables = {v["name"]: program(v["expression"]) for v in spec["variables"]}
        self.validations = [(program(v["expression"]), v["message"]) for v in spec["validations"]]
        self.rules = spec["matchConstraints"]["resourceRules"]

    def denials(self, old: Doc, new: Doc, *, user: str = OPERATOR_USER) -> list[str] | None:
        """None when the policy does not apply to the request; else the messages of failed validations."""
        request = {"userInfo": {"username": user}, "operation": "UPDATE"}
        activation: dict[str, Any] = {"request": request, "object": new, "oldObject": old}
        cel = {key: celpy.json_to_cel(value) for key, value in activation.items()}
        if not all(bool(condition.evaluate(cel)) for condition in self.conditions):
            return None
        values = {
            celpy.celtypes.StringType(name): prog.evaluate(cel) for name, prog in self.variables.items()
        }
        cel["variables"] = celpy.celtypes.MapType(values)
        return [message for check, message in self.validations if not bool(check.evaluate(cel))]


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy(one(render_operator(POLICY), "ValidatingAdmissionPolicy"))


@pytest.mark.parametrize(
    "change",
    ["nothing", "leader label set", "leader label removed", "leader label added to a pod without labels"],
)
def test_the_policy_lets_the_operator_change_the_leader_label(policy: Policy, change: str) -> None:
    old = copy.deepcopy(POD)
    if change == "leader label added to a pod without labels":
        del old["metadata"]["labels"]
    assert policy.denials(old, _changed(change)) == []


@pytest.mark.parametrize(
    "change",
    [
        "other label changed",
        "label added",
        "label removed",
        "annotation changed",
        "annotations removed",
        "finalizer added",
        "owner removed",
        "image changed",
    ],
)
def test_the_policy_refuses_every_other_change_by_the_operator(policy: Policy, change: str) -> None:
    assert policy.denials(POD, _changed(change))


def test_the_policy_leaves_everyone_else_alone(policy: Policy) -> None:
    for user in (
        "system:serviceaccount:apps:default",
        "kubernetes-admin",
        "system:serviceaccount:x:demo-elector-operator",
    ):
        assert policy.denials(POD, _changed("image changed"), user=user) is None
    assert policy.rules == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
    ]


def test_the_policy_takes_every_leader_label() -> None:
    doc = one(
        render_operator({"admissionPolicy": {"enabled": True, "leaderLabels": ["example.com/leader"]}}),
        "ValidatingAdmissionPolicy",
    )
    custom = Policy(doc)
    pod = copy.deepcopy(POD)
    pod["metadata"]["labels"]["example.com/leader"] = "false"
    changed = copy.deepcopy(pod)
    changed["metadata"]["labels"]["example.com/leader"] = "true"
    assert custom.denials(pod, changed) == []
    assert custom.denials(POD, _changed("leader label set"))  # elector.io/leader is not one of them now


def test_the_policy_binding_covers_the_watched_namespaces() -> None:
    docs = render_operator({**POLICY, "namespaces": ["apps", "jobs"]})
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    policy = one(docs, "ValidatingAdmissionPolicy")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    (expression,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expression == {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["apps", "jobs"]}
    assert policy["spec"]["failurePolicy"] == "Fail"
    cluster_wide = one(render_operator({**POLICY, "clusterWide": True}), "ValidatingAdmissionPolicyBinding")
    assert "matchResources" not in cluster_wide["spec"]
    for doc in docs:
        validate_kubernetes(doc)


@pytest.mark.parametrize(
    ("capabilities", "rendered"),
    [
        ({"kube_version": "1.29.0"}, False),
        ({"kube_version": "1.30.0"}, True),
        (
            {
                "kube_version": "1.29.0",
                "api_versions": ["admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy"],
            },
            True,
        ),
    ],
    ids=["1.29", "1.30", "1.29-with-the-api"],
)
def test_the_policy_renders_only_where_the_api_exists(capabilities: dict[str, Any], rendered: bool) -> None:
    docs = render_operator(POLICY, **capabilities)
    assert (
        len(of_kind(docs, "ValidatingAdmissionPolicy"))
        == len(of_kind(docs, "ValidatingAdmissionPolicyBinding"))
        == int(rendered)
    )
    said = notes(POLICY, **capabilities)
    assert ("created (Deny)" in said) is rendered and ("SKIPPED" in said) is not rendered


def test_the_policy_is_optional() -> None:
    docs = render_operator({})
    assert not of_kind(docs, "ValidatingAdmissionPolicy") and not of_kind(
        docs, "ValidatingAdmissionPolicyBinding"
    )
    assert "ValidatingAdmissionPolicy" not in notes({})
    assert "created (Deny)" in notes(POLICY)


def test_every_value_has_a_schema_entry() -> None:
    """The schema forbids unknown keys: every key of values.yaml must be declared there."""
    schema = yaml.safe_load((OPERATOR_CHART_DIR / "values.schema.json").read_text())
    values = yaml.safe_load((OPERATOR_CHART_DIR / "values.yaml").read_text())

    def walk(node: Any, props: Doc, path: str) -> None:
        if not isinstance(node, dict) or "properties" not in props:
            return
        for key, value in node.items():
            assert key in props["properties"], f"{path}{key}"
            walk(value, props["properties"][key], f"{path}{key}.")

    walk(values, schema, "")
    try:
        render_operator(values)
    except HelmError as exc:  # pragma: no cover - the message says what is wrong
        pytest.fail(str(exc))
