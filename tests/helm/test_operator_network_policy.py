"""The operator's NetworkPolicy (helm/elector-operator): ingress only to its HTTP port, egress only to DNS,
the Kubernetes API and Redis; valid for Kubernetes 1.27 and the newest schemas (strict); checkov's
CKV2_K8S_6 is then met, not skipped (test_checkov.py runs checkov)."""

from __future__ import annotations

import pytest
from helm_python.errors import HelmRenderError

from tests.helm.operator_support import KUBE_VERSIONS, of_kind, one, render_operator, validate_kubernetes

SKIP6 = "checkov.io/skip6"


def test_the_operator_has_a_network_policy_by_default() -> None:
    docs = render_operator({})
    policy = one(docs, "NetworkPolicy")
    for version in KUBE_VERSIONS:
        validate_kubernetes(policy, [version])
    deployment = one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    # the pre-delete hook's pod is not the operator's (its own component label)
    job_labels = one(docs, "Job")["spec"]["template"]["metadata"]["labels"]
    assert not policy["spec"]["podSelector"]["matchLabels"].items() <= job_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (http,) = container["ports"]
    assert policy["spec"]["ingress"] == [{"ports": [{"port": http["containerPort"], "protocol": "TCP"}]}]
    egress = [sorted((p["port"], p["protocol"]) for p in rule["ports"]) for rule in policy["spec"]["egress"]]
    assert egress == [
        [(53, "TCP"), (53, "UDP")],
        [(443, "TCP"), (6443, "TCP")],
        [(6379, "TCP"), (6380, "TCP"), (26379, "TCP")],
    ]
    assert all("to" not in rule for rule in policy["spec"]["egress"])
    # met, so not skipped: only the hook's Job keeps the skip (it lives for the length of helm uninstall)
    assert SKIP6 not in deployment["metadata"]["annotations"]
    assert SKIP6 in one(docs, "Job")["metadata"]["annotations"]


def test_peers_and_ports_come_from_the_values() -> None:
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    redis = {"ipBlock": {"cidr": "10.20.0.0/16"}}
    api = {"ipBlock": {"cidr": "172.20.0.1/32"}}
    extra = {"to": [{"ipBlock": {"cidr": "10.9.0.0/16"}}], "ports": [{"port": 8443, "protocol": "TCP"}]}
    values = {
        "redis": {"url": "redis://redis.data:7000/0"},
        "networkPolicy": {
            "metrics": {"from": [prometheus]},
            "kubernetesApi": {"to": [api]},
            "redis": {"ports": [7000], "to": [redis]},
            "extraEgress": [extra],
        },
    }
    policy = one(render_operator(values), "NetworkPolicy")
    validate_kubernetes(policy)
    assert policy["spec"]["ingress"][0]["from"] == [prometheus]
    _, api_rule, redis_rule, extra_rule = policy["spec"]["egress"]
    assert api_rule["to"] == [api]
    assert redis_rule == {"ports": [{"port": 7000, "protocol": "TCP"}], "to": [redis]}
    assert extra_rule == extra


@pytest.mark.parametrize(
    "url",
    ["redis://redis.data:7000/0", "redis+sentinel://s1:26379,s2:26380/mymaster"],
    ids=["plain", "sentinel"],
)
def test_a_policy_that_would_cut_the_operator_from_its_own_redis_is_refused(url: str) -> None:
    with pytest.raises(HelmRenderError, match=r"networkPolicy\.redis\.ports has no"):
        render_operator({"redis": {"url": url}})
    render_operator({"redis": {"url": url}, "networkPolicy": {"enabled": False}})


def test_the_policy_can_be_turned_off() -> None:
    docs = render_operator({"networkPolicy": {"enabled": False}})
    assert not of_kind(docs, "NetworkPolicy")
    assert SKIP6 in one(docs, "Deployment")["metadata"]["annotations"]
