"""The walk-through of docs/helm.md, from the page itself (issue 17, problem 9).

Every code block preceded by `<!-- example-file: PATH -->` is a file of the example: the team's chart
`billing` (Chart.yaml, values.yaml, templates), the monitoring values, and the app-side loops in
Python and shell. The chart is built in tmp_path with the library in charts/ (what `helm dependency
build` does: scripts/chart_assembly.py, through the page's own `file://` path), rendered with the
conftest's renderer, and every object is validated; the monitoring values must make the elector
chart's PodMonitor select the billing pods' sidecar port; both loops run against a real leader and a
real follower.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import redis
import yaml
from chart_assembly import assemble_chart  # scripts/chart_assembly.py
from helm_python.chart import Chart

from elector.testing.redis_server import RedisServerProcess, free_tcp_port
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.seed import seed_used_lock
from tests.support.tiers import REDIS, needs

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "helm.md"
LIBRARY = ROOT / "helm" / "elector-sidecar"
ELECTOR_CHART = ROOT / "helm" / "elector"
NAMESPACE = "apps"  # what the conftest renders into
OLDEST_KUBE = "1.27.0"
NEWEST_KUBE = kubernetes_validate.utils.latest_version()
RenderChart = Callable[..., list[dict[str, Any]]]


def example_files() -> dict[str, str]:
    text = DOC.read_text()
    found = re.findall(r"<!-- example-file: (\S+) -->\n```[a-z]*\n(.*?)\n```\n", text, flags=re.S)
    files = {path: body + "\n" for path, body in found}
    assert len(files) == len(found), "two blocks name the same file"
    return files


FILES = example_files()


def test_the_page_holds_the_whole_example() -> None:
    assert set(FILES) == {
        "billing/Chart.yaml",
        "billing/values.yaml",
        "billing/templates/deployment.yaml",
        "billing/templates/networkpolicy.yaml",
        "app/leader_loop.py",
        "app/leader-loop.sh",
        "monitoring-values.yaml",
        "cluster-monitoring-values.yaml",
    }
    text = DOC.read_text()
    assert "helm dependency build ./billing" in text
    assert "helm dependency build ../elector/helm/elector" in text


@pytest.fixture(scope="module")
def billing_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The page's chart assembled as `helm dependency build ./billing` would: beside a checkout of
    elector (`../elector`), so the page's own `file://` path must lead to the library."""
    root = tmp_path_factory.mktemp("docs-example")
    for path, text in FILES.items():
        if path.startswith("billing/"):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(text)
    (root / "elector" / "helm").mkdir(parents=True)
    (root / "elector" / "helm" / LIBRARY.name).symlink_to(LIBRARY, target_is_directory=True)
    return assemble_chart(root / "billing", tmp_path_factory.mktemp("built"))


@pytest.fixture(scope="module")
def billing(billing_dir: Path, render_chart: RenderChart) -> list[dict[str, Any]]:
    with Chart.load(billing_dir) as chart:
        return render_chart(chart, {}, name="billing")


def test_the_dependency_is_the_library_under_the_values_alias(billing_dir: Path) -> None:
    chart = yaml.safe_load(FILES["billing/Chart.yaml"])
    (dependency,) = chart["dependencies"]
    library = yaml.safe_load((LIBRARY / "Chart.yaml").read_text())
    assert dependency["name"] == library["name"] == "elector-sidecar"
    assert library["type"] == "library"
    assert dependency["version"] == library["version"]
    assert dependency["repository"].startswith("file://") and dependency["repository"].endswith(
        "/helm/elector-sidecar"
    )
    assert list(yaml.safe_load(FILES["billing/values.yaml"])) == [dependency["alias"]]
    with Chart.load(billing_dir) as loaded:
        assert [d["name"] for d in loaded.dependencies] == ["elector-sidecar"]


