"""Every metric the dashboard or an alert queries is exported by a real, running daemon.

A leader and a follower (`python -m elector run`) share one lock on a private redis-server; their
/metrics are scraped and parsed. Names are read out of the PromQL of every dashboard target and
variable, every alerting rule, and every input series of the promtool unit tests (so those tests
cannot pass on made-up series). Label values that the queries match on (`result`, `reason`) and
labels they group by must exist too; `namespace` and `pod` come from Prometheus target labels.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml
from prometheus_client.parser import text_string_to_metric_families

from elector.testing.redis_server import RedisServerProcess
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.seed import seed_used_lock
from tests.support.tiers import REDIS, needs

FILES = Path(__file__).resolve().parents[2] / "helm" / "elector" / "files"
TARGET_LABELS = {"namespace", "pod"}  # added by the ServiceMonitor/PodMonitor scrape, not the daemon
#: Further target labels of a scrape (the ServiceMonitor adds `service`, both monitors `endpoint`):
#: the promtool unit tests' series carry them, the daemon does not export them.
SCRAPE_LABELS = {"job", "instance", "container", "service", "endpoint"}
LOCK = "jobs"


class Exported:
    """Sample names, their family types and label values, from the daemons' expositions."""

    def __init__(self, expositions: list[str]) -> None:
        self.types: dict[str, str] = {}
        self.labels: dict[str, dict[str, set[str]]] = {}
        for text in expositions:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    self.types[sample.name] = family.type
                    values = self.labels.setdefault(sample.name, {})
                    for label, value in sample.labels.items():
                        values.setdefault(label, set()).add(value)


@pytest.fixture(scope="module")
@needs(REDIS)
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Exported]:
    # The conftest's `redis_server` is function-scoped; one server and two daemons serve every test here.
    log_dir = tmp_path_factory.mktemp("daemons")
    with RedisServerProcess() as server:
        seed_used_lock(redis.Redis(port=server.port), LOCK)  # no quiet period of a new lock
        leader = DaemonProcess(redis_url=server.url, identity="app-a", log_dir=log_dir, lock=LOCK)
        follower = DaemonProcess(redis_url=server.url, identity="app-b", log_dir=log_dir, lock=LOCK)
        try:
            leader.start().wait_http()
            wait_until(leader.is_leader, timeout_s=10)
            follower.start().wait_http()
            wait_until(lambda: (follower.leader() or {}).get("holder") == "app-a", timeout_s=10)
            # At least one renewal observed (ttl 1s: one every 300 ms), so the histogram has data.
            wait_until(lambda: renewals_ok(leader.metrics()) > 0, timeout_s=5)
            assert leader.is_leader() and not follower.is_leader()
            yield Exported([leader.metrics(), follower.metrics()])
        finally:
            follower.stop()
            leader.stop()


def renewals_ok(exposition: str) -> float:
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "elector_renewals_total" and sample.labels.get("result") == "ok":
                return sample.value
    raise AssertionError("no elector_renewals_total{result='ok'} sample")


def _without_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)


def metric_names(expr: str) -> set[str]:
    """elector_* identifiers used as metric names (string literals such as label values ignored)."""
    return set(re.findall(r"\b(elector_[A-Za-z0-9_]+)(?=\s*[{\[)\s,]|$)", _without_strings(expr)))


def dashboard_exprs() -> list[str]:
    model = json.loads((FILES / "dashboard.json").read_text())
    found = [
        target["expr"]
        for panel in model["panels"]
        if panel["type"] != "row"
        for target in panel.get("targets", [])
    ]
    found += [
        variable["definition"] for variable in model["templating"]["list"] if variable["type"] == "query"
    ]
    return found


def alert_exprs() -> list[str]:
    groups = yaml.safe_load((FILES / "alerts.rules.yaml").read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def unit_test_series() -> list[str]:
    document = yaml.safe_load((FILES / "alerts.test.yaml").read_text())
    return [series["series"] for case in document["tests"] for series in case["input_series"]]


SOURCES = {"dashboard": dashboard_exprs, "alerts": alert_exprs, "alert unit tests": unit_test_series}


def test_the_queries_use_the_metrics_they_are_meant_to() -> None:
    """The name parser finds what the observability files are about (guards against a silent no-op)."""
    used = set().union(*(metric_names(expr) for expr in dashboard_exprs() + alert_exprs()))
    assert used == {
        "elector_is_leader",
        "elector_leader_info",
        "elector_leader_transitions_total",
        "elector_step_downs_total",
        "elector_renew_duration_seconds_bucket",
        "elector_lease_remaining_seconds",
        "elector_fencing_token",
        "elector_redis_up",
        "elector_acquire_attempts_total",
        "elector_renewals_total",
        "elector_release_withheld_total",
        "elector_fencing_token_regressions_total",
    }
    assert metric_names('rate(elector_renewals_total{result=~"elector_x"}[5m])') == {"elector_renewals_total"}


@pytest.mark.parametrize("source", list(SOURCES))
def test_every_queried_metric_is_exported_by_a_running_daemon(exported: Exported, source: str) -> None:
    for expr in SOURCES[source]():
        for name in metric_names(expr):
            assert name in exported.types, f"{source}: {name} (in {expr!r}) is not exported by the daemon"
            if name.endswith("_bucket"):
                assert exported.types[name] == "histogram", name
            assert exported.labels[name]["lock"] == {LOCK}, name


@pytest.mark.parametrize("source", list(SOURCES))
def test_matched_label_values_are_exported(exported: Exported, source: str) -> None:
    """`result="error"`, `result=~"error|lost"`, `reason=...`: every value matched exists on the metric."""
    for expr in SOURCES[source]():
        for name, matchers in re.findall(r"\b(elector_\w+)\{([^}]*)\}", expr):
            for label, op, value in re.findall(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"', matchers):
                if label in TARGET_LABELS | SCRAPE_LABELS | {"lock"} or "$" in value:
                    continue
                assert label in exported.labels[name], f"{source}: {name} has no label {label}"
                wanted = set(value.split("|")) if op == "=~" else {value}
                missing = wanted - exported.labels[name][label]
                assert not missing, f"{source}: {name}{{{label}}} never takes {missing} (in {expr!r})"


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_grouping_labels_exist(exported: Exported, source: str) -> None:
    """Labels in `by (...)` exist on the metrics of that query, or are Prometheus target labels."""
    for expr in SOURCES[source]():
        names = metric_names(expr)
        for grouping in re.findall(r"\bby\s*\(([^)]*)\)", expr):
            for label in (label.strip() for label in grouping.split(",")):
                if label in TARGET_LABELS:
                    continue
                assert all(label in exported.labels[name] for name in names), f"{label} in {expr!r}"


def test_the_daemons_export_the_documented_label_values(exported: Exported) -> None:
    """The values the dashboard's legends and the alerts' comments rely on (README's metrics table)."""
    assert exported.labels["elector_step_downs_total"]["reason"] == {
        "lost",
        "renew_deadline",
        "lease_expired",
        "shutdown",
        "resigned",
        "handoff",
        "preempted",
        "app_unhealthy",
    }
    assert exported.labels["elector_acquire_attempts_total"]["result"] == {
        "acquired",
        "held",
        "quiet_period",
        "stand_back",
        "error",
    }
    assert exported.labels["elector_renewals_total"]["result"] == {"ok", "lost", "error"}
    assert exported.labels["elector_leader_info"]["holder"] == {"app-a"}
