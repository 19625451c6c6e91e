"""TLS with client certificates, ACL users, and the start-up checks of the TLS settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from elector.backend import InvalidRedisSettingsError, RedisLeaseBackend, RedisSettings, make_client
from elector.daemon.settings import SettingsError, build_settings
from elector.lease import BackendErrorKind, Granted, LeaseBackendError, Renewed
from elector.testing.redis_server import RedisServerProcess
from tests.support.daemon import DaemonProcess, wait_until
from tests.support.seed import seed_used_lock, seed_used_lock_async
from tests.support.tls import TlsRedis, make_tls_files

PASSWORD = "s3cr3t-Tls-pw"


@pytest.fixture
def tls_redis(tmp_path: Path, tls_redis_binary: str) -> Iterator[TlsRedis]:
    with TlsRedis(tmp_path / "tls", binary=tls_redis_binary) as server:
        yield server


def _settings(server: TlsRedis, **overrides: object) -> RedisSettings:
    values: dict[str, object] = {
        "url": server.url,
        "tls_ca_file": server.files.ca,
        "tls_cert_file": server.files.client_cert,
        "tls_key_file": server.files.client_key,
        "request_timeout_s": 1.0,
    }
    values.update(overrides)
    return RedisSettings(**values)  # type: ignore[arg-type]


async def test_lease_over_tls_with_a_client_certificate(tls_redis: TlsRedis) -> None:
    # 5 s requests: a TLS handshake timed out at 1 s at load 12 (`make test-loaded`, run #6).
    # The claim is that the lease works over mutual TLS, not its speed.
    client = make_client(_settings(tls_redis, request_timeout_s=5.0))
    try:
        await seed_used_lock_async(client)
        backend = RedisLeaseBackend(client, lock="jobs")
        granted = await backend.acquire("pod-a", ttl_ms=5000)
        assert isinstance(granted, Granted)
        assert isinstance(await backend.renew(granted.lease), Renewed)
    finally:
        await client.aclose()


@pytest.mark.parametrize("fault", ["wrong_ca", "no_client_cert"])
async def test_tls_refusals_are_connection_errors(tls_redis: TlsRedis, tmp_path: Path, fault: str) -> None:
    # A refusal comes as soon as the handshake is done; at load 11 the handshake alone took over
    # the usual 1 s and the refusal was a timeout. The timeout only bounds a hang here.
    if fault == "wrong_ca":
        other = make_tls_files(tmp_path / "other")
        settings = _settings(tls_redis, tls_ca_file=other.ca, request_timeout_s=10.0)
    else:
        settings = _settings(tls_redis, tls_cert_file=None, tls_key_file=None, request_timeout_s=10.0)
    client = make_client(settings)
    try:
        with pytest.raises(LeaseBackendError) as info:
            await RedisLeaseBackend(client, lock="jobs").acquire("pod-a", ttl_ms=5000)
    finally:
        await client.aclose()
    assert info.value.kind is BackendErrorKind.CONNECTION
    if fault == "wrong_ca":
        assert "certificate verify failed" in str(info.value)


def test_tls_settings_are_checked_at_start_up(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        ({"url": "redis://h:6379/0", "tls_ca_file": files.ca}, "--redis-tls-ca", "rediss://"),
        ({"url": "rediss://h:6379/0", "tls_cert_file": files.client_cert}, "--redis-tls-key", "go together"),
        (
            {"url": "rediss://h:6379/0", "tls_ca_file": tmp_path / "missing.pem"},
            "--redis-tls-ca",
            "No such file",
        ),
        ({"url": "rediss://h:6379/0", "tls_ca_file": garbage}, "--redis-tls-ca", "no usable CA"),
        (
            {
                "url": "rediss://h:6379/0",
                "tls_cert_file": files.client_cert,
                "tls_key_file": files.server_key,
            },
            "--redis-tls-cert",
            "not a matching",
        ),
        (
            {"url": f"rediss://h:6379/0?ssl_ca_certs={files.ca}", "tls_ca_file": files.ca},
            "--redis-tls-ca",
            "keep one",
        ),
    ]
    for kwargs, flag, fragment in cases:
        redis_kwargs = {f"redis_{key.removesuffix('_file')}": value for key, value in kwargs.items()}
        with pytest.raises(SettingsError) as info:
            build_settings(lock="jobs", identity="pod-a", **redis_kwargs)  # type: ignore[arg-type]
        assert flag in str(info.value) and fragment in str(info.value), (kwargs, str(info.value))
    with pytest.raises(InvalidRedisSettingsError) as raw:
        RedisSettings(url="rediss://h/0", tls_key_file=files.client_key).validate()
    assert raw.value.setting == "tls_cert"


async def test_acl_user_with_only_the_lease_rights(redis_server: RedisServerProcess) -> None:
    admin = redis.Redis(port=redis_server.port)
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "elector", "on", f">{PASSWORD}", "~elector:*", "&elector:*",
        "+@read", "+@write", "+@scripting", "+@pubsub", "+info", "+ping", "+client", "+hello", "+time",
    )  # fmt: skip
    seed_used_lock(admin)
    admin.close()
    client = make_client(RedisSettings(url=f"redis://elector:{PASSWORD}@127.0.0.1:{redis_server.port}/0"))
    try:
        granted = await RedisLeaseBackend(client, lock="jobs").acquire("pod-a", ttl_ms=5000)
        assert isinstance(granted, Granted)
    finally:
        await client.aclose()
    wrong = make_client(
        RedisSettings(url=f"redis://elector:wrong-{PASSWORD}@127.0.0.1:{redis_server.port}/0")
    )
    try:
        with pytest.raises(LeaseBackendError) as info:
            await RedisLeaseBackend(wrong, lock="jobs").acquire("pod-a", ttl_ms=5000)
    finally:
        await wrong.aclose()
    assert info.value.kind is BackendErrorKind.AUTH
    assert PASSWORD not in str(info.value)


def test_daemon_over_tls_with_acl_user_and_password_file(tmp_path: Path, tls_redis_binary: str) -> None:
    with TlsRedis(tmp_path / "tls", binary=tls_redis_binary) as server:
        admin = redis.Redis(port=server.server.port)
        acl = ("ACL", "SETUSER", "elector", "on", f">{PASSWORD}", "~*", "&*", "+@all")
        admin.execute_command(*acl)  # type: ignore[no-untyped-call]
        seed_used_lock(admin)
        admin.close()
        password_file = tmp_path / "password"
        password_file.write_text(PASSWORD + "\n")
        daemon = DaemonProcess(
            redis_url=f"rediss://elector@127.0.0.1:{server.tls_port}/0",
            identity="pod-a",
            log_dir=tmp_path,
            extra_args=(
                "--redis-password-file", str(password_file),
                "--redis-tls-ca", str(server.files.ca),
                "--redis-tls-cert", str(server.files.client_cert),
                "--redis-tls-key", str(server.files.client_key),
                "--log-level", "debug",
            ),
        ).start()  # fmt: skip
        try:
            daemon.wait_http()
            wait_until(daemon.is_leader, timeout_s=10)
            leader, metrics = daemon.get("/leader")[1], daemon.metrics()
        finally:
            daemon.stop()
        for text in (daemon.logs_text(), leader, metrics):
            assert PASSWORD not in text
