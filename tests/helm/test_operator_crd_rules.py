"""The LeaderElection CRD's CEL rules (x-kubernetes-validations), evaluated with cel-python on valid and
invalid objects. kmock evaluates no CEL, and the API server would refuse these objects at admission: before
a password in spec.redis.url is stored in etcd, before the operator overwrites a pod's own label.

The rules are read from the CRD as the chart renders it; each invalid object is refused by the operator's
own spec check too (the CRD may not be installed by this chart, or be an older one)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from elector.kube.operator import resource
from tests.helm.operator_support import Doc, cel_violations, crd_cel_rules, one, render_operator

GOOD: Doc = {
    "lock": "jobs",
    "redis": {"url": "redis://redis.data:6379/0"},
    "selector": {"matchLabels": {"app": "worker"}},
}


def with_spec(**changes: Any) -> Doc:
    spec = copy.deepcopy(GOOD)
    for key, value in changes.items():
        if value is None:
            spec.pop(key, None)
        else:
            spec[key] = value
    return spec


@pytest.fixture(scope="module")
def crd() -> Doc:
    """The CRD as `helm install` applies it."""
    return one(render_operator({}), "CustomResourceDefinition")


def violations(crd: Doc, spec: Doc) -> list[str]:
    return cel_violations(crd, {"apiVersion": resource.API_VERSION, "kind": resource.KIND, "spec": spec})


def test_every_rule_compiles_and_each_case_has_one(crd: Doc) -> None:
    rules = crd_cel_rules(crd)
    assert {".".join(rule.path) for rule in rules} == {
        "spec",
        "spec.redis",
        "spec.redis.url",
        "spec.selector",
    }
    assert len(rules) == 7


VALID = {
    "url": GOOD,
    "url-secret": with_spec(redis={"urlSecretRef": {"name": "redis", "key": "url"}}),
    "password-secret": with_spec(
        redis={
            "url": "rediss://r:6380/1?ssl_cert_reqs=required",
            "passwordSecretRef": {"name": "a", "key": "p"},
        }
    ),
    "sentinel": with_spec(redis={"url": "redis+sentinel://s1:26379,s2:26379/mymaster/0"}),
    "unix": with_spec(redis={"url": "unix:///run/redis.sock?db=2"}),
    "user-in-path-is-no-credential": with_spec(redis={"url": "redis://r:6379/0?client_name=a@b"}),
    "expressions": with_spec(
        selector={"matchExpressions": [{"key": "app", "operator": "In", "values": ["worker"]}]}
    ),
    "custom-leader-label": with_spec(leaderLabel="example.com/leader"),
    "leader-label-is-a-selector-value-only": with_spec(
        selector={"matchLabels": {"role": "elector.io/leader"}}
    ),
}


@pytest.mark.parametrize("spec", VALID.values(), ids=VALID.keys())
def test_valid_objects_pass_every_rule_and_the_operator(crd: Doc, spec: Doc) -> None:
    assert violations(crd, spec) == []
    resource.parse_spec(spec)


INVALID = {
    # the issue's case: app: worker rewritten to "true"/"false", the ReplicaSet loses its pods
    "leader-label-is-a-match-label": (with_spec(leaderLabel="app"), "leaderLabel must not be a key"),
    "default-leader-label-in-match-labels": (
        with_spec(selector={"matchLabels": {"app": "w", "elector.io/leader": "true"}}),
        "leaderLabel must not be a key of selector.matchLabels",
    ),
    "leader-label-in-match-expressions": (
        with_spec(
            leaderLabel="tier",
            selector={"matchExpressions": [{"key": "tier", "operator": "Exists"}]},
        ),
        "leaderLabel must not be a key of selector.matchExpressions",
    ),
    "default-leader-label-in-match-expressions": (
        with_spec(selector={"matchExpressions": [{"key": "elector.io/leader", "operator": "Exists"}]}),
        "leaderLabel must not be a key of selector.matchExpressions",
    ),
    "url-and-url-secret": (
        with_spec(redis={"url": "redis://r:6379", "urlSecretRef": {"name": "s", "key": "url"}}),
        "exactly one of url and urlSecretRef",
    ),
    "neither-url-nor-url-secret": (
        with_spec(redis={"passwordSecretRef": {"name": "s", "key": "p"}}),
        "exactly one of url and urlSecretRef",
    ),
    "user-and-password": (with_spec(redis={"url": "redis://app:s3cret@r:6379/0"}), "credentials"),
    "password-only": (with_spec(redis={"url": "rediss://:s3cret@r:6380"}), "credentials"),
    "password-query": (with_spec(redis={"url": "redis://r:6379/0?password=s3cret"}), "credentials"),
    "password-query-any-case": (
        with_spec(redis={"url": "redis://r:6379/0?db=1&PassWord=s3cret"}),
        "credentials",
    ),
    "token-query-without-value-separator": (with_spec(redis={"url": "redis://r/0?token"}), "credentials"),
    "escaped-query-key": (
        with_spec(redis={"url": "redis://r:6379/0?%70assword=s3cret"}),
        "percent-encoded",
    ),
    "empty-selector": (with_spec(selector={}), "needs matchLabels or matchExpressions"),
    "empty-match-labels": (
        with_spec(selector={"matchLabels": {}, "matchExpressions": []}),
        "needs matchLabels or matchExpressions",
    ),
}


@pytest.mark.parametrize(("spec", "message"), INVALID.values(), ids=INVALID.keys())
def test_invalid_objects_are_refused_by_a_rule_and_by_the_operator(crd: Doc, spec: Doc, message: str) -> None:
    refused = violations(crd, spec)
    assert refused, "admitted"
    assert any(message in text for text in refused), refused
    with pytest.raises(resource.SpecError):
        resource.parse_spec(spec)


def test_the_messages_never_repeat_the_url(crd: Doc) -> None:
    """`kubectl apply` prints the messages: a password that was refused must not be shown back."""
    for text in violations(crd, INVALID["user-and-password"][0]):
        assert "s3cret" not in text


def test_the_elector_charts_leader_election_passes_every_rule(crd: Doc, render: Any) -> None:
    """The LeaderElection the elector chart renders for its workload (helm/elector, leaderElection)."""
    for values in (
        {},
        {"elector": {"redis": {"url": "redis://redis.data:6379/0", "existingSecret": "redis-auth"}}},
    ):
        (election,) = [
            d for d in render(values, api_versions=[resource.API_VERSION]) if d["kind"] == resource.KIND
        ]
        assert cel_violations(crd, election) == []
        resource.parse_spec(election["spec"])
