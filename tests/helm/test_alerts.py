"""The Prometheus alerting rules in helm/elector/files: checked and unit-tested by the real promtool.

`promtool check rules` validates the rules file; `promtool test rules` runs alerts.test.yaml, which
holds a firing and a silent case for every alert, and cases where both monitors scrape every pod.
Mutation tests prove those cases have teeth: an alert that never fires, one whose `for:`/threshold
is loosened, or one that sums raw series (a doubled scrape counted twice) must make them fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.promql_per_pod import per_pod_problems, without_per_pod

FILES = Path(__file__).resolve().parents[2] / "helm" / "elector" / "files"
RULES = FILES / "alerts.rules.yaml"
UNIT_TESTS = FILES / "alerts.test.yaml"
ALERTS = {
    "ElectorNoLeader",
    "ElectorMultipleLeaders",
    "ElectorNoReplicas",
    "ElectorRenewalsFailing",
    "ElectorLeadershipFlapping",
    "ElectorRedisUnreachable",
    "ElectorReleaseWithheld",
    "ElectorFencingTokenRegressed",
}
#: Alerts about the election of a lock, judged over all its replicas in every namespace (a lock
#: shared across namespaces is one lock), raised in each namespace that runs replicas of it.
LOCK_WIDE = {"ElectorNoLeader", "ElectorMultipleLeaders", "ElectorNoReplicas", "ElectorLeadershipFlapping"}
#: Alerts that page on a single event: there is no `for:` or threshold to loosen.
ON_ANY_EVENT = {"ElectorReleaseWithheld", "ElectorFencingTokenRegressed"}


def run_promtool(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


def load_rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    assert [group["name"] for group in document["groups"]] == ["elector"]
    rules: list[dict[str, Any]] = document["groups"][0]["rules"]
    return rules


def test_promtool_check_rules_passes(promtool: str) -> None:
    result = run_promtool(promtool, "check", "rules", RULES.name, cwd=FILES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout + result.stderr


def test_promtool_unit_tests_pass(promtool: str) -> None:
    result = run_promtool(promtool, "test", "rules", UNIT_TESTS.name, cwd=FILES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_the_group_holds_exactly_the_alerts_with_severity_and_annotations() -> None:
    rules = load_rules()
    assert sorted(rule["alert"] for rule in rules) == sorted(ALERTS)
    for rule in rules:
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        for text in rule["annotations"].values():
            assert "{{ $labels.lock }}" in text, rule["alert"]
            # Issue 42: the default lock holds its namespace already ("shop/jobs"), so
            # "<namespace>/<lock>" read "shop/shop/jobs".
            assert not re.search(r"namespace \}\}\s*/\s*\{\{ \$labels\.lock", text), rule["alert"]
        assert "{{ $labels.namespace }}" in rule["annotations"]["description"], rule["alert"]
    severities = {rule["alert"]: rule["labels"]["severity"] for rule in rules}
    assert severities["ElectorNoLeader"] == severities["ElectorMultipleLeaders"] == "critical"
    assert severities["ElectorFencingTokenRegressed"] == "critical"


def test_every_alert_aggregates_to_namespace_and_lock() -> None:
    """Alerts carry (namespace, lock) and no scrape-specific labels such as instance. The alerts about
    a lock's election judge it `by (lock)` across namespaces and raise it per namespace (`on (lock)
    group_right`); the others group by (namespace, lock). (`result` and `reason` only in a per-pod
    step, which sums them away.)"""
    for rule in load_rules():
        groupings = [
            {label.strip() for label in grouping.split(",")}
            for grouping in re.findall(r"\bby\s*\(([^)]*)\)", rule["expr"])
        ]
        assert groupings, f"{rule['alert']} does not aggregate"
        for labels in groupings:
            assert "lock" in labels, (rule["alert"], labels)
            assert labels <= {"namespace", "lock", "pod", "result", "reason"}, (rule["alert"], labels)
        judgements = [
            {label.strip() for label in grouping.split(",")}
            for grouping in re.findall(r"\b(?:sum|count)\s+by\s*\(([^)]*)\)", rule["expr"])
        ]
        if rule["alert"] in LOCK_WIDE:
            assert all(labels == {"lock"} for labels in judgements), (rule["alert"], judgements)
            assert re.search(r"\bon \(lock\)", rule["expr"]), rule["alert"]
            if judgements:
                assert re.search(r"on \(lock\) group_right \(\)", rule["expr"]), rule["alert"]
        else:
            assert all({"namespace", "lock"} <= labels for labels in judgements), rule["alert"]


def test_every_alert_counts_each_pod_once() -> None:
    """Issue 17, problem 6: a ServiceMonitor and a PodMonitor together scrape every pod twice.

    Every sum or count across pods goes over `max by (namespace, lock, pod, ...)`, one value per pod,
    so the second copy of a pod's series changes nothing.
    """
    for rule in load_rules():
        assert per_pod_problems(rule["expr"]) == [], rule["alert"]
        if re.search(r"\b(sum|count)\b", rule["expr"]) or rule["alert"] == "ElectorRedisUnreachable":
            assert re.search(r"\b(max|min) by \([^)]*\bpod\b", rule["expr"]), rule["alert"]


def test_the_unit_tests_feed_a_doubled_scrape() -> None:
    """alerts.test.yaml holds cases where each pod's series come from two jobs (both monitors)."""
    document = yaml.safe_load(UNIT_TESTS.read_text())
    doubled: set[str] = set()
    for case in document["tests"]:
        seen: dict[tuple[str, ...], set[str]] = {}
        for series in case["input_series"]:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', series["series"]))
            name = series["series"].split("{", 1)[0]
            key = (name, *sorted(f"{k}={v}" for k, v in labels.items() if k not in {"job", "service"}))
            seen.setdefault(key, set()).add(labels["job"])
        if any(len(jobs) == 2 for jobs in seen.values()):
            assert all(len(jobs) == 2 for jobs in seen.values()), case
            doubled |= {check["alertname"] for check in case["alert_rule_test"]}
    assert doubled == ALERTS - {"ElectorRedisUnreachable"}  # already per pod, one series per pod


@pytest.mark.parametrize(
    "alert",
    # A second copy cannot change `== 0` or `> 0` (the other alerts): for those, the shape test holds.
    ["ElectorMultipleLeaders", "ElectorLeadershipFlapping", "ElectorRenewalsFailing"],
)
def test_the_unit_tests_catch_an_alert_that_counts_a_pod_twice(
    promtool: str, tmp_path: Path, alert: str
) -> None:
    """Without the per-pod step (today's naive sum), the doubled-scrape cases fail."""
    rules = [dict(rule) for rule in load_rules()]
    rule = next(rule for rule in rules if rule["alert"] == alert)
    naive = without_per_pod(rule["expr"])
    assert naive != rule["expr"] and per_pod_problems(naive)
    rule["expr"] = naive
    (tmp_path / RULES.name).write_text(yaml.safe_dump({"groups": [{"name": "elector", "rules": rules}]}))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    assert run_promtool(promtool, "check", "rules", RULES.name, cwd=tmp_path).returncode == 0
    result = run_promtool(promtool, "test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0, f"the unit tests still pass with {alert} summing raw series"
    assert f"alertname: {alert}," in result.stdout + result.stderr


def test_the_for_durations_tolerate_normal_handoffs_and_blips() -> None:
    durations = {rule["alert"]: rule.get("for") for rule in load_rules()}
    assert durations == {
        "ElectorNoLeader": "1m",
        "ElectorMultipleLeaders": "1m",
        "ElectorNoReplicas": "5m",  # a Recreate rollout has no replica for a while
        "ElectorRenewalsFailing": "10m",
        "ElectorLeadershipFlapping": None,  # its 15m window is the smoothing
        "ElectorRedisUnreachable": "2m",
        "ElectorReleaseWithheld": None,  # one event is worth a look
        "ElectorFencingTokenRegressed": None,
    }


def test_the_unit_tests_hold_a_firing_and_a_silent_case_for_every_alert() -> None:
    document = yaml.safe_load(UNIT_TESTS.read_text())
    assert document["rule_files"] == [RULES.name]
    fires: set[str] = set()
    silent: set[str] = set()
    for case in document["tests"]:
        for check in case["alert_rule_test"]:
            alerts = check.get("exp_alerts") or []
            (fires if alerts else silent).add(check["alertname"])
            for alert in alerts:
                assert {"severity", "namespace", "lock"} <= set(alert["exp_labels"]), check
                assert set(alert["exp_annotations"]) == {"summary", "description"}, check
    assert fires == ALERTS
    assert silent == ALERTS


def _mutated(rules: list[dict[str, Any]], alert: str, change: str) -> list[dict[str, Any]]:
    out = [dict(rule) for rule in rules]
    rule = next(rule for rule in out if rule["alert"] == alert)
    if change == "never fires":
        rule["expr"] = "vector(0) > 1"
    elif "for" in rule:  # "loosened": a blip or a handoff would now page
        rule["for"] = "0s"
    else:
        rule["expr"] = rule["expr"].replace("> 2.5", "> 1.5")
    return out


@pytest.mark.parametrize(
    ("alert", "change"),
    [(alert, "never fires") for alert in sorted(ALERTS)]
    + [(alert, "loosened") for alert in sorted(ALERTS - ON_ANY_EVENT)],
)
def test_the_unit_tests_catch_a_broken_alert(promtool: str, tmp_path: Path, alert: str, change: str) -> None:
    """Each alert's unit tests fail when it never fires and when its `for:` or threshold is loosened."""
    rules = load_rules()
    mutant = _mutated(rules, alert, change)
    assert mutant != rules
    (tmp_path / RULES.name).write_text(yaml.safe_dump({"groups": [{"name": "elector", "rules": mutant}]}))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    assert run_promtool(promtool, "check", "rules", RULES.name, cwd=tmp_path).returncode == 0
    result = run_promtool(promtool, "test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode != 0, f"the unit tests still pass with {alert} {change}"
    assert f"alertname: {alert}," in result.stdout + result.stderr
