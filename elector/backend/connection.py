"""How to reach Redis: settings, URL checks and client construction.

The client is built for a lease: every request has its own short timeout and redis-py's own
retries are off, because a retry loop inside the client could eat the whole validity of a lease
while the election believes a single request is in flight. The election retries instead.
"""

from __future__ import annotations

import dataclasses
import socket
import urllib.parse
from pathlib import Path
from typing import Any

import redis.asyncio
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

SUPPORTED_SCHEMES = ("redis", "rediss", "unix")


#: URL query options a user may set. Everything else that redis-py would read from the URL
#: (socket_timeout, retry_on_timeout, health_check_interval, ...) silently overrides the keyword
#: arguments elector passes, and elector's lease safety depends on those: refused.
ALLOWED_QUERY_OPTIONS = frozenset(
    {
        "db",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_path",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_check_hostname",
    }
)


class InvalidRedisSettingsError(ValueError):
    """A Redis setting is wrong; the message never contains a secret.

    `setting` says which: "url", "password_file" or "request_timeout".
    """

    def __init__(self, message: str, *, setting: str = "url") -> None:
        super().__init__(message)
        self.setting = setting


@dataclasses.dataclass(frozen=True, slots=True)
class RedisSettings:
    """Where Redis is and how to talk to it."""

    #: redis://[user[:password]@]host[:port][/db], rediss:// (TLS), or unix:///path/to.sock
    url: str = "redis://localhost:6379/0"
    #: A file holding the password (e.g. a mounted Kubernetes Secret); overrides the URL's.
    password_file: Path | None = None
    #: Per-request timeout (connect, send and read), seconds.
    request_timeout_s: float = 1.0
    #: Prefix of every key and channel elector writes.
    key_prefix: str = "elector"

    def validate(self) -> None:
        parsed = _parse(self.url)
        if "@" in parsed.path + parsed.query + parsed.fragment:
            # urlsplit ended the user-info early: the password holds a raw "/", "?" or "#".
            raise InvalidRedisSettingsError(
                "the redis URL's password contains '/', '?' or '#': percent-encode it "
                "(%2F, %3F, %23) or pass it with --redis-password-file"
            )
        if parsed.scheme in ("redis", "rediss") and not parsed.hostname:
            raise InvalidRedisSettingsError(f"redis URL has no host: {redact_url(self.url)}")
        if parsed.scheme == "unix" and not parsed.path:
            raise InvalidRedisSettingsError(f"unix redis URL has no socket path: {redact_url(self.url)}")
        try:
            _ = parsed.port
        except ValueError:
            raise InvalidRedisSettingsError(
                f"redis URL has an invalid port: {redact_url(self.url)}"
            ) from None
        for option in urllib.parse.parse_qs(parsed.query, keep_blank_values=True):
            if option.lower() in ("password", "username"):
                continue
            if option not in ALLOWED_QUERY_OPTIONS:
                allowed = ", ".join(sorted(ALLOWED_QUERY_OPTIONS))
                raise InvalidRedisSettingsError(
                    f"redis URL option {option!r} is not supported: elector sets timeouts, retries "
                    f"and health checks itself (see --request-timeout); allowed: {allowed}"
                )
        try:
            parse_url(self.url)
        except ValueError as exc:
            raise InvalidRedisSettingsError(f"{exc} ({redact_url(self.url)})") from None
        if self.password_file is not None:
            self.read_password()
        if self.request_timeout_s <= 0:
            raise InvalidRedisSettingsError(
                "redis request timeout must be positive", setting="request_timeout"
            )

    def read_password(self) -> str | None:
        """The password from the file (trailing newline stripped), or None without a file."""
        if self.password_file is None:
            return None
        try:
            text = self.password_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise InvalidRedisSettingsError(
                f"cannot read the redis password file {self.password_file}: {exc.strerror}",
                setting="password_file",
            ) from None
        except UnicodeDecodeError:
            raise InvalidRedisSettingsError(
                f"the redis password file {self.password_file} is not UTF-8 text", setting="password_file"
            ) from None
        password = text.rstrip("\r\n")
        if not password:
            raise InvalidRedisSettingsError(
                f"the redis password file {self.password_file} is empty", setting="password_file"
            )
        return password


def _parse(url: str) -> urllib.parse.SplitResult:
    try:
        parsed = urllib.parse.urlsplit(url)
    except ValueError:
        raise InvalidRedisSettingsError(f"not a valid redis URL: {redact_url(url)}") from None
    if parsed.scheme not in SUPPORTED_SCHEMES:
        raise InvalidRedisSettingsError(
            f"redis URL must start with redis://, rediss:// or unix://, got {redact_url(url)!r}"
        )
    return parsed


_MASK = "***"
_SECRET_QUERY_KEYS = frozenset({"password", "pass", "pwd", "secret", "token"})


def redact_url(url: str) -> str:
    """`url` with passwords masked: `redis://user:secret@host:6379/0` -> `redis://user:***@host:6379/0`.

    Handles redis://, rediss://, unix:// (`unix://:pw@/path`) and `password=` query parameters.
    Works on the text rather than a parsed URL so that a malformed URL is still redacted.
    """
    scheme, sep, rest = url.partition("://")
    if sep:
        # The last "@" ends the user-info, so that an unescaped "@" or "?" in a password does not
        # leave the rest of it in clear (a URL's query never needs an "@").
        at = rest.rfind("@")
        if at >= 0:
            user, colon, password = rest[:at].partition(":")
            if colon and password:
                url = f"{scheme}://{user}:{_MASK}{rest[at:]}"
    base, query_sep, query_and_fragment = url.partition("?")
    if not query_sep:
        return url
    query, fragment_sep, fragment = query_and_fragment.partition("#")
    parts = []
    for part in query.split("&"):
        key, eq, value = part.partition("=")
        secret = eq and value and urllib.parse.unquote_plus(key).lower() in _SECRET_QUERY_KEYS
        parts.append(f"{key}={_MASK}" if secret else part)
    return f"{base}?{'&'.join(parts)}{fragment_sep}{fragment}"


def _without_password(url: str) -> str:
    parsed = urllib.parse.urlsplit(url)
    if parsed.password is None:
        return url
    userinfo, _, hostport = parsed.netloc.rpartition("@")
    user = userinfo.partition(":")[0]
    netloc = f"{user}@{hostport}" if user else hostport
    return urllib.parse.urlunsplit(parsed._replace(netloc=netloc))


def _keepalive_options() -> dict[int, int]:
    # Detect a silently dead peer (no RST) in ~10 s without sending any Redis command: the idle
    # follower's request budget has no room for frequent PINGs.
    options: dict[int, int] = {}
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            options[getattr(socket, name)] = value
    return options


def make_client(settings: RedisSettings, *, client_name: str | None = None) -> redis.asyncio.Redis:
    """A redis-py asyncio client for the lease: short timeouts, no retries, bytes responses."""
    settings.validate()
    extra: dict[str, Any] = {}
    url = settings.url
    password = settings.read_password()
    if password is not None:
        # redis-py lets a password in the URL win over the keyword: drop the URL's.
        url = _without_password(url)
        extra["password"] = password
    if _parse(settings.url).scheme != "unix":
        extra["socket_keepalive"] = True
        extra["socket_keepalive_options"] = _keepalive_options()
    client: redis.asyncio.Redis = redis.asyncio.Redis.from_url(
        url,
        socket_timeout=settings.request_timeout_s,
        socket_connect_timeout=settings.request_timeout_s,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
        health_check_interval=0,
        decode_responses=False,
        client_name=client_name,
        **extra,
    )
    return client
