"""What the sidecar may not do to the pod it joins, and the conventions platform teams expect of the three
charts (issue 23): readiness that never couples the app to Redis, locks scoped by namespace, an `enabled`
switch, a sidecar port that is not 8080 and never clashes, security-context fields a null removes.

Rendered by the real Helm engine: helm/elector (conftest's `render`), the library in a parent chart under
an alias (test_parent_chart's `build_parent`), and helm/elector-operator. The real-daemon half of the
readiness promise is in test_chart_contract.py (a Redis outage of 3 ttl, the leader Service on a pair).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from helm_python.chart import Chart
from helm_python.errors import HelmRenderError

from tests.helm.operator_support import is_hook, render_operator
from tests.helm.test_parent_chart import build_parent, containers, deployments, env_of

Render = Callable[..., list[dict[str, Any]]]
RenderChart = Callable[..., list[dict[str, Any]]]
NEWEST_KUBE = kubernetes_validate.utils.latest_version()


def pod_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]


def sidecar_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(c for c in pod_of(docs)["containers"] if c["name"] == "elector")


# --- 1. readiness never couples the app to Redis ---------------------------------------------------


def test_default_readiness_is_the_daemon_not_redis(render: Render) -> None:
    """/readyz fails about one ttl into a Redis outage, and a pod is ready only when all its containers
    are: the default must be /healthz (the daemon serves, its election loop runs)."""
    probe = sidecar_of(render({}))["readinessProbe"]
    assert probe["httpGet"] == {"path": "/healthz", "port": "elector-http"}


@pytest.mark.parametrize(
    ("elector", "path"),
    [
        ({"gateOnRedis": True}, "/readyz"),
        ({"gateOnLeadership": True}, "/leader"),
    ],
)
def test_coupling_readiness_is_an_explicit_choice(render: Render, elector: dict[str, Any], path: str) -> None:
    values = {"elector": elector, "podDisruptionBudget": {"enabled": False}}
    assert sidecar_of(render(values))["readinessProbe"]["httpGet"]["path"] == path


def test_both_gates_at_once_are_refused(render: Render) -> None:
    values = {
        "elector": {"gateOnRedis": True, "gateOnLeadership": True},
        "podDisruptionBudget": {"enabled": False},
    }
    with pytest.raises(HelmRenderError, match="gateOnLeadership and gateOnRedis are both true"):
        render(values)


def test_the_readiness_probe_can_be_turned_off(render: Render) -> None:
    assert "readinessProbe" not in sidecar_of(render({"elector": {"readinessProbe": {"enabled": False}}}))


def test_the_cost_is_written_beside_each_gate(chart_dir: Path, library_dir: Path) -> None:
    for text in (
        (chart_dir / "values.yaml").read_text(),
        (library_dir / "templates" / "_defaults.tpl").read_text(),
    ):
        for gate in ("gateOnRedis", "gateOnLeadership"):
            comment = text[: text.index(f"{gate}: false")].rsplit(":", 1)[0][-900:]
            assert "COST" in comment, gate


@pytest.mark.parametrize(
    ("elector", "shown"),
    [({}, "GET /healthz"), ({"gateOnRedis": True}, "EVERY replica leaves its Services")],
)
def test_notes_say_what_readiness_means(
    chart: Chart, render_notes: Callable[..., str], elector: dict[str, Any], shown: str
) -> None:
    notes = render_notes(chart, {"elector": elector})
    assert shown in notes
    assert "described above" not in notes


# --- 2. locks scoped by namespace -----------------------------------------------------------------


def test_the_default_lock_differs_between_namespaces(chart: Chart, render_chart: RenderChart) -> None:
    locks = {
        namespace: env_of(sidecar_of(render_chart(chart, {}, name="shop", namespace=namespace)))[
            "ELECTOR_LOCK"
        ]
        for namespace in ("shop-staging", "shop-prod")
    }
    assert locks == {"shop-staging": "shop-staging/shop-elector", "shop-prod": "shop-prod/shop-elector"}


def test_the_longest_default_lock_is_a_lock_name_the_daemon_takes(
    chart: Chart, render_chart: RenderChart
) -> None:
    from elector.lease import check_lock_name

    namespace, fullname = "n" * 63, "f" * 63  # a namespace and a full name are DNS labels: 63 at most
    values = {"leaderElection": {"enabled": True}, "fullnameOverride": fullname}
    docs = render_chart(chart, values, namespace=namespace)
    lock = env_of(sidecar_of(docs))["ELECTOR_LOCK"]
    assert lock == f"{namespace}/{fullname}" and len(lock) == 127
    assert check_lock_name(lock) == lock
    (election,) = [d for d in docs if d["kind"] == "LeaderElection"]
    assert election["spec"]["lock"] == lock  # the operator watches the sidecars' own lock


def test_a_named_lock_is_shared_on_purpose_and_may_be_a_template(
    chart: Chart, render_chart: RenderChart
) -> None:
    for namespace in ("shop-staging", "shop-prod"):
        docs = render_chart(chart, {"elector": {"lock": "orders"}}, namespace=namespace)
        assert env_of(sidecar_of(docs))["ELECTOR_LOCK"] == "orders"
    docs = render_chart(
        chart, {"elector": {"lock": "{{ .Release.Namespace }}-orders"}}, namespace="shop-prod"
    )
    assert env_of(sidecar_of(docs))["ELECTOR_LOCK"] == "shop-prod-orders"


@pytest.mark.parametrize("lock", ["{{ if false }}x{{ end }}", "   ", "{{ .Values.nothing }}"])
def test_a_lock_empty_after_templating_is_refused(render: Render, lock: str) -> None:
    with pytest.raises(HelmRenderError, match="lock is empty after templating"):
        render({"elector": {"lock": lock}})


def test_a_lock_the_daemon_refuses_is_refused_at_render_time(render: Render) -> None:
    with pytest.raises(HelmRenderError, match="is not a lock name"):
        render({"elector": {"lock": "-orders"}})


def test_notes_print_the_lock(chart: Chart, render_notes: Callable[..., str]) -> None:
    assert "Lock: apps/demo-elector" in render_notes(chart, {})


def test_the_library_scopes_a_parent_charts_lock_too(
    tmp_path: Path, library_dir: Path, render_chart: RenderChart
) -> None:
    parent = Chart.load(build_parent(tmp_path, library_dir))
    docs = render_chart(parent, {"leader": {"lock": ""}}, name="shop", namespace="shop-prod")
    assert (
        env_of(containers(deployments(docs)["billing"])["elector"])["ELECTOR_LOCK"]
        == "shop-prod/shop-billing"
    )


# --- 3. platform conventions ----------------------------------------------------------------------


def test_helm_elector_enabled_false_renders_nothing(render: Render) -> None:
    assert render({"enabled": False, "serviceMonitor": {"enabled": True, "force": True}}) == []


def test_helm_elector_operator_enabled_false_renders_nothing() -> None:
    assert render_operator({"enabled": False}) == []


def test_the_library_takes_the_usual_enabled_switch(
    tmp_path: Path, library_dir: Path, render_chart: RenderChart
) -> None:
    """`--set leader.enabled=false` used to fail with "unknown value enabled"; now the sidecar's templates
    render nothing and the parent's pod is its own again."""
    parent = Chart.load(build_parent(tmp_path, library_dir))
    docs = render_chart(parent, {"leader": {"enabled": False}}, name="billing")
    for deployment in deployments(docs).values():
        pod = deployment["spec"]["template"]["spec"]
        assert [c["name"] for c in pod["containers"]] == ["app"]
        assert "env" not in pod["containers"][0] or not pod["containers"][0]["env"]
        kubernetes_validate.validate(deployment, NEWEST_KUBE, strict=True)


