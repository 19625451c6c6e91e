"""The operator's own observability (helm/elector-operator): a metrics Service over its replicas, a
ServiceMonitor and a PrometheusRule rendered only when the cluster serves monitoring.coreos.com/v1 (or when
forced), and alerts that promtool accepts and fires: the operator down, reconcile errors, a lagging Lease
mirror."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.operator_support import KUBE_VERSIONS, of_kind, one, render_operator, validate_kubernetes

MONITORING = ["monitoring.coreos.com/v1"]
ENABLED = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}


def test_the_metrics_service_reaches_every_replicas_http_port() -> None:
    docs = render_operator({})
    service = one(docs, "Service")
    pod = one(docs, "Deployment")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]
    for version in KUBE_VERSIONS:
        validate_kubernetes(service, [version])


@pytest.mark.parametrize(
    ("values", "api_versions", "rendered"),
    [
        (ENABLED, MONITORING, True),
        (ENABLED, [], False),  # the cluster has no Prometheus operator: nothing it would refuse
        ({key: {"enabled": True, "force": True} for key in ENABLED}, [], True),
        ({}, MONITORING, False),
    ],
)
def test_monitors_render_only_where_the_cluster_serves_them(
    values: dict[str, Any], api_versions: list[str], rendered: bool
) -> None:
    docs = render_operator(values, api_versions=api_versions)
    assert bool(of_kind(docs, "ServiceMonitor")) is rendered
    assert bool(of_kind(docs, "PrometheusRule")) is rendered


def test_the_service_monitor_keeps_the_leader_elections_namespace_label() -> None:
    """elector_lock_holder_info{namespace} names the LeaderElection's namespace; without honorLabels
    Prometheus renamed it exported_namespace and put the operator's own namespace in its place."""
    (endpoint,) = one(render_operator(ENABLED, api_versions=MONITORING), "ServiceMonitor")["spec"][
        "endpoints"
    ]
    assert endpoint["honorLabels"] is True


def test_the_operator_down_alert_is_tunable() -> None:
    values = {
        **ENABLED,
        "prometheusRule": {"enabled": True, "operatorDownFor": "2m", "operatorDownSeverity": "critical"},
    }
    rule = one(render_operator(values, api_versions=MONITORING), "PrometheusRule")
    (down,) = [r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"] == "ElectorOperatorDown"]
    assert down["for"] == "2m" and down["labels"] == {"severity": "critical"}


def test_the_service_monitor_selects_the_metrics_service() -> None:
    docs = render_operator(ENABLED, api_versions=MONITORING)
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]


