"""Settings of the Redis topologies: Sentinel URLs, TLS files and --min-replicas-ack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from elector.backend.replication import ReplicaAck
from elector.cli.main import cli
from elector.daemon.settings import SettingsError, build_settings

SENTINEL = "redis+sentinel://s1:26379,s2:26379,s3:26379/mymaster"


@pytest.mark.parametrize(
    ("kwargs", "expected_ack"),
    [
        ({}, None),
        ({"min_replicas_ack": 1}, ReplicaAck(replicas=1, timeout_ms=225)),  # half the 450ms request timeout
        ({"min_replicas_ack": 2, "replicas_ack_timeout": 0.2}, ReplicaAck(replicas=2, timeout_ms=200)),
        ({"redis_url": SENTINEL, "min_replicas_ack": 1}, ReplicaAck(replicas=1, timeout_ms=225)),
    ],
)
def test_good_topology_settings(kwargs: dict[str, Any], expected_ack: ReplicaAck | None) -> None:
    settings = build_settings(
        lock="jobs", identity="pod-a", **{"redis_url": "redis://h:6379/0", "ttl": 3.0, **kwargs}
    )
    assert settings.redis.replica_ack == expected_ack


@pytest.mark.parametrize(
    ("kwargs", "flag", "fragment"),
    [
        ({"min_replicas_ack": -1}, "--min-replicas-ack", "from 0 to 100"),
        ({"replicas_ack_timeout": 0.1}, "--replicas-ack-timeout", "only applies with"),
        ({"min_replicas_ack": 1, "replicas_ack_timeout": 5.0}, "--replicas-ack-timeout", "shorter than"),
        ({"redis_url": "redis+sentinel://s1:26379"}, "--redis-url", "no master name"),
        ({"redis_tls_ca": Path("/nonexistent/ca.pem")}, "--redis-tls-ca", "rediss://"),
    ],
)
def test_bad_topology_settings_name_the_option(kwargs: dict[str, Any], flag: str, fragment: str) -> None:
    with pytest.raises(SettingsError) as info:
        build_settings(
            lock="jobs", identity="pod-a", **{"redis_url": "redis://h:6379/0", "ttl": 3.0, **kwargs}
        )
    assert flag in str(info.value) and fragment in str(info.value), str(info.value)


def test_cli_reads_the_new_options_from_the_environment() -> None:
    result = CliRunner().invoke(
        cli,
        ["run", "--lock", "jobs", "--redis-url", "redis://h:6379/0"],
        env={
            "ELECTOR_MIN_REPLICAS_ACK": "1",
            "ELECTOR_REPLICAS_ACK_TIMEOUT": "5s",
            "ELECTOR_REDIS_TLS_CA": "",
        },
    )
    assert result.exit_code == 2
    assert "--replicas-ack-timeout" in result.output and "shorter than" in result.output


def test_status_passes_tls_files_as_url_options(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def fake_read_status(url: str, **kwargs: Any) -> str:
        seen["url"] = url
        return "ok"

    monkeypatch.setattr("elector.control.status.read_status", fake_read_status)
    ca = tmp_path / "ca.pem"
    result = CliRunner().invoke(
        cli, ["status", "--lock", "jobs", "--redis-url", "rediss://h:6380/0", "--redis-tls-ca", str(ca)]
    )
    assert result.exit_code == 0, result.output
    assert seen["url"] == f"rediss://h:6380/0?ssl_ca_certs={str(ca).replace('/', '%2F')}"