def test_the_sidecar_port_is_not_8080(render: Render, library_dir: Path) -> None:
    (port,) = sidecar_of(render({}))["ports"]
    assert port["name"] == "elector-http" and port["containerPort"] != 8080
    defaults = (library_dir / "templates" / "_defaults.tpl").read_text()
    assert f"\nport: {port['containerPort']}\n" in defaults


@pytest.mark.parametrize(
    "workload",
    [
        {"ports": [{"name": "http", "containerPort": 9809, "protocol": "TCP"}]},
        {"initContainers": [{"name": "proxy", "image": "x", "ports": [{"containerPort": 9809}]}]},
    ],
)
def test_a_port_clash_inside_the_pod_is_a_render_error(render: Render, workload: dict[str, Any]) -> None:
    with pytest.raises(HelmRenderError, match="port 9809 is also a port of another container of the pod"):
        render({"workload": workload})


def test_a_moved_sidecar_port_no_longer_clashes(render: Render) -> None:
    docs = render(
        {"workload": {"ports": [{"name": "http", "containerPort": 9809}]}, "elector": {"port": 9810}}
    )
    assert sidecar_of(docs)["ports"][0]["containerPort"] == 9810


def test_the_compat_port_is_checked_too(render: Render) -> None:
    with pytest.raises(HelmRenderError, match="port 4040 is also a port"):
        render(
            {
                "workload": {"ports": [{"name": "http", "containerPort": 4040}]},
                "elector": {"leaderElectorCompat": {"enabled": True}},
            }
        )