@pytest.mark.parametrize("kube_version", [OLDEST_KUBE, NEWEST_KUBE])
def test_the_chart_renders_valid_objects_only_its_own(
    billing: list[dict[str, Any]], kube_version: str
) -> None:
    assert sorted(d["kind"] for d in billing) == [
        "Deployment",
        "NetworkPolicy",
    ]  # no CRD, no example workload
    for doc in billing:
        kubernetes_validate.validate(doc, kube_version, strict=True)


def test_the_chart_renders_the_sidecar_as_the_page_says(billing: list[dict[str, Any]]) -> None:
    (deployment,) = [d for d in billing if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]["spec"]
    containers = {c["name"]: c for c in pod["containers"]}
    assert list(containers) == ["app", "elector"]
    app_env = {e["name"]: e.get("value") for e in containers["app"]["env"]}
    assert app_env == {"ELECTOR_LEADER_URL": "http://127.0.0.1:9809/leader"}
    env = {e["name"]: e.get("value") for e in containers["elector"]["env"]}
    assert env["ELECTOR_LOCK"] == f"{NAMESPACE}/nightly"
    assert env["ELECTOR_REDIS_URL"] == "redis://redis.data:6379/0"
    assert env["ELECTOR_REDIS_PASSWORD_FILE"].startswith("/etc/elector/redis/")
    assert env["ELECTOR_SHUTDOWN_LINGER"] in {"30", "30s"}
    assert {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v} == {"redis-auth"}
    assert [p["name"] for p in containers["elector"]["ports"]] == ["elector-http"]
    assert containers["elector"]["readinessProbe"]["httpGet"]["path"] == "/healthz"
    # Issue 42: no API token in a pod that never calls the API; the replicas spread over nodes.
    assert pod["automountServiceAccountToken"] is False
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    # The grace period the comment explains: preStop sleep + linger + 10 s of drain, at least.
    pre_stop = containers["elector"]["lifecycle"]["preStop"]["exec"]["command"]
    assert pod["terminationGracePeriodSeconds"] >= int(pre_stop[-1]) + 30 + 10
    (policy,) = [d for d in billing if d["kind"] == "NetworkPolicy"]
    egress_ports = [p["port"] for rule in policy["spec"]["egress"] for p in rule["ports"]]
    assert 6379 in egress_ports


def _render_elector(
    tmp_path_factory: pytest.TempPathFactory, render_chart: RenderChart, values: dict[str, Any], **kw: Any
) -> list[dict[str, Any]]:
    values = copy.deepcopy(values)
    for key in ("podMonitor", "prometheusRule"):  # no Prometheus operator behind the renderer
        values.setdefault(key, {})["force"] = True
    chart_dir = assemble_chart(ELECTOR_CHART, tmp_path_factory.mktemp("elector"))
    with Chart.load(chart_dir) as chart:
        return render_chart(chart, values, **kw)


@pytest.fixture(scope="module")
def monitoring(tmp_path_factory: pytest.TempPathFactory, render_chart: RenderChart) -> list[dict[str, Any]]:
    values = yaml.safe_load(FILES["monitoring-values.yaml"])
    return _render_elector(tmp_path_factory, render_chart, values, name="billing-monitoring")


@pytest.fixture(scope="module")
def cluster_monitoring(
    tmp_path_factory: pytest.TempPathFactory, render_chart: RenderChart
) -> list[dict[str, Any]]:
    values = yaml.safe_load(FILES["cluster-monitoring-values.yaml"])
    return _render_elector(tmp_path_factory, render_chart, values, name="elector-monitoring")