UNIT_TESTS = """
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  # ElectorOperatorDown: both replicas up, none leads from minute 10 (the operator's own Redis is gone):
  # leader labels stand still. It fires within 2 minutes (it waited 5 before, on `up` alone: never here).
  - interval: 1m
    input_series:
      - series: 'up{job="demo-elector-operator-metrics", namespace="apps", pod="a"}'
        values: '1x30'
      - series: 'up{job="demo-elector-operator-metrics", namespace="apps", pod="b"}'
        values: '1x30'
      - series: 'elector_operator_leader{job="demo-elector-operator-metrics", namespace="apps", pod="a"}'
        values: '1x9 0x20'
      - series: 'elector_operator_leader{job="demo-elector-operator-metrics", namespace="apps", pod="b"}'
        values: '0x30'
    alert_rule_test:
      - {eval_time: 9m, alertname: ElectorOperatorDown, exp_alerts: []}
      - {eval_time: 10m, alertname: ElectorOperatorDown, exp_alerts: []}
      - eval_time: 12m
        alertname: ElectorOperatorDown
        exp_alerts: [{exp_labels: {severity: warning}}]
  # every replica down (scrapes fail: the series go stale): fires within 2 minutes too
  - interval: 1m
    input_series:
      - series: 'up{job="demo-elector-operator-metrics", namespace="apps", pod="a"}'
        values: '1x9 0x20'
      - series: 'elector_operator_leader{job="demo-elector-operator-metrics", namespace="apps", pod="a"}'
        values: '1x9 stale'
    alert_rule_test:
      - {eval_time: 9m, alertname: ElectorOperatorDown, exp_alerts: []}
      - eval_time: 12m
        alertname: ElectorOperatorDown
        exp_alerts: [{exp_labels: {severity: warning}}]
  # a failover (a stops leading, b takes over one scrape later) and a rolling update: no page
  - interval: 30s
    input_series:
      - series: 'elector_operator_leader{job="demo-elector-operator-metrics", namespace="apps", pod="a"}'
        values: '1x10 0 0x10 stale'
      - series: 'elector_operator_leader{job="demo-elector-operator-metrics", namespace="apps", pod="b"}'
        values: '0x10 0 1x20'
      - series: 'elector_operator_leader{job="demo-elector-operator-metrics", namespace="apps", pod="c"}'
        values: '_x22 0x10'
    alert_rule_test:
      - {eval_time: 5m30s, alertname: ElectorOperatorDown, exp_alerts: []}
      - {eval_time: 6m, alertname: ElectorOperatorDown, exp_alerts: []}
      - {eval_time: 15m, alertname: ElectorOperatorDown, exp_alerts: []}
  - interval: 1m
    input_series:
      - series: 'elector_operator_reconcile_errors_total{job="demo-elector-operator-metrics", namespace="apps", pod="a", reason="redis"}'
        values: '0x10 1+1x40'
      - series: 'elector_operator_reconcile_errors_total{job="demo-elector-operator-metrics", namespace="apps", pod="a", reason="secret"}'
        values: '0x50'
    alert_rule_test:
      - {eval_time: 20m, alertname: ElectorOperatorReconcileErrors, exp_alerts: []}
      - eval_time: 40m
        alertname: ElectorOperatorReconcileErrors
        exp_alerts: [{exp_labels: {severity: warning, namespace: apps, reason: redis}}]
  - interval: 1m
    input_series:
      # held, renewed every minute, then no more from minute 10 on (time() is in seconds)
      - series: 'kube_lease_renew_time{namespace="apps", lease="billing"}'
        values: '0+60x10 600x30'
      - series: 'kube_lease_owner{namespace="apps", lease="billing", owner_kind="LeaderElection", owner_name="billing", lease_holder="billing-0"}'
        values: '1x40'
      # a free lock's Lease is not renewed: no alert
      - series: 'kube_lease_renew_time{namespace="apps", lease="idle"}'
        values: '0x40'
      - series: 'kube_lease_owner{namespace="apps", lease="idle", owner_kind="LeaderElection", owner_name="idle", lease_holder=""}'
        values: '1x40'
      # somebody else's Lease: no alert
      - series: 'kube_lease_renew_time{namespace="kube-system", lease="kube-scheduler"}'
        values: '0x40'
      - series: 'kube_lease_owner{namespace="kube-system", lease="kube-scheduler", owner_kind="", owner_name="", lease_holder="node-1"}'
        values: '1x40'
    alert_rule_test:
      - {eval_time: 10m, alertname: ElectorOperatorLeaseMirrorLagging, exp_alerts: []}
      - eval_time: 25m
        alertname: ElectorOperatorLeaseMirrorLagging
        exp_alerts: [{exp_labels: {severity: warning, namespace: apps, lease: billing}}]
"""  # noqa: E501 (one series a line, as promtool reads them)


def test_promtool_accepts_and_fires_the_operator_alerts(promtool: str, tmp_path: Path) -> None:
    docs = render_operator({**ENABLED}, api_versions=MONITORING)
    rule = one(docs, "PrometheusRule")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    checked = subprocess.run(
        [promtool, "check", "rules", str(tmp_path / "rules.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the unit tests compare labels; annotations (checked above) are left out of their copy
    bare = [
        {**group, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in group["rules"]]}
        for group in rule["spec"]["groups"]
    ]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": bare}))
    (tmp_path / "tests.yaml").write_text(textwrap.dedent(UNIT_TESTS))
    tested = subprocess.run(
        [promtool, "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    names = [r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]]
    assert names == [
        "ElectorOperatorDown",
        "ElectorOperatorReconcileErrors",
        "ElectorOperatorLeaseMirrorLagging",
    ]