@pytest.mark.parametrize("field", ["runAsUser", "runAsGroup", "seccompProfile", "capabilities"])
def test_a_null_security_context_field_is_left_out(render: Render, field: str) -> None:
    """OpenShift's restricted SCC assigns a UID from the namespace's range: runAsUser must be removable.
    Before, the library put every default field back."""
    context = sidecar_of(render({"elector": {"securityContext": {field: None}}}))["securityContext"]
    assert field not in context
    assert context["runAsNonRoot"] is True and context["allowPrivilegeEscalation"] is False


def test_a_null_security_context_field_is_left_out_in_a_parent_chart(
    tmp_path: Path, library_dir: Path, render_chart: RenderChart
) -> None:
    parent = Chart.load(build_parent(tmp_path, library_dir))
    docs = render_chart(parent, {"leader": {"securityContext": {"runAsUser": None}}}, name="billing")
    context = containers(deployments(docs)["billing"])["elector"]["securityContext"]
    assert "runAsUser" not in context and context["runAsNonRoot"] is True


# --- 3. the operator chart has what the workload chart has ----------------------------------------


def operator_pod(values: dict[str, Any]) -> dict[str, Any]:
    docs = render_operator(values)
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]


def test_operator_rbac_create_false_renders_no_rbac() -> None:
    """The operator's own RBAC goes; the pre-delete hook's (a hook with its own ServiceAccount, only for
    the length of `helm uninstall`) stays: preDeleteHook.enabled false drops it."""
    kinds = {d["kind"] for d in render_operator({"rbac": {"create": False}}) if not is_hook(d)}
    assert not kinds & {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    assert {"Role", "RoleBinding"} <= {d["kind"] for d in render_operator({})}


@pytest.mark.parametrize(
    ("image", "global_registry", "expected"),
    [
        ({}, "", "ghcr.io/elector-dev/elector:0.2.0"),
        ({"registry": "mirror.example.com"}, "", "mirror.example.com/elector-dev/elector:0.2.0"),
        ({}, "proxy.example.com", "proxy.example.com/elector-dev/elector:0.2.0"),
        # chart 0.1.0's repository named its registry: it still pulls from there
        ({"repository": "ghcr.io/elector-dev/elector"}, "", "ghcr.io/elector-dev/elector:0.2.0"),
        (
            {"repository": "ghcr.io/elector-dev/elector"},
            "proxy.example.com",
            "proxy.example.com/elector-dev/elector:0.2.0",
        ),
    ],
)
def test_operator_image_registry(image: dict[str, Any], global_registry: str, expected: str) -> None:
    values = {"image": image, "global": {"imageRegistry": global_registry}}
    assert operator_pod(values)["containers"][0]["image"] == expected


def test_operator_pull_secrets_take_plain_strings_like_helm_elector() -> None:
    values = {"imagePullSecrets": ["ghcr", {"name": "mirror"}], "global": {"imagePullSecrets": ["ghcr"]}}
    assert operator_pod(values)["imagePullSecrets"] == [{"name": "ghcr"}, {"name": "mirror"}]


def test_operator_probes_are_configurable() -> None:
    values = {
        "livenessProbe": {"periodSeconds": 30, "failureThreshold": 5},
        "readinessProbe": {"timeoutSeconds": 4},
    }
    (container,) = operator_pod(values)["containers"]
    assert (
        container["livenessProbe"]["periodSeconds"] == 30
        and container["livenessProbe"]["failureThreshold"] == 5
    )
    assert container["readinessProbe"]["timeoutSeconds"] == 4
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}