def test_the_three_settings_make_the_podmonitor_scrape_the_billing_pods(
    monitoring: list[dict[str, Any]], billing: list[dict[str, Any]]
) -> None:
    kinds = {d["kind"]: d for d in monitoring}
    # Issue 42: every team that followed this step got its own copy of the cluster-wide rules (two
    # pages per alert) and a dashboard of the same uid as every other team's.
    assert sorted(kinds) == ["PodMonitor"]  # workload.enabled: false; no rules, no dashboard
    (deployment,) = [d for d in billing if d["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]
    monitor = kinds["PodMonitor"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}  # the same namespace
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= ports
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_cluster_install_holds_the_rules_and_the_dashboard_once(
    cluster_monitoring: list[dict[str, Any]],
) -> None:
    kinds = {d["kind"]: d for d in cluster_monitoring}
    assert sorted(d["kind"] for d in cluster_monitoring) == ["ConfigMap", "PrometheusRule"]
    assert kinds["PrometheusRule"]["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rules = {r["alert"]: r for g in kinds["PrometheusRule"]["spec"]["groups"] for r in g["rules"]}
    assert rules["ElectorNoLeader"]["for"] == "2m"
    assert all(rule["labels"]["team"] == "platform" for rule in rules.values())
    dashboard = kinds["ConfigMap"]
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["elector.json"])["title"] == "elector: leader election"
    kubernetes_validate.validate(dashboard, NEWEST_KUBE, strict=True)
    kubernetes_validate.validate(dashboard, OLDEST_KUBE, strict=True)


# -- the app-side loops, against real daemons ---------------------------------------------------------


@pytest.fixture(scope="module")
@needs(REDIS)
def daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, DaemonProcess]]:
    log_dir = tmp_path_factory.mktemp("daemons")
    with RedisServerProcess() as server:
        seed_used_lock(redis.Redis(port=server.port), "billing-nightly")
        common = {"redis_url": server.url, "log_dir": log_dir, "lock": "billing-nightly", "ttl": "5s"}
        leader = DaemonProcess(identity="billing-a", **common)
        follower = DaemonProcess(identity="billing-b", **common)
        try:
            leader.start().wait_http()
            wait_until(leader.is_leader, timeout_s=10)
            follower.start().wait_http()
            wait_until(lambda: (follower.leader() or {}).get("holder") == "billing-a", timeout_s=10)
            yield leader, follower
        finally:
            follower.stop()
            leader.stop()


def url(daemon: DaemonProcess) -> str:
    return f"http://127.0.0.1:{daemon.port}/leader"


def token_of(daemon: DaemonProcess) -> int:
    body = daemon.leader()
    assert body is not None and body["is_leader"], body
    token: int = body["fencing_token"]
    return token


def load_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leader_url: str) -> ModuleType:
    path = tmp_path / "leader_loop.py"
    path.write_text(FILES["app/leader_loop.py"])
    monkeypatch.setenv("ELECTOR_LEADER_URL", leader_url)
    spec = importlib.util.spec_from_file_location(f"leader_loop_{abs(hash(leader_url))}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_python_loop_gets_the_token_on_the_leader_only(
    daemons: tuple[DaemonProcess, DaemonProcess],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    leader, follower = daemons
    on_leader = load_loop(tmp_path, monkeypatch, url(leader))
    token = on_leader.fencing_token()
    assert token == token_of(leader)
    on_leader.run_once(token)
    assert capsys.readouterr().out == f"leading with fencing token {token}\n"
    assert load_loop(tmp_path, monkeypatch, url(follower)).fencing_token() is None
    nobody = f"http://127.0.0.1:{free_tcp_port()}/leader"
    assert load_loop(tmp_path, monkeypatch, nobody).fencing_token() is None


def run_shell_loop(tmp_path: Path, leader_url: str) -> str:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: the shell loop of docs/helm.md is not checked")
    script = tmp_path / "leader-loop.sh"
    script.write_text(FILES["app/leader-loop.sh"])
    result = subprocess.run(
        ["timeout", "2.5", "sh", str(script)],
        env={"PATH": "/usr/bin:/bin", "ELECTOR_LEADER_URL": leader_url},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 124, result  # stopped by timeout, not failed
    assert result.stderr == ""
    return result.stdout


def test_the_shell_loop_gets_the_token_on_the_leader_only(
    daemons: tuple[DaemonProcess, DaemonProcess], tmp_path: Path
) -> None:
    leader, follower = daemons
    lines = run_shell_loop(tmp_path, url(leader)).splitlines()
    assert lines and set(lines) == {f"leading with fencing token {token_of(leader)}"}
    assert run_shell_loop(tmp_path, url(follower)) == ""
