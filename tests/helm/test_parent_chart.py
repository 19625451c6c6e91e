"""The library chart helm/elector-sidecar in an application team's own chart.

A parent chart is built in tmp_path the way a team writes one: its own Deployments and NetworkPolicy,
the library as a dependency under an alias (`leader`), copied under charts/ as a directory or as the
.tgz `helm dependency build` fetches. Each template takes the sidecar's values explicitly, so the alias
does not matter; nothing but the parent's own objects renders (no CRD, no example workload), and every
document is valid Kubernetes.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm_python.chart import Chart, lint, package
from helm_python.errors import HelmRenderError

RenderChart = Callable[..., list[dict[str, Any]]]
OLDEST_KUBE = "1.27.0"
NEWEST_KUBE = kubernetes_validate.utils.latest_version()
SIDECAR = '(dict "values" .Values.leader "context" $)'

DEPLOYMENT = """\
{{- $sidecar := dict "values" .Values.leader "context" $ }}
{{- range $name, $priority := dict "billing" 0 "billing-preferred" 10 }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $.Release.Namespace }}
spec:
  replicas: 2
  selector:
    matchLabels:
      app: {{ $name }}
  template:
    metadata:
      labels:
        app: {{ $name }}
    spec:
      terminationGracePeriodSeconds: 30
      {{- with include "elector-sidecar.imagePullSecrets" $sidecar | trim }}
      imagePullSecrets:
        {{- . | nindent 8 }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        seccompProfile:
          type: RuntimeDefault
      containers:
        - name: app
          image: example/billing:1.0
          env:
            {{- include "elector-sidecar.appEnv" $sidecar | nindent 12 }}
          {{- with include "elector-sidecar.leaderFileMount" $sidecar }}
          volumeMounts:
            {{- . | nindent 12 }}
          {{- end }}
        {{- $this := merge (dict "overrides" (dict "priority" $priority)) $sidecar }}
        {{- include "elector-sidecar.container" $this | nindent 8 }}
      {{- with include "elector-sidecar.volumes" $sidecar }}
      volumes:
        {{- . | nindent 8 }}
      {{- end }}
{{- end }}
"""

NETWORK_POLICY = """\
{{- $redis := dict "values" .Values.leader "context" $ "sentinelMasterPorts" (list 6379) }}
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: billing
  namespace: {{ .Release.Namespace }}
spec:
  podSelector: {}
  policyTypes: [Egress]
  egress:
    - ports:
        - port: 53
          protocol: UDP
    - ports:
        {{- include "elector-sidecar.redisEgressPorts" $redis | nindent 8 }}
"""

VALUES = {
    "leader": {
        "lock": "billing-cron",
        "redis": {
            "url": "redis+sentinel://s1.data:26379,s2.data:26380/mymaster/0",
            "existingSecret": "redis-auth",
        },
        "port": 9090,
        "leaderFile": "/var/run/elector/leader.json",
        "image": {"pullSecrets": ["ghcr"]},
    }
}


def build_parent(
    tmp_path: Path, library_dir: Path, *, alias: str | None = "leader", packaged: bool = False
) -> Path:
    """A parent chart "billing" depending on the library (under `alias`), the library in its charts/."""
    parent = tmp_path / "billing"
    (parent / "templates").mkdir(parents=True)
    version = yaml.safe_load((library_dir / "Chart.yaml").read_text())["version"]
    dependency = {"name": "elector-sidecar", "version": version, "repository": f"file://{library_dir}"}
    if alias:
        dependency["alias"] = alias
    chart = {"apiVersion": "v2", "name": "billing", "version": "1.0.0", "appVersion": "9.9.9"}
    (parent / "Chart.yaml").write_text(yaml.safe_dump(chart | {"dependencies": [dependency]}))
    (parent / "values.yaml").write_text(yaml.safe_dump(VALUES))
    (parent / "templates" / "deployment.yaml").write_text(DEPLOYMENT)
    (parent / "templates" / "networkpolicy.yaml").write_text(NETWORK_POLICY)
    charts = parent / "charts"
    charts.mkdir()
    if packaged:  # what `helm dependency build` leaves: charts/elector-sidecar-<version>.tgz
        archive = Path(package(library_dir, destination=charts))
        assert archive.name == f"elector-sidecar-{version}.tgz"
    else:
        shutil.copytree(library_dir, charts / "elector-sidecar")
    return parent


def deployments(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}


def containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


@pytest.mark.parametrize("packaged", [False, True], ids=["directory", "tgz"])
def test_a_parent_chart_with_an_aliased_dependency_renders_only_its_own_objects(
    tmp_path: Path, library_dir: Path, render_chart: RenderChart, packaged: bool
) -> None:
    parent = build_parent(tmp_path, library_dir, packaged=packaged)
    chart = Chart.load(parent)
    assert [d["name"] for d in chart.dependencies] == ["elector-sidecar"]
    assert chart.crds == []  # no CRD to install: an app team needs no cluster-wide rights
    for kube_version in (OLDEST_KUBE, NEWEST_KUBE):
        docs = render_chart(chart, {}, name="billing", kube_version=kube_version)
        # the parent's own objects, nothing of the example chart (no workload, Services, PDB, LeaderElection)
        assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
            ("Deployment", "billing"),
            ("Deployment", "billing-preferred"),
            ("NetworkPolicy", "billing"),
        ]
        for doc in docs:
            kubernetes_validate.validate(doc, kube_version, strict=True)
    result = lint(parent, {}, strict=True, kube_version=f"v{NEWEST_KUBE}")
    assert result["errors"] == [] and all(m["severity"] < 2 for m in result["messages"]), result


def test_the_sidecar_takes_the_values_it_is_given(
    tmp_path: Path, library_dir: Path, render_chart: RenderChart
) -> None:
    docs = render_chart(Chart.load(build_parent(tmp_path, library_dir)), {}, name="billing")
    billing, preferred = deployments(docs)["billing"], deployments(docs)["billing-preferred"]
    app, sidecar = containers(billing)["app"], containers(billing)["elector"]
    # the library's appVersion, not the parent's 9.9.9
    assert sidecar["image"] == "ghcr.io/elector-dev/elector:0.2.0"
    env = env_of(sidecar)
    assert env["ELECTOR_LOCK"] == "billing-cron"
    assert env["ELECTOR_REDIS_URL"] == VALUES["leader"]["redis"]["url"]
    assert env["ELECTOR_REDIS_PASSWORD_FILE"] == "/etc/elector/redis/password"
    assert env["ELECTOR_HTTP_ADDRESS"] == "0.0.0.0:9090"
    assert "ELECTOR_PRIORITY" not in env
    assert env_of(containers(preferred)["elector"])["ELECTOR_PRIORITY"] == "10"  # the include's overrides
    # the application's env follows the sidecar's port (problem 9b), and reads the same leader file
    assert env_of(app) == {
        "ELECTOR_LEADER_URL": "http://127.0.0.1:9090/leader",
        "ELECTOR_LEADER_FILE": "/var/run/elector/leader.json",
    }
    assert sidecar["ports"] == [{"name": "elector-http", "containerPort": 9090, "protocol": "TCP"}]
    assert app["volumeMounts"] == [
        {"name": "elector-leader", "mountPath": "/var/run/elector", "readOnly": True}
    ]
    pod = billing["spec"]["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["elector-redis-password", "elector-leader"]
    assert pod["imagePullSecrets"] == [{"name": "ghcr"}]
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert [p["port"] for p in policy["spec"]["egress"][1]["ports"]] == [6379, 26379, 26380]


@pytest.mark.parametrize("alias", ["leader", "elector", None], ids=["leader", "elector", "no-alias"])
def test_no_values_at_all_render_the_defaults_under_any_alias(
    tmp_path: Path, library_dir: Path, render_chart: RenderChart, alias: str | None
) -> None:
    """Today's chart failed here: `nil pointer evaluating interface {}.gateOnLeadership`."""
    parent = build_parent(tmp_path, library_dir, alias=alias)
    (parent / "values.yaml").write_text("leader: {}\n")
    docs = render_chart(Chart.load(parent), {}, name="shop")
    sidecar = containers(deployments(docs)["billing"])["elector"]
    env = env_of(sidecar)
    assert env["ELECTOR_LOCK"] == "apps/shop-billing"  # "<namespace>/<release>-<chart name>" of the parent
    assert env["ELECTOR_REDIS_URL"] == "redis://redis:6379/0"
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "elector-http"}
    assert "volumes" not in deployments(docs)["billing"]["spec"]["template"]["spec"]
    for doc in docs:
        kubernetes_validate.validate(doc, NEWEST_KUBE, strict=True)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"leader": {"redis": {"url": "redis://:hunter2@redis.data:6379/0"}}}, "redis.existingSecret"),
        ({"leader": {"sidecar": {"port": 9090}}}, "unknown value sidecar"),
        ({"leader": {"redis": {"tls": {"ca": "x"}}}}, "unknown value redis.tls.ca"),
        ({"leader": {"bindAddress": "127.0.0.1"}}, "bindAddress must be 0.0.0.0 or ::"),
        ({"leader": {"ttl": "ten"}}, "ttl must be a duration"),
        ({"leader": {"extraEnv": [{"name": "ELECTOR_HTTP_ADDRESS", "value": ":1"}]}}, "ELECTOR_HTTP_ADDRESS"),
        (
            {"leader": {"redis": {"url": "redis+sentinel://billing@s1/m"}}},
            None,
        ),  # a user name alone is fine too
    ],
    ids=["password", "unknown-key", "unknown-nested-key", "bind-address", "ttl", "http-address", "sentinel"],
)
def test_the_library_checks_what_no_parent_schema_checks(
    tmp_path: Path, library_dir: Path, render_chart: RenderChart, values: dict[str, Any], message: str | None
) -> None:
    chart = Chart.load(build_parent(tmp_path, library_dir))
    if message is None:
        assert render_chart(chart, values, name="billing")
        return
    with pytest.raises(HelmRenderError, match=re.escape(message)) as error:
        render_chart(chart, values, name="billing")
    assert "hunter2" not in str(error.value)


