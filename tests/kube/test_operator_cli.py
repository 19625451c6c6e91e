"""`elector operator` on the command line, and the LeaderElection spec checks (no cluster needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from elector.cli.main import cli
from elector.kube.operator import command as operator_cli
from elector.kube.operator import resource
from elector.kube.operator.runner import default_operator_lock


def test_the_cli_does_not_import_kopf_until_the_operator_runs() -> None:
    code = "import sys, elector.cli.main; sys.exit(1 if 'kopf' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_without_kopf_the_operator_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(operator_cli, "kopf_missing", lambda: True)
    result = CliRunner().invoke(cli, ["operator", "--namespace", "apps"])
    assert result.exit_code == 2
    assert "pip install 'elector[kube]'" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give --namespace"),
        (["--namespace", "a", "--all-namespaces"], "not both"),
        (["--namespace", "a", "--lock", "bad lock"], "--lock"),
        (["--namespace", "a", "--ttl", "10"], "--ttl"),
        (["--namespace", "a", "--http-address", "nope"], "--http-address"),
        (["--namespace", "a", "--redis-url", "http://x"], "--redis-url"),
    ],
)
def test_bad_settings_exit_2_naming_the_setting(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["operator", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_the_settings_reach_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    from elector.kube.operator.runner import OperatorSettings  # kopf: only where it is needed

    seen: list[tuple[object, dict[str, str]]] = []

    def run(settings: object, **logs: str) -> int:
        seen.append((settings, logs))
        return 0

    monkeypatch.setattr(operator_cli, "run_operator_command", run)
    args = [
        "operator",
        "--namespace",
        "a b",
        "--ttl",
        "1m30s",
        "--log-level",
        "CRITICAL",
        "--identity",
        "op-1",
    ]
    result = CliRunner().invoke(cli, args, env={"ELECTOR_REDIS_URL": "redis://r:6379/1"})
    assert result.exit_code == 0, result.output
    ((settings, logs),) = seen
    assert isinstance(settings, OperatorSettings)
    assert (settings.ttl_s, settings.namespaces, settings.identity) == (90.0, ("a", "b"), "op-1")
    assert (settings.lock, settings.redis.url) == ("elector-operator/namespaces/a.b", "redis://r:6379/1")
    assert logs == {"log_format": "auto", "log_level": "critical"}


def test_tls_files_are_checked_as_the_daemon_checks_them(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    result = CliRunner().invoke(cli, ["operator", "--namespace", "a", "--redis-tls-ca", str(ca)])
    assert result.exit_code == 2
    assert "invalid setting --redis-tls-ca: --redis-tls-ca only apply to TLS connections" in result.output


def _spec(**changes: object) -> dict[str, object]:
    spec: dict[str, object] = {
        "lock": "jobs",
        "redis": {"url": "redis://redis:6379/0"},
        "selector": {"matchLabels": {"app": "worker"}},
    }
    spec.update(changes)
    return spec


def test_a_valid_spec_gets_its_defaults() -> None:
    parsed = resource.parse_spec(_spec())
    assert parsed.lock == "jobs"
    assert parsed.leader_label == "elector.io/leader"
    assert parsed.key_prefix == "elector"
    assert (parsed.handoff_window_s, parsed.handoff_timeout_s) == (10.0, 30.0)
    secret = resource.parse_spec(
        _spec(redis={"urlSecretRef": {"name": "redis", "key": "url"}}, leaderLabel="example.com/active")
    )
    assert secret.redis_url is None and secret.url_secret == resource.SecretKeyRef(name="redis", key="url")
    assert secret.leader_label == "example.com/active"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"lock": ""}, "lock"),
        ({"redis": {}}, "redis"),
        ({"redis": {"url": "redis://r", "urlSecretRef": {"name": "s", "key": "k"}}}, "redis"),
        ({"redis": {"url": "redis://user:pw@r:6379"}}, "redis.url"),
        ({"redis": {"url": "redis://r:6379/0?password=pw"}}, "redis.url"),
        ({"redis": {"url": "redis://r/0?db=1&PassWord=pw"}}, "redis.url"),
        ({"redis": {"url": "redis://r/0?%70assword=pw"}}, "redis.url"),  # escaped "p"
        ({"redis": {"url": "unix://:pw@/run/redis.sock"}}, "redis.url"),
        ({"redis": {"urlSecretRef": {"name": "s"}}}, "redis.urlSecretRef"),
        ({"selector": {}}, "selector"),
        (
            {"selector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "selector.matchExpressions[0].values",
        ),
        ({"leaderLabel": "not a label"}, "leaderLabel"),
        ({"handoffWindowSeconds": 0}, "handoffWindowSeconds"),
    ],
)
def test_an_invalid_spec_names_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(resource.SpecError) as info:
        resource.parse_spec(_spec(**changes))
    assert info.value.field == field
    assert "pw@" not in str(info.value)


def test_a_url_without_credentials_is_accepted() -> None:
    for url in ("redis://r:6379/0", "redis://r/0?socket_timeout=1&db=2", "rediss://r/0?ssl_cert_reqs=none"):
        assert resource.parse_spec(_spec(redis={"url": url})).redis_url == url


def test_selectors_match_as_the_api_server_does() -> None:
    selector = {
        "matchLabels": {"app": "worker"},
        "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a", "b"]},
            {"key": "canary", "operator": "DoesNotExist"},
        ],
    }
    assert resource.selector_matches(selector, {"app": "worker", "tier": "a"})
    assert not resource.selector_matches(selector, {"app": "worker", "tier": "c"})
    assert not resource.selector_matches(selector, {"app": "worker", "tier": "a", "canary": "1"})
    assert not resource.selector_matches(selector, {"tier": "a"})


@pytest.mark.parametrize(
    ("args", "lock"),
    [
        (["--namespace", "team-a"], "elector-operator/namespaces/team-a"),
        (["--namespace", "jobs apps", "--namespace", "apps"], "elector-operator/namespaces/apps.jobs"),
        (["--all-namespaces"], "elector-operator/cluster-wide"),
        (["--namespace", "apps", "--lock", "mine"], "mine"),
    ],
)
def test_the_default_lock_is_named_after_what_the_operator_watches(
    monkeypatch: pytest.MonkeyPatch, args: list[str], lock: str
) -> None:
    """Operator A (team-a) and operator B (apps) must not share one global lock: B would never lead."""
    seen: list[object] = []
    monkeypatch.setattr(
        operator_cli, "run_operator_command", lambda settings, **_: seen.append(settings) or 0
    )
    result = CliRunner().invoke(cli, ["operator", *args], env={"ELECTOR_REDIS_URL": "redis://r:6379/1"})
    assert result.exit_code == 0, result.output
    assert seen[0].lock == lock  # type: ignore[attr-defined]


def test_a_default_lock_for_many_namespaces_stays_a_valid_lock_name() -> None:
    many = [f"team-{i:03d}-with-a-long-namespace-name" for i in range(20)]
    lock = default_operator_lock(many, clusterwide=False)
    assert lock.startswith("elector-operator/namespaces/sha256-") and len(lock) <= 200
    assert lock == default_operator_lock(list(reversed(many)), clusterwide=False)
    assert lock != default_operator_lock(many[1:], clusterwide=False)