@pytest.mark.parametrize("chart_name", ["elector", "elector-operator", "elector-sidecar"])
def test_every_chart_has_the_metadata_platforms_expect(chart_name: str) -> None:
    import yaml

    helm_dir = Path(__file__).resolve().parents[2] / "helm"
    chart_dir = helm_dir / chart_name
    assert (chart_dir / ".helmignore").is_file()
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    assert meta["home"].startswith("https://")
    assert meta["icon"].endswith("/helm/icon.svg") and (helm_dir / "icon.svg").is_file()
    assert meta["maintainers"] and all(m["name"] for m in meta["maintainers"])
    annotations = meta["annotations"]
    assert annotations["artifacthub.io/license"] == "MIT"
    changes = yaml.safe_load(annotations["artifacthub.io/changes"])
    assert changes and all(
        c["kind"] in {"added", "changed", "deprecated", "removed", "fixed", "security"} for c in changes
    )
    images = yaml.safe_load(annotations["artifacthub.io/images"])
    assert {"name": "elector", "image": f"ghcr.io/elector-dev/elector:{meta['appVersion']}"} in images


def test_the_helm_test_hook_is_a_test_pod_no_workload_object_selects(render: Render) -> None:
    docs = render({})
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    labels = pod["metadata"]["labels"]
    for doc in docs:
        selector = (doc.get("spec") or {}).get("selector") or {}
        selector = selector.get("matchLabels", selector) if isinstance(selector, dict) else {}
        if doc is not pod and selector:
            assert not selector.items() <= labels.items(), (
                f"{doc['kind']} {doc['metadata']['name']} selects the test Pod"
            )
    kubernetes_validate.validate(pod, NEWEST_KUBE, strict=True)
    assert render({"helmTest": {"enabled": False}}) == [d for d in docs if d is not pod]


# --- 9. a drop-in for the retired leader-elector sidecar (the chart side) -------------------------


def test_the_leader_elector_listener_is_off_by_default(render: Render) -> None:
    sidecar = sidecar_of(render({}))
    assert "ELECTOR_COMPAT_HTTP_ADDRESS" not in env_of(sidecar)
    assert [p["name"] for p in sidecar["ports"]] == ["elector-http"]


@pytest.mark.parametrize(
    ("elector", "address"),
    [
        ({"leaderElectorCompat": {"enabled": True}}, "0.0.0.0:4040"),
        ({"leaderElectorCompat": {"enabled": True, "port": 4041}, "bindAddress": "::"}, "[::]:4041"),
    ],
)
def test_the_leader_elector_listener_renders_its_address_and_port(
    render: Render, elector: dict[str, Any], address: str
) -> None:
    sidecar = sidecar_of(render({"elector": elector}))
    assert env_of(sidecar)["ELECTOR_COMPAT_HTTP_ADDRESS"] == address
    port = int(address.rsplit(":", 1)[1])
    assert {"name": "elector-compat", "containerPort": port, "protocol": "TCP"} in sidecar["ports"]
    for version in ("1.27.0", NEWEST_KUBE):
        kubernetes_validate.validate(
            next(d for d in render({"elector": elector}) if d["kind"] == "Deployment"), version, strict=True
        )


def test_the_leader_elector_listener_in_a_parent_chart(
    tmp_path: Path, library_dir: Path, render_chart: RenderChart
) -> None:
    parent = Chart.load(build_parent(tmp_path, library_dir))
    values = {"leader": {"leaderElectorCompat": {"enabled": True}}}
    sidecar = containers(deployments(render_chart(parent, values, name="billing"))["billing"])["elector"]
    assert env_of(sidecar)["ELECTOR_COMPAT_HTTP_ADDRESS"] == "0.0.0.0:4040"


def test_the_leader_elector_port_must_differ_from_the_sidecars(render: Render) -> None:
    with pytest.raises(HelmRenderError, match=r"leaderElectorCompat\.port and port are both 4040"):
        render({"elector": {"port": 4040, "leaderElectorCompat": {"enabled": True}}})


def test_the_docs_map_leader_electors_flags() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "helm.md").read_text()
    section = text[text.index("## Coming from leader-elector") :]
    section = section[: section.index("\n## ", 5)]
    for flag in ("--election=", "--election-namespace=", "--http=", "--ttl="):
        assert f"`{flag}" in section, flag
    assert '{"name":"<leader>"}' in section and "leaderElectorCompat" in section
