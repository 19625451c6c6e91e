"""The Grafana dashboard in helm/elector/files/dashboard.json: model, variables, panels, and queries.

Every panel query is also parsed by the real PromQL parser (promtool check rules on a throwaway
rules file holding the queries with the dashboard variables filled in), and evaluated by promtool
over a pod scraped once and a pod scraped twice (a ServiceMonitor and a PodMonitor both on): the
panels must show the same numbers (issue 17, problem 6).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.promql_per_pod import per_pod_problems

DASHBOARD = Path(__file__).resolve().parents[2] / "helm" / "elector" / "files" / "dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
FILTERS = ('namespace=~"$namespace"', 'lock=~"$lock"')


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    model: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return model


@pytest.fixture(scope="module")
def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [panel for panel in dashboard["panels"] if panel["type"] != "row"]


def exprs(panel: dict[str, Any]) -> list[str]:
    return [target["expr"] for target in panel["targets"]]


def panels_querying(panels: list[dict[str, Any]], pattern: str) -> list[dict[str, Any]]:
    return [panel for panel in panels if any(re.search(pattern, expr) for expr in exprs(panel))]


def test_the_model_identifies_itself(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "elector"
    assert dashboard["tags"] == ["elector"]
    assert dashboard["schemaVersion"] >= 38
    assert dashboard["title"]
    assert "id" not in dashboard or dashboard["id"] is None  # importable into any Grafana


def test_the_variables_select_datasource_namespace_and_lock(dashboard: dict[str, Any]) -> None:
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "lock"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    queries = {
        "namespace": "label_values(elector_is_leader, namespace)",
        "lock": 'label_values(elector_is_leader{namespace=~"$namespace"}, lock)',
    }
    for name, query in queries.items():
        variable = variables[name]
        assert variable["type"] == "query"
        assert variable["datasource"] == DATASOURCE
        assert variable["definition"] == query
        assert variable["query"]["query"] == query
        assert variable["multi"] is True
        assert variable["includeAll"] is True
        assert variable["allValue"] == ".*"  # matches with =~ in every panel query


def test_every_panel_uses_the_datasource_variable_and_has_queries(panels: list[dict[str, Any]]) -> None:
    assert panels
    for panel in panels:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
        assert panel.get("description"), panel["title"]


def test_every_selector_filters_by_namespace_and_lock(panels: list[dict[str, Any]]) -> None:
    for panel in panels:
        for expr in exprs(panel):
            names = re.findall(r"\belector_\w+", expr)
            selectors = re.findall(r"\b(elector_\w+)\{([^}]*)\}", expr)
            assert names, (panel["title"], expr)
            assert len(selectors) == len(names), f"a metric without a {{...}} filter in {expr}"
            for name, matchers in selectors:
                for wanted in FILTERS:
                    assert wanted in matchers, (panel["title"], name, matchers)


def test_the_panels_the_issue_asks_for_exist(panels: list[dict[str, Any]]) -> None:
    def types(pattern: str) -> set[str]:
        return {panel["type"] for panel in panels_querying(panels, pattern)}

    # Current holder per lock: the pod that reports elector_is_leader == 1.
    holder = [
        panel
        for panel in panels_querying(panels, r"by \([^)]*\bpod\b[^)]*\) \(elector_is_leader\{[^}]*\}\) == 1")
        if panel["type"] in {"table", "stat"}
    ]
    assert holder
    assert all(target.get("instant") for panel in holder for target in panel["targets"])
    assert "table" in types(r"elector_leader_info\{")
    # Leadership timeline per pod.
    timeline = [
        panel
        for panel in panels_querying(panels, r"by \([^)]*\bpod\b[^)]*\) \(elector_is_leader\{")
        if panel["type"] == "state-timeline"
    ]
    assert timeline
    assert "{{pod}}" in timeline[0]["targets"][0]["legendFormat"]
    assert "timeseries" in types(r"increase\(elector_leader_transitions_total\{")
    assert "timeseries" in types(r"by \([^)]*\breason\b[^)]*\) \(increase\(elector_step_downs_total\{")
    # Renew latency p50 and p99 in one panel.
    latency = panels_querying(panels, r"histogram_quantile\(")
    assert len(latency) == 1
    quantile = re.compile(
        r"histogram_quantile\(([0-9.]+), sum by \([^)]*\ble\b[^)]*\) "
        r"\(max by \([^)]*\bpod\b[^)]*\) \(rate\(elector_renew_duration_seconds_bucket\{"
    )
    quantiles = [quantile.match(e) for e in exprs(latency[0])]
    assert [match.group(1) for match in quantiles if match] == ["0.5", "0.99"]
    assert latency[0]["fieldConfig"]["defaults"]["unit"] == "s"
    assert types(r"elector_lease_remaining_seconds\{") == {"timeseries"}
    assert types(r"elector_fencing_token\{") & {"stat", "timeseries"}
    assert types(r"elector_redis_up\{") & {"state-timeline", "timeseries"}
    errors = panels_querying(panels, r'elector_acquire_attempts_total\{[^}]*result="error"')
    assert errors
    assert any(re.search(r'elector_renewals_total\{[^}]*result=~"error\|lost"', e) for e in exprs(errors[0]))


def test_the_layout_has_unique_ids_and_no_overlapping_panels(dashboard: dict[str, Any]) -> None:
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["refId"]
        refs = [target["refId"] for target in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]


def test_every_query_is_valid_promql(
    dashboard: dict[str, Any], panels: list[dict[str, Any]], tmp_path: Path, promtool: str
) -> None:
    queries = [expr for panel in panels for expr in exprs(panel)]
    queries += [
        re.sub(r"^label_values\((.*), \w+\)$", r"\1", variable["definition"])
        for variable in dashboard["templating"]["list"]
        if variable["type"] == "query"
    ]
    filled = [
        query.replace("$__rate_interval", "1m").replace("$namespace", ".*").replace("$lock", ".*")
        for query in queries
    ]
    assert not [query for query in filled if "$" in query]
    rules = [{"record": f"dashboard:query_{index}", "expr": query} for index, query in enumerate(filled)]
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    result = subprocess.run(
        [promtool, "check", "rules", "queries.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout + result.stderr


def test_every_sum_or_count_goes_over_one_value_per_pod(panels: list[dict[str, Any]]) -> None:
    """Sums and counts across pods reduce to one value per pod first (`max by (..., pod)`), so a pod
    scraped by both monitors counts once; max/min alone are unaffected by a second copy."""
    summing = 0
    for panel in panels:
        for expr in exprs(panel):
            assert per_pod_problems(expr) == [], panel["title"]
            summing += bool(re.search(r"\b(sum|count) by", expr))
    assert summing >= 6  # the check has something to check


def _filled(query: str) -> str:
    return query.replace("$__rate_interval", "2m").replace("$namespace", ".*").replace("$lock", ".*")


#: (metric, extra labels, values per pod app-a, app-b, app-c) at a 30 s scrape interval: a cluster
#: where app-a leads and every counter moves, so every panel has data.
SCRAPED: list[tuple[str, str, tuple[str, str, str]]] = [
    ("elector_is_leader", "", ("1x40", "0x40", "0x40")),
    ("elector_leader_info", ', holder="app-a"', ("1x40", "1x40", "1x40")),
    ("elector_leader_transitions_total", "", ("0+1x40", "0+1x40", "0x40")),
    ("elector_step_downs_total", ', reason="lost"', ("0+1x40", "0+2x40", "0x40")),
    ("elector_step_downs_total", ', reason="shutdown"', ("0x40", "0+1x40", "0+1x40")),
    ("elector_renew_duration_seconds_bucket", ', le="0.005"', ("0+3x40", "0x40", "0x40")),
    ("elector_renew_duration_seconds_bucket", ', le="0.01"', ("0+8x40", "0x40", "0x40")),
    ("elector_renew_duration_seconds_bucket", ', le="+Inf"', ("0+10x40", "0x40", "0x40")),
    ("elector_lease_remaining_seconds", "", ("9x40", "8x40", "8x40")),
    ("elector_fencing_token", "", ("1700000000000x40", "1700000000000x40", "1700000000000x40")),
    ("elector_redis_up", "", ("1x40", "1x40", "0x40")),
    ("elector_acquire_attempts_total", ', result="error"', ("0x40", "0+1x40", "0+2x40")),
    ("elector_renewals_total", ', result="error"', ("0+1x40", "0x40", "0x40")),
    ("elector_renewals_total", ', result="lost"', ("0+2x40", "0x40", "0x40")),
]
#: The two jobs of one pod: the ServiceMonitor's (job = the Service) and the PodMonitor's.
MONITORS = (
    'job="demo-elector-metrics", service="demo-elector-metrics", endpoint="elector-http"',
    'job="apps/demo-elector", endpoint="elector-http"',
)


def test_a_pod_scraped_twice_shows_the_same_numbers(
    panels: list[dict[str, Any]], tmp_path: Path, promtool: str
) -> None:
    """Namespace `single`: each pod scraped by one monitor; namespace `double`: by both. Every panel
    query, recorded by promtool, returns the same series with the same values for both."""
    series = []
    for namespace, jobs in (("single", MONITORS[:1]), ("double", MONITORS)):
        for name, extra, values in SCRAPED:
            for index, (pod, value) in enumerate(zip(("app-a", "app-b", "app-c"), values, strict=True)):
                for job in jobs:
                    labels = (
                        f'{job}, instance="10.0.0.{index + 1}:8080", namespace="{namespace}", '
                        f'pod="{pod}", container="elector", lock="jobs"{extra}'
                    )
                    series.append({"series": f"{name}{{{labels}}}", "values": value})
    titled = [(panel["title"], expr) for panel in panels for expr in exprs(panel)]
    queries = [expr for _, expr in titled]
    rules = [{"record": f"dashboard:query_{i}", "expr": _filled(q)} for i, q in enumerate(queries)]
    checks = []
    for index in range(len(queries)):
        recorded = f"dashboard:query_{index}"
        double, single = f'{recorded}{{namespace="double"}}', f'{recorded}{{namespace="single"}}'
        checks += [
            {  # as many series for either namespace, and at least one
                "expr": f"count({double}) - count({single})",
                "eval_time": "15m",
                "exp_samples": [{"labels": "{}", "value": 0}],
            },
            {  # and no value that differs
                "expr": f"{double} != ignoring(namespace) {single}",
                "eval_time": "15m",
                "exp_samples": [],
            },
        ]
    (tmp_path / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]})
    )
    tests = {
        "rule_files": ["queries.yaml"],
        "evaluation_interval": "30s",
        "tests": [{"interval": "30s", "input_series": series, "promql_expr_test": checks}],
    }
    (tmp_path / "doubled.test.yaml").write_text(yaml.safe_dump(tests, width=1000))
    result = subprocess.run(
        [promtool, "test", "rules", "doubled.test.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    legend = "\n".join(f"dashboard:query_{i}: {title}: {expr}" for i, (title, expr) in enumerate(titled))
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{legend}"
