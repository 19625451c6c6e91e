"""Monitoring that a platform can share: the alerts' `for:`, severity and labels from values, and one
dashboard uid and title per release (issue 42: two teams that followed docs/helm.md got two
dashboards of one uid, and nothing of the rules could be set from values)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_python.chart import Chart

RULES = Path(__file__).resolve().parents[2] / "helm" / "elector" / "files" / "alerts.rules.yaml"
MONITORING = {
    "workload": {"enabled": False},
    "prometheusRule": {"enabled": True, "force": True},
    "dashboard": {"enabled": True},
}


def _rules(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (rule,) = [d for d in documents if d["kind"] == "PrometheusRule"]
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def _dashboard(documents: list[dict[str, Any]]) -> dict[str, Any]:
    (config_map,) = [d for d in documents if d["kind"] == "ConfigMap"]
    result: dict[str, Any] = json.loads(config_map["data"]["elector.json"])
    return result


def test_untuned_rules_are_the_rules_file(render: Any) -> None:
    expected = yaml.safe_load(RULES.read_text())["groups"]
    (rule,) = [d for d in render(MONITORING) if d["kind"] == "PrometheusRule"]
    assert rule["spec"]["groups"] == expected


def test_for_severity_and_labels_come_from_values(render: Any) -> None:
    values = {
        **MONITORING,
        "prometheusRule": {
            "enabled": True,
            "force": True,
            "ruleLabels": {"team": "platform"},
            "rules": {
                "ElectorNoLeader": {"for": "3m", "severity": "page", "labels": {"runbook": "no-leader"}},
                "ElectorRedisUnreachable": {"for": "0s"},
                "ElectorNoReplicas": {"enabled": False},
            },
        },
    }
    rules = _rules(render(values))
    assert "ElectorNoReplicas" not in rules
    no_leader = rules["ElectorNoLeader"]
    assert no_leader["for"] == "3m"
    assert no_leader["labels"] == {"severity": "page", "team": "platform", "runbook": "no-leader"}
    assert "for more than 3m" in no_leader["annotations"]["description"]
    assert "1 minute" not in no_leader["annotations"]["description"]
    assert "for" not in rules["ElectorRedisUnreachable"]
    assert rules["ElectorMultipleLeaders"]["for"] == "1m"
    assert rules["ElectorMultipleLeaders"]["labels"] == {"severity": "critical", "team": "platform"}


def test_an_unknown_alert_name_fails_the_render(render: Any) -> None:
    values = {
        **MONITORING,
        "prometheusRule": {"enabled": True, "force": True, "rules": {"ElectorNoLeadr": {}}},
    }
    with pytest.raises(Exception, match=r"ElectorNoLeadr is no alert"):
        render(values)


def test_each_release_has_its_own_dashboard_uid_and_title(
    chart: Chart, render_chart: Any, render: Any
) -> None:
    seen = {}
    for name, namespace in (("monitoring", "team-a"), ("monitoring", "team-b"), ("other", "team-a")):
        dashboard = _dashboard(render_chart(chart, MONITORING, name=name, namespace=namespace))
        assert len(dashboard["uid"]) <= 40 and dashboard["uid"].startswith("elector-")
        assert f"({namespace}/{name}-elector)" in dashboard["title"]
        seen[dashboard["uid"]] = dashboard["title"]
    assert len(seen) == 3 and len(set(seen.values())) == 3
    chosen = _dashboard(
        render({**MONITORING, "dashboard": {"enabled": True, "uid": "elector", "title": "x"}})
    )
    assert (chosen["uid"], chosen["title"]) == ("elector", "x")
    # Everything else is the file's dashboard.
    file = json.loads((RULES.parent / "dashboard.json").read_text())
    assert {k: v for k, v in chosen.items() if k != "title"} == {
        k: v for k, v in file.items() if k != "title"
    }