def test_a_sentinel_policy_needs_the_masters_ports(
    tmp_path: Path, library_dir: Path, render_chart: RenderChart
) -> None:
    parent = build_parent(tmp_path, library_dir)
    template = parent / "templates" / "networkpolicy.yaml"
    template.write_text(template.read_text().replace(' "sentinelMasterPorts" (list 6379)', ""))
    assert "sentinelMasterPorts" not in template.read_text()
    with pytest.raises(HelmRenderError, match="list it in sentinelMasterPorts"):
        render_chart(Chart.load(parent), {}, name="billing")


# --- the library itself, and helm/elector on it ----------------------------------------------------------


def test_the_library_is_a_library_without_crds_or_objects(library_dir: Path) -> None:
    meta = yaml.safe_load((library_dir / "Chart.yaml").read_text())
    assert meta["type"] == "library" and meta["name"] == "elector-sidecar"
    assert not (library_dir / "crds").exists()
    assert all(p.name.startswith("_") and p.suffix == ".tpl" for p in (library_dir / "templates").iterdir())
    defined = {
        name
        for path in (library_dir / "templates").glob("*.tpl")
        for name in re.findall(r'define "([^"]+)"', path.read_text())
    }
    assert {
        "elector-sidecar.container",
        "elector-sidecar.volumes",
        "elector-sidecar.appEnv",
        "elector-sidecar.leaderFileMount",
        "elector-sidecar.env",
        "elector-sidecar.readinessProbe",
        "elector-sidecar.livenessProbe",
        "elector-sidecar.imagePullSecrets",
        "elector-sidecar.redisEgressPorts",
        "elector-sidecar.values",
    } <= defined
    assert all(name.startswith("elector-sidecar.") for name in defined)  # no clash with a parent's names
    result = lint(library_dir, {}, strict=True, kube_version=f"v{NEWEST_KUBE}")
    assert result["errors"] == [] and all(m["severity"] < 2 for m in result["messages"]), result


