"""The elector chart's LeaderElection for its example workload, against the elector-operator chart that acts
on it (helm/elector-operator), and the sidecar values for priority, leader file, WAIT for replicas and Redis
TLS, rendered by the real Helm engine."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_python.chart import Chart
from helm_python.errors import HelmError, HelmRenderError

from elector.kube.operator import resource
from tests.helm.operator_support import is_hook, render_operator

Render = Callable[..., list[dict[str, Any]]]
Notes = Callable[..., str]
Validate = Callable[[dict[str, Any]], None]
NAMESPACE = "apps"  # the namespace the conftest fixtures render into
KUBE_VERSIONS = ["1.27.0", kubernetes_validate.utils.latest_version()]
#: A cluster where the elector-operator chart installed the LeaderElection CRD.
WITH_CRD = {"api_versions": ["elector.io/v1alpha1"]}
FORCED = {"leaderElection": {"enabled": True}}
WITH_SECRET = {
    **FORCED,
    "elector": {
        "lock": "nightly",
        "redis": {"url": "redis://redis.data:6379/2", "existingSecret": "redis-auth"},
    },
}


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in of_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(matches) == 1, [d["metadata"]["name"] for d in matches]
    return matches[0]


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    workload = [
        d
        for d in of_kind(docs, "Deployment")
        if d["spec"]["template"]["spec"]["containers"][0]["name"] == "app"
    ]
    assert len(workload) == 1
    spec: dict[str, Any] = workload[0]["spec"]["template"]["spec"]
    return spec


def container(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(c for c in pod_spec(docs)["containers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


# --- when the LeaderElection renders -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "capabilities", "rendered"),
    [
        ({}, {}, False),  # auto, and no LeaderElection API: nothing would act on it
        ({}, WITH_CRD, True),  # auto + the operator chart's CRD: no flag needed
        (FORCED, {}, True),  # `helm template`, or the CRD installed in the same step
        ({"leaderElection": {"enabled": False}}, WITH_CRD, False),
        ({"workload": {"enabled": False}}, WITH_CRD, False),  # no workload, nothing to select
    ],
    ids=["default", "crd-installed", "forced", "off", "no-workload"],
)
def test_when_the_leader_election_renders(
    render: Render, values: dict[str, Any], capabilities: dict[str, Any], rendered: bool
) -> None:
    assert len(of_kind(render(values, **capabilities), "LeaderElection")) == int(rendered)


def test_the_elector_chart_renders_no_operator_and_no_crd(render: Render, chart_dir: Path) -> None:
    """The operator and its CRD are the elector-operator chart's (problem 2: no CRD rights for app teams)."""
    docs = render(WITH_SECRET, **WITH_CRD)
    assert not of_kind(docs, "CustomResourceDefinition")
    assert not [d for d in docs if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    assert not (chart_dir / "crds").exists() and not (chart_dir / "templates" / "operator").exists()


# --- what it says ----------------------------------------------------------------------------------------


def test_leader_election_matches_the_sidecar_and_the_leader_service(
    render: Render, validate_leader_election: Validate
) -> None:
    docs = render(WITH_SECRET)
    election = one(docs, "LeaderElection")
    validate_leader_election(election)
    assert (election["metadata"]["name"], election["metadata"]["namespace"]) == ("demo-elector", NAMESPACE)
    assert election["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    spec = election["spec"]
    sidecar_env = env_of(container(docs, "elector"))
    assert spec["lock"] == sidecar_env["ELECTOR_LOCK"] == "nightly"
    assert spec["redis"] == {
        "url": sidecar_env["ELECTOR_REDIS_URL"],
        "passwordSecretRef": {"name": "redis-auth", "key": "password"},  # the sidecar's Secret, by reference
    }
    # the candidates are exactly the workload's pods, not the operator's (same release name) ...
    deployment = one(docs, "Deployment", "demo-elector")
    assert spec["selector"] == {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}
    assert resource.selector_matches(spec["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    operator = one(render_operator({}), "Deployment")
    assert not resource.selector_matches(spec["selector"], operator["spec"]["template"]["metadata"]["labels"])
    # ... and the label the operator sets is the one the leader Service selects
    service_selector = one(docs, "Service", "demo-elector-leader")["spec"]["selector"]
    assert service_selector == {**spec["selector"]["matchLabels"], spec["leaderLabel"]: "true"}
    # the operator's own parser accepts it, with the values' handoff timing
    parsed = resource.parse_spec(spec)
    assert (parsed.lock, parsed.redis_url, parsed.key_prefix) == (
        "nightly",
        "redis://redis.data:6379/2",
        "elector",
    )
    assert (parsed.handoff_window_s, parsed.handoff_timeout_s) == (10, 30)
    assert parsed.password_secret is not None


def test_no_password_secret_ref_without_a_secret(render: Render, validate_leader_election: Validate) -> None:
    election = one(
        render({"leaderElection": {"enabled": True, "handoffWindowSeconds": 2.5}}), "LeaderElection"
    )
    validate_leader_election(election)
    assert election["spec"]["redis"] == {"url": "redis://redis:6379/0"}
    assert election["spec"]["handoffWindowSeconds"] == 2.5


def test_the_crd_check_is_strict(render: Render, validate_leader_election: Validate) -> None:
    """The check would catch a field the CRD lacks (which the API server silently prunes)."""
    good = one(render(WITH_SECRET), "LeaderElection")
    for path, value in [
        (("spec", "redis", "password"), "hunter2"),
        (("spec", "leaderLabels"), "x"),
        (("spec", "selector", "matchLabel"), {}),
        (("metadata", "labelz"), {}),
        (("kind",), "LeaderElections"),
    ]:
        bad = copy.deepcopy(good)
        node = bad
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        with pytest.raises(jsonschema.ValidationError):
            validate_leader_election(bad)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_turnkey_releases_are_valid_kubernetes_and_fit_together(
    render: Render, validate_leader_election: Validate, kube_version: str
) -> None:
    """The two charts as a platform team installs them: the operator (watching "apps", allowed to read the
    workload's password Secret and nothing else) and the workload with its LeaderElection."""
    operator_docs = render_operator({"rbac": {"secretNames": ["redis-auth"]}})
    workload_docs = render(WITH_SECRET, **WITH_CRD)
    for doc in operator_docs + workload_docs:
        if doc["kind"] == "LeaderElection":
            validate_leader_election(doc)
        elif doc["kind"] != "ValidatingAdmissionPolicy":
            kubernetes_validate.validate(doc, kube_version, strict=True)
    election = one(workload_docs, "LeaderElection")
    (role,) = [d for d in operator_docs if d["kind"] == "Role" and not is_hook(d)]
    assert role["metadata"]["namespace"] == election["metadata"]["namespace"]
    (secrets,) = [rule for rule in role["rules"] if rule["resources"] == ["secrets"]]
    assert secrets["resourceNames"] == [election["spec"]["redis"]["passwordSecretRef"]["name"]]
    (hook_role,) = [
        d
        for d in operator_docs
        if d["kind"] == "Role" and is_hook(d) and d["metadata"]["name"].endswith("-pre-delete")
    ]
    assert hook_role["metadata"]["namespace"] == election["metadata"]["namespace"]  # uninstall lets go of it


def test_leader_election_refuses_a_socket_the_operator_cannot_reach(render: Render) -> None:
    values = {**FORCED, "elector": {"redis": {"url": "unix:///run/redis.sock"}}}
    with pytest.raises(HelmRenderError, match="unix:// socket, which the operator's pod cannot reach"):
        render(values)
    render({**values, "leaderElection": {"enabled": False}})  # the way out the message names


def test_credentials_in_the_url_are_refused(render: Render) -> None:
    values = {**FORCED, "elector": {"redis": {"url": "redis://app:hunter2@redis.data:6379/0"}}}
    with pytest.raises(HelmError, match="existingSecret"):  # the values schema, or the template's check
        render(values)


def test_notes_say_how_the_leader_service_gets_its_endpoint(chart: Chart, render_notes: Notes) -> None:
    default = render_notes(chart, {})
    assert "NO endpoints" in default and "elector-operator" in default
    installed = render_notes(chart, {}, **WITH_CRD)
    assert "LeaderElection demo-elector" in installed
    assert "kubectl -n apps get leaderelection demo-elector" in installed
    switched_off = render_notes(chart, {"leaderElection": {"enabled": False}}, **WITH_CRD)
    assert "NO endpoints" in switched_off and "leaderElection.enabled=false" in switched_off
    tls = {
        **FORCED,
        "elector": {"redis": {"url": "rediss://redis.data:6380/0", "tls": {"existingSecret": "redis-tls"}}},
    }
    assert "without elector.redis.tls's files" in render_notes(chart, tls)


# --- sidecar values: priority, leader file, WAIT, TLS -----------------------------------------------------


def test_new_settings_are_off_by_default(render: Render) -> None:
    docs = render({})
    env = env_of(container(docs, "elector"))
    for name in ("PRIORITY", "LEADER_FILE", "MIN_REPLICAS_ACK", "REPLICAS_ACK_TIMEOUT", "REDIS_TLS_CA"):
        assert f"ELECTOR_{name}" not in env
    assert "volumeMounts" not in container(docs, "app") and "volumes" not in pod_spec(docs)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_leader_file_is_shared_through_an_empty_dir(render: Render, kube_version: str) -> None:
    docs = render({"elector": {"leaderFile": "/var/run/elector/leader.json"}})
    sidecar, app = container(docs, "elector"), container(docs, "app")
    assert (
        env_of(sidecar)["ELECTOR_LEADER_FILE"]
        == env_of(app)["ELECTOR_LEADER_FILE"]
        == "/var/run/elector/leader.json"
    )
    assert sidecar["volumeMounts"] == [
        {"name": "elector-leader", "mountPath": "/var/run/elector"}
    ]  # writable
    assert app["volumeMounts"] == [
        {"name": "elector-leader", "mountPath": "/var/run/elector", "readOnly": True}
    ]
    assert pod_spec(docs)["volumes"] == [
        {"name": "elector-leader", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    ]
    kubernetes_validate.validate(one(docs, "Deployment"), kube_version, strict=True)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_tls_files_from_a_secret(render: Render, kube_version: str) -> None:
    values = {
        "elector": {
            "redis": {
                "url": "rediss://redis.data:6380/0",
                "existingSecret": "redis-auth",
                "tls": {"existingSecret": "redis-client-tls"},
            }
        }
    }
    docs = render(values)
    sidecar = container(docs, "elector")
    env = env_of(sidecar)
    assert env["ELECTOR_REDIS_TLS_CA"] == "/etc/elector/redis-tls/ca.crt"
    assert env["ELECTOR_REDIS_TLS_CERT"] == "/etc/elector/redis-tls/tls.crt"
    assert env["ELECTOR_REDIS_TLS_KEY"] == "/etc/elector/redis-tls/tls.key"
    assert {"name": "elector-redis-tls", "mountPath": "/etc/elector/redis-tls", "readOnly": True} in sidecar[
        "volumeMounts"
    ]
    volume = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "elector-redis-tls")
    assert volume["secret"]["secretName"] == "redis-client-tls"
    assert volume["secret"]["items"] == [
        {"key": "ca.crt", "path": "ca.crt"},
        {"key": "tls.crt", "path": "tls.crt"},
        {"key": "tls.key", "path": "tls.key"},
    ]
    assert "volumeMounts" not in container(docs, "app")  # the key stays in the sidecar
    kubernetes_validate.validate(one(docs, "Deployment"), kube_version, strict=True)


def test_tls_ca_only(render: Render) -> None:
    values = {
        "elector": {
            "redis": {
                "url": "rediss+sentinel://s1:26379,s2:26379/mymaster",
                "tls": {"existingSecret": "redis-ca", "caKey": "bundle.pem", "certKey": "", "keyKey": ""},
            }
        }
    }
    docs = render(values)
    env = env_of(container(docs, "elector"))
    assert env["ELECTOR_REDIS_TLS_CA"] == "/etc/elector/redis-tls/ca.crt"
    assert "ELECTOR_REDIS_TLS_CERT" not in env and "ELECTOR_REDIS_TLS_KEY" not in env
    (volume,) = pod_spec(docs)["volumes"]
    assert volume["secret"]["items"] == [{"key": "bundle.pem", "path": "ca.crt"}]


@pytest.mark.parametrize(
    ("elector", "message"),
    [
        (
            {"redis": {"url": "redis://r:6379/0", "tls": {"existingSecret": "t"}}},
            "needs a rediss:// or rediss\\+sentinel://",
        ),
        (
            {"redis": {"url": "rediss://r:6380/0", "tls": {"existingSecret": "t", "keyKey": ""}}},
            "set certKey and keyKey together",
        ),
        (
            {
                "redis": {
                    "url": "rediss://r:6380/0",
                    "tls": {"existingSecret": "t", "caKey": "", "certKey": "", "keyKey": ""},
                }
            },
            "nothing to mount",
        ),
        ({"leaderFile": "/etc/elector/redis/leader.json"}, "where the sidecar mounts a Secret"),
        ({"replicasAckTimeout": "100ms"}, r"only applies with (elector\.)?minReplicasAck 1 or more"),
    ],
    ids=[
        "tls-without-rediss",
        "cert-without-key",
        "tls-nothing",
        "leader-file-on-secret",
        "ack-timeout-alone",
    ],
)
def test_sidecar_value_combinations_are_checked(
    render: Render, elector: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmRenderError, match=message):
        render({"elector": elector})


def test_priority_and_replica_acks(render: Render) -> None:
    env = env_of(
        container(
            render({"elector": {"priority": -3, "minReplicasAck": 2, "replicasAckTimeout": "150ms"}}),
            "elector",
        )
    )
    assert (
        env["ELECTOR_PRIORITY"],
        env["ELECTOR_MIN_REPLICAS_ACK"],
        env["ELECTOR_REPLICAS_ACK_TIMEOUT"],
    ) == (
        "-3",
        "2",
        "150ms",
    )
    big = env_of(container(render({"elector": {"priority": 1000000}}), "elector"))
    assert big["ELECTOR_PRIORITY"] == "1000000"  # not 1e+06: YAML numbers are floats to the template engine


def test_values_file_numbers_render_as_integers(chart: Chart, chart_dir: Path, tmp_path: Path) -> None:
    """Values from a file reach the templates as float64 (unlike --set); the env must still be integers."""
    values = yaml.safe_load((chart_dir / "ci" / "leader-election-values.yaml").read_text())
    manifests = chart.render(values, name="demo", namespace=NAMESPACE)
    docs = [
        d for p, t in manifests.items() if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d
    ]
    env = env_of(container(docs, "elector"))
    assert env["ELECTOR_PRIORITY"] == "10" and env["ELECTOR_MIN_REPLICAS_ACK"] == "1"


def test_parent_chart_overrides_priority_and_mounts_the_leader_file(
    tmp_path: Path,
    library_dir: Path,
    assemble: Callable[[Path, Path], Path],
    render_chart: Callable[..., list[dict[str, Any]]],
) -> None:
    """Two Deployments of a parent chart on one lock, one preferred (the library's `overrides`); the app
    reads the leader file."""
    parent = tmp_path / "billing"
    (parent / "templates").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: billing\nversion: 1.0.0\n"
        f"dependencies:\n  - name: elector-sidecar\n    version: 0.2.0\n    repository: file://{library_dir}\n"
    )
    (parent / "values.yaml").write_text("leader:\n  lock: billing\n  leaderFile: /run/elector/leader.json\n")
    template = """{{- range $zone, $priority := dict "a" 10 "b" 0 }}
{{- $sidecar := dict "values" $.Values.leader "context" $ }}
{{- $preferred := merge (dict "overrides" (dict "priority" $priority)) $sidecar }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: billing-{{ $zone }}
spec:
  selector:
    matchLabels: {app: billing, zone: {{ $zone }}}
  template:
    metadata:
      labels: {app: billing, zone: {{ $zone }}}
    spec:
      containers:
        - name: app
          image: example/billing:1.0
          volumeMounts:
            {{- include "elector-sidecar.leaderFileMount" $sidecar | nindent 12 }}
        {{- include "elector-sidecar.container" $preferred | nindent 8 }}
      volumes:
        {{- include "elector-sidecar.volumes" $sidecar | nindent 8 }}
{{- end }}
"""
    (parent / "templates" / "deployments.yaml").write_text(template)
    docs = render_chart(Chart.load(assemble(parent, tmp_path / "built")), {})
    by_name = {d["metadata"]["name"]: d for d in docs}
    for name, priority in (("billing-a", "10"), ("billing-b", None)):
        pod = by_name[name]["spec"]["template"]["spec"]
        app, sidecar = pod["containers"]
        assert env_of(sidecar).get("ELECTOR_PRIORITY") == priority  # 0 is the daemon's default: not passed
        assert app["volumeMounts"] == [
            {"name": "elector-leader", "mountPath": "/run/elector", "readOnly": True}
        ]
        assert pod["volumes"] == [
            {"name": "elector-leader", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
        ]
        for kube_version in KUBE_VERSIONS:
            kubernetes_validate.validate(by_name[name], kube_version, strict=True)


# --- the example consumer of the leader file: `elector leader-file check` in a loop ---------------------

CONSUMER = {
    "elector": {"leaderFile": "/var/run/elector/leader.json"},
    "workload": {"leaderFileConsumer": {"enabled": True}},
}


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_the_leader_file_consumer_checks_the_file_it_mounts_read_only(
    render: Render, kube_version: str
) -> None:
    docs = render(CONSUMER)
    consumer, sidecar = container(docs, "leader-file-check"), container(docs, "elector")
    assert consumer["image"] == sidecar["image"]  # elector's own image: it has the CLI
    assert 'elector leader-file check "$ELECTOR_LEADER_FILE"' in consumer["args"][0]
    assert env_of(consumer) == {
        "ELECTOR_LEADER_FILE": "/var/run/elector/leader.json",
        "CHECK_INTERVAL_SECONDS": "2",
    }
    assert consumer["volumeMounts"] == [
        {"name": "elector-leader", "mountPath": "/var/run/elector", "readOnly": True}
    ]
    assert consumer["securityContext"]["readOnlyRootFilesystem"] is True
    kubernetes_validate.validate(one(docs, "Deployment"), kube_version, strict=True)
    assert "leader-file-check" not in [
        c["name"] for c in pod_spec(render({"elector": CONSUMER["elector"]}))["containers"]
    ]


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"workload": {"leaderFileConsumer": {"enabled": True}}}, "needs elector.leaderFile"),
        (
            {**CONSUMER, "workload": {"leaderFileConsumer": {"enabled": True, "intervalSeconds": 0}}},
            "intervalSeconds",
        ),
        ({**CONSUMER, "workload": {"leaderFileConsumer": {"enabled": True, "every": 1}}}, "every"),
    ],
)
def test_the_leader_file_consumer_refuses_what_cannot_work(
    render: Render, values: dict[str, Any], problem: str
) -> None:
    with pytest.raises(HelmError, match=problem):  # a failed check, or the values schema
        render(values)


def test_the_rendered_consumer_loop_follows_the_files_validity(render: Render, tmp_path: Path) -> None:
    """The container's own script, run by /bin/sh with this checkout's `elector` on PATH."""
    consumer = container(render(CONSUMER), "leader-file-check")
    path = tmp_path / "leader.json"
    valid_until_ms = round((time.time() + 3.0) * 1000)
    content = {
        "lock": "jobs",
        "identity": "pod-a",
        "is_leader": True,
        "fencing_token": 7,
        "valid_until_ms": valid_until_ms,
    }
    path.write_text(json.dumps(content) + "\n")  # a sidecar that then died: never renewed
    env = {
        **os.environ,
        **env_of(consumer),
        "ELECTOR_LEADER_FILE": str(path),
        "CHECK_INTERVAL_SECONDS": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    process = subprocess.Popen(
        [*consumer["command"], consumer["args"][0]], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline(), process.stdout.readline()]  # one line per change of role
    finally:
        process.kill()
        process.wait()
    assert lines[0].startswith("leading: lock 'jobs', fencing token 7"), lines
    assert lines[1].startswith("not leading: lock 'jobs': the lease's validity ended"), lines
    assert time.time() * 1000 >= valid_until_ms
