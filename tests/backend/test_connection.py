"""Redis connection settings: URL checks, password files, redaction."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from elector.backend import InvalidRedisSettingsError, RedisSettings, make_client, redact_url
from elector.backend.connection import check_redis_url

# --- redact_url ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://user:secret@host:6379/0", "redis://user:***@host:6379/0"),
        ("redis://:secret@host:6379", "redis://:***@host:6379"),
        ("rediss://default:p%40ss@cache.example:6380/1", "rediss://default:***@cache.example:6380/1"),
        ("redis://u:p@ss/word@host:6379/0", "redis://u:***@host:6379/0"),
        ("redis://app:Tr0ub4dor?3@h:6379/0", "redis://app:***@h:6379/0"),
        ("unix://:pw@/var/run/redis.sock?db=0", "unix://:***@/var/run/redis.sock?db=0"),
        ("redis://host:6379/0?password=secret&db=1", "redis://host:6379/0?password=***&db=1"),
        ("unix:///tmp/redis.sock?db=0&Password=x#frag", "unix:///tmp/redis.sock?db=0&Password=***#frag"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis://user@host:6379", "redis://user@host:6379"),
        ("unix:///tmp/redis.sock", "unix:///tmp/redis.sock"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


# --- settings checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://host:6379", "must start with redis://, rediss:// or unix://"),
        ("redis://", "has no host"),
        ("redis://host:notaport/0", "invalid port"),
        ("redis://:secret@host:99999/0", "invalid port"),
        ("unix://", "no socket path"),
        ("redis://app:Tr0ub4dor?secret@h:6379/0", "percent-encode it"),
        ("redis://app:a/secret@h:6379/0", "percent-encode it"),
        ("redis://h:6379/0?socket_timeout=3", "'socket_timeout' is not supported"),
        ("redis://h:6379?db=x", "Invalid value for 'db'"),
        # What redis-py would take silently, then never reach or reach wrongly (check_redis_url).
        ("redis://h:6379/0?db=x", "gives the database twice"),
        ("redis://:secret@h:0/0", "port 0"),
        ("redis://:secret@h/abc", "must be a database number"),
        ("redis://h/0/1", "must be a database number"),
        ("redis://re dis:6379", "invalid host"),
        ("redis://h?db=1&db=1", "'db' more than once"),
        ("unix:///run/r.sock?db=1&db=2", "more than once"),
        ("redis://h\n:6379", "control characters"),
        ("redis+sentinel://s1:26379/m\t", "control characters"),
    ],
)
def test_bad_urls_are_refused_with_a_clear_message_and_no_secret(url: str, fragment: str) -> None:
    with pytest.raises(InvalidRedisSettingsError, match=re.escape(fragment)) as info:
        RedisSettings(url=url).validate()
    assert info.value.setting == "url"
    assert "secret" not in str(info.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://h",
        "redis://h:6379/",
        "rediss://u:p@h:6380/15",
        "unix:///run/r.sock?db=2",
        "redis://[::1]:6379/0",
    ],
)
def test_good_urls_pass_the_shape_check(url: str) -> None:
    check_redis_url(url)
    RedisSettings(url=url).validate()


def test_every_redlock_server_gets_the_shape_check() -> None:
    urls = ("redis://a:1/0", "redis://b:0/0", "redis://c:1/0")
    with pytest.raises(InvalidRedisSettingsError, match="port 0") as info:
        RedisSettings(redlock_urls=urls).validate()
    assert info.value.setting == "redlock_url"


def test_password_file_is_read_and_stripped(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    assert RedisSettings(url="redis://h:6379", password_file=secret).read_password() == "s3cret"


@pytest.mark.parametrize(
    ("content", "fragment"), [(None, "cannot read"), ("", "is empty"), ("\n", "is empty")]
)
def test_bad_password_files_are_refused(tmp_path: Path, content: str | None, fragment: str) -> None:
    path = tmp_path / "password"
    if content is not None:
        path.write_text(content)
    with pytest.raises(InvalidRedisSettingsError, match=fragment):
        RedisSettings(url="redis://h:6379", password_file=path).validate()


async def test_client_has_no_hidden_retries_and_short_timeouts(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("pw-from-file")
    client = make_client(
        RedisSettings(url="redis://user:inurl@h:6379/2", password_file=secret, request_timeout_s=0.3),
        client_name="elector:test",
    )
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 0.3 and kwargs["socket_connect_timeout"] == 0.3
    assert kwargs["password"] == "pw-from-file"  # the file wins over the URL
    assert kwargs["username"] == "user" and kwargs["db"] == 2
    assert client.get_retry() is not None and client.get_retry().get_retries() == 0
    await client.aclose()


def test_messages_name_settings_in_the_backends_terms_never_a_commands_flags(tmp_path: Path) -> None:
    # The backend knows no CLI: `--redis-tls-ca` is the CLI's word (elector/cli/options.py maps).
    pem = tmp_path / "file.pem"
    pem.write_text("not a certificate\n")
    cases = [
        (RedisSettings(url="redis://h:6379/0", tls_ca_file=pem), "tls_ca only apply to TLS"),
        (RedisSettings(url="rediss://h:6379/0", tls_cert_file=pem), "tls_cert and tls_key go together"),
        (RedisSettings(url="rediss://h:6379/0", tls_ca_file=tmp_path / "none.pem"), "cannot read tls_ca"),
        (RedisSettings(url="rediss://h:6379/0", tls_ca_file=pem), f"tls_ca {pem} holds no usable CA"),
        (RedisSettings(url="redis://h:6379/0", replicas_ack_timeout_s=0.1), "with min_replicas_ack 1"),
        (RedisSettings(url="redis://h:6379/0", min_replicas_ack=1, cluster=True), "min_replicas_ack is not"),
        (RedisSettings(url="redis://h:6379/0?socket_timeout=1"), "(see request_timeout)"),
    ]
    for settings, fragment in cases:
        with pytest.raises(InvalidRedisSettingsError) as info:
            settings.validate()
        assert fragment in str(info.value), str(info.value)
        assert "--" not in str(info.value), str(info.value)