def library_defaults(library_dir: Path) -> dict[str, Any]:
    text = (library_dir / "templates" / "_defaults.tpl").read_text()
    body = text.split('{{- define "elector-sidecar.defaults" -}}\n', 1)[1].split("{{- end }}", 1)[0]
    defaults: dict[str, Any] = yaml.safe_load(body)
    return defaults


def test_the_example_chart_documents_the_librarys_defaults(library_dir: Path, chart_dir: Path) -> None:
    """helm/elector's `elector:` block repeats every default of the library (documented in values.yaml)."""
    values = yaml.safe_load((chart_dir / "values.yaml").read_text())
    assert values["elector"] == library_defaults(library_dir)


def test_one_app_version(library_dir: Path, chart_dir: Path) -> None:
    library = yaml.safe_load((library_dir / "Chart.yaml").read_text())
    example = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    template = (library_dir / "templates" / "_defaults.tpl").read_text()
    pinned = re.search(r'define "elector-sidecar.appVersion" -}}\n(\S+)\n', template)
    assert pinned is not None
    assert library["appVersion"] == example["appVersion"] == pinned.group(1)


def test_the_example_chart_uses_the_library_like_any_user(chart_dir: Path, library_dir: Path) -> None:
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    (dependency,) = meta["dependencies"]
    assert dependency["name"] == "elector-sidecar" and dependency["repository"] == "file://../elector-sidecar"
    assert dependency["version"] == yaml.safe_load((library_dir / "Chart.yaml").read_text())["version"]
    templates = "".join(p.read_text() for p in (chart_dir / "templates").rglob("*") if p.is_file())
    assert 'define "elector-sidecar.' not in templates and "ELECTOR_REDIS_URL" not in templates
    deployment = (chart_dir / "templates" / "deployment.yaml").read_text()
    assert 'include "elector-sidecar.container" $sidecar' in deployment
    # the `elector:` values, with the securityContext fields Helm deleted for a null passed as nulls
    assert '$sidecar := dict "values" (include "elector.sidecarInput" $ | fromYaml) "context" $' in deployment


def test_the_docstring_usage_is_the_one_tested(library_dir: Path) -> None:
    usage = (library_dir / "templates" / "_pod.tpl").read_text()
    for name in ("imagePullSecrets", "appEnv", "leaderFileMount", "container", "volumes"):
        assert f'include "elector-sidecar.{name}" {SIDECAR}' in textwrap.dedent(usage)
