"""The Grafana dashboard in helm/elector/files/dashboard.json: model, variables, panels, and queries.

Every panel query is also parsed by the real PromQL parser (promtool check rules on a throwaway
rules file holding the queries with the dashboard variables filled in).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

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
        r"\(rate\(elector_renew_duration_seconds_bucket\{"
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
