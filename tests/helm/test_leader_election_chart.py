"""The chart's turnkey leader-only Service (a LeaderElection for the example workload) and the sidecar values
for priority, leader file, WAIT for replicas and Redis TLS, rendered by the real Helm engine."""

from __future__ import annotations

import copy
import json
import os
import shutil
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

Render = Callable[[dict[str, Any]], list[dict[str, Any]]]
Validate = Callable[[dict[str, Any]], None]
NAMESPACE = "apps"  # the namespace the conftest fixtures render into
KUBE_VERSIONS = ["1.27.0", kubernetes_validate.utils.latest_version()]
OPERATOR = {"operator": {"enabled": True}}
WITH_SECRET = {
    **OPERATOR,
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


def notes(chart: Chart, values: dict[str, Any]) -> str:
    return str(chart.render(values, name="demo", namespace=NAMESPACE)["elector/templates/NOTES.txt"])


# --- when the LeaderElection renders -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "rendered"),
    [
        ({}, False),  # auto, no operator: nothing would act on it
        (OPERATOR, True),  # auto + this release's operator: the turnkey case, one --set
        ({"leaderElection": {"enabled": True}}, True),  # an operator from another release
        ({**OPERATOR, "leaderElection": {"enabled": False}}, False),
        ({**OPERATOR, "workload": {"enabled": False}}, False),  # no workload, nothing to select
    ],
    ids=["default", "operator", "forced", "off", "no-workload"],
)
def test_when_the_leader_election_renders(render: Render, values: dict[str, Any], rendered: bool) -> None:
    assert len(of_kind(render(values), "LeaderElection")) == int(rendered)


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
    # the candidates are exactly the workload's pods ...
    deployment = one(docs, "Deployment", "demo-elector")
    assert spec["selector"] == {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}
    assert resource.selector_matches(spec["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    operator_pod_labels = one(docs, "Deployment", "demo-elector-operator")["spec"]["template"]["metadata"][
        "labels"
    ]
    assert not resource.selector_matches(spec["selector"], operator_pod_labels)
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
    election = one(render({**OPERATOR, "leaderElection": {"handoffWindowSeconds": 2.5}}), "LeaderElection")
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
def test_turnkey_release_is_valid_kubernetes(
    render: Render, validate_leader_election: Validate, kube_version: str
) -> None:
    for doc in render(WITH_SECRET):
        if doc["kind"] == "LeaderElection":
            validate_leader_election(doc)
        else:
            kubernetes_validate.validate(doc, kube_version, strict=True)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"elector": {"redis": {"url": "unix:///run/redis.sock"}}},
            "unix:// socket, which the operator's pod cannot reach",
        ),
        (
            {"operator": {"enabled": True, "namespaces": ["jobs"]}},
            "does not include the release namespace apps",
        ),
    ],
    ids=["unix-socket", "unwatched-namespace"],
)
def test_leader_election_refuses_what_the_operator_cannot_use(
    render: Render, values: dict[str, Any], message: str
) -> None:
    merged = {**values, "operator": {"enabled": True, **values.get("operator", {})}}
    with pytest.raises(HelmRenderError, match=message):
        render(merged)
    render({**merged, "leaderElection": {"enabled": False}})  # the way out the message names


def test_credentials_in_the_url_are_refused_without_echoing_them(render: Render) -> None:
    values = {**OPERATOR, "elector": {"redis": {"url": "redis://app:hunter2@redis.data:6379/0"}}}
    with pytest.raises(HelmRenderError, match="holds credentials") as failure:
        render(values)
    assert "hunter2" not in str(failure.value)


def test_operator_watching_the_release_namespace_is_fine(render: Render) -> None:
    docs = render({"operator": {"enabled": True, "namespaces": ["jobs", NAMESPACE]}})
    assert of_kind(docs, "LeaderElection")
    assert of_kind(
        render({"operator": {"enabled": True, "clusterWide": True, "namespaces": ["jobs"]}}), "LeaderElection"
    )


def test_notes_say_how_the_leader_service_gets_its_endpoint(chart: Chart) -> None:
    default = notes(chart, {})
    assert "NO endpoints" in default and "--set operator.enabled=true" in default
    turnkey = notes(chart, OPERATOR)
    assert "NO endpoints" not in turnkey and "LeaderElection demo-elector" in turnkey
    assert "kubectl -n apps get leaderelection demo-elector" in turnkey
    elsewhere = notes(chart, {"leaderElection": {"enabled": True}})
    assert "must run elsewhere, otherwise this Service has NO endpoints" in elsewhere
    switched_off = notes(chart, {**OPERATOR, "leaderElection": {"enabled": False}})
    assert "NO endpoints" in switched_off and "--set operator.enabled=true" not in switched_off
    tls = {
        **OPERATOR,
        "elector": {"redis": {"url": "rediss://redis.data:6380/0", "tls": {"existingSecret": "redis-tls"}}},
    }
    assert "without elector.redis.tls's files" in notes(chart, tls)


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
        ({"replicasAckTimeout": "100ms"}, "only applies with elector.minReplicasAck 1 or more"),
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
    tmp_path: Path, chart_dir: Path, render_chart: Callable[..., list[dict[str, Any]]]
) -> None:
    """Two Deployments of a parent chart on one lock, one preferred; the app reads the leader file."""
    parent = tmp_path / "billing"
    (parent / "templates").mkdir(parents=True)
    shutil.copytree(chart_dir, parent / "charts" / "elector")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: billing\nversion: 1.0.0\n"
        "dependencies:\n  - name: elector\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text(
        "elector:\n  workload:\n    enabled: false\n  elector:\n    lock: billing\n"
        "    leaderFile: /run/elector/leader.json\n"
    )
    template = """{{- range $zone, $priority := dict "a" 10 "b" 0 }}
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
            {{- include "elector.leaderFileMount" (dict "root" $) | nindent 12 }}
        {{- include "elector.sidecar" (dict "root" $ "priority" $priority) | nindent 8 }}
      volumes:
        {{- include "elector.sidecarVolumes" (dict "root" $) | nindent 8 }}
{{- end }}
"""
    (parent / "templates" / "deployments.yaml").write_text(template)
    docs = render_chart(Chart.load(parent), {})
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
