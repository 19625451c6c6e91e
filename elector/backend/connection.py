"""How to reach Redis: settings, URL checks and client construction.

The client is built for a lease: every request has its own short timeout and redis-py's own
retries are off, because a retry loop inside the client could eat the whole validity of a lease
while the election believes a single request is in flight. The election retries instead.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import ssl
import urllib.parse
from pathlib import Path
from typing import Any

import redis.asyncio
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from elector.backend.replication import ReplicaAck
from elector.backend.topologies import sentinel

SUPPORTED_SCHEMES = ("redis", "rediss", "unix", *sentinel.SENTINEL_SCHEMES)
TLS_SCHEMES = ("rediss", "rediss+sentinel")
#: Most replicas --min-replicas-ack may ask for (a sanity bound: Redis setups have a handful).
MAX_REPLICAS_ACK = 100


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

    `setting` says which: "url", "password_file", "request_timeout", "tls_ca", "tls_cert",
    "tls_key", "min_replicas_ack", "replicas_ack_timeout", "cluster" or "redlock_url". Messages
    name settings in these terms, never a command's flags: the CLI maps them to its flags
    (elector/cli/options.py, `in_flags`).
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
    #: TLS (rediss:// only): the CA bundle that signed the server's certificate ...
    tls_ca_file: Path | None = None
    #: ... and this client's certificate and key, for servers with `tls-auth-clients yes`.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    #: After each grant and renewal, WAIT until this many replicas have the write; 0: don't wait.
    min_replicas_ack: int = 0
    #: How long that WAIT may take, seconds; None: half the request timeout (the other half is
    #: for the script's own round trip, both inside the election's one-request bound).
    replicas_ack_timeout_s: float | None = None
    #: `url` names one node of a Redis Cluster (the lease lives on the master of its lock's slot).
    cluster: bool = False
    #: Redlock: the URLs of N >= 3 (odd) independent servers; when set, `url` is not used and each
    #: server is reached with these settings and its own URL (see backend/topologies/redlock.py).
    redlock_urls: tuple[str, ...] = ()

    @property
    def replica_ack(self) -> ReplicaAck | None:
        """The WAIT to send after writes that must survive a failover; None when not asked for."""
        if self.min_replicas_ack <= 0:
            return None
        timeout_s = self.replicas_ack_timeout_s
        if timeout_s is None:
            timeout_s = self.request_timeout_s / 2
        return ReplicaAck(replicas=self.min_replicas_ack, timeout_ms=max(1, round(timeout_s * 1000)))

    def validate(self) -> None:
        check_redis_url(self.url)
        if sentinel.is_sentinel_url(self.url):
            self._validate_sentinel_url()
        else:
            self._validate_url()
        if self.password_file is not None:
            self.read_password()
        if self.request_timeout_s <= 0:
            raise InvalidRedisSettingsError(
                "redis request timeout must be positive", setting="request_timeout"
            )
        self._validate_tls()
        self._validate_replica_ack()
        self._validate_topology()

    def _validate_topology(self) -> None:
        if self.cluster:
            if sentinel.is_sentinel_url(self.url) or _scheme(self.url) == "unix":
                raise InvalidRedisSettingsError(
                    "a Redis Cluster is reached through a redis:// or rediss:// URL of one of its nodes, "
                    f"not {redact_url(self.url)}",
                    setting="cluster",
                )
            if self.redlock_urls:
                raise InvalidRedisSettingsError(
                    "Redlock servers are independent servers, not a cluster: use one or the other",
                    setting="cluster",
                )
            if self.min_replicas_ack:
                # WAIT must follow the write on the same node connection, which the cluster
                # client does not promise: refused rather than silently not waited for.
                raise InvalidRedisSettingsError(
                    "min_replicas_ack is not supported with a Redis Cluster", setting="cluster"
                )
        if not self.redlock_urls:
            return
        count = len(self.redlock_urls)
        if count < 3 or count % 2 == 0:
            raise InvalidRedisSettingsError(
                f"Redlock needs an odd number of at least 3 independent servers, got {count}: with 2 "
                "no server may fail, and an even count tolerates no more failures than one fewer",
                setting="redlock_url",
            )
        if self.min_replicas_ack:
            # Redlock's confirm round is not WAITed, and a majority of independent servers is
            # already its answer to losing one: refused rather than half applied.
            raise InvalidRedisSettingsError(
                "min_replicas_ack is not supported with redlock_url", setting="redlock_url"
            )
        if len(set(self.redlock_urls)) != count:
            raise InvalidRedisSettingsError("a Redlock server is given twice", setting="redlock_url")
        for url in self.redlock_urls:
            if sentinel.is_sentinel_url(url):
                raise InvalidRedisSettingsError(
                    f"Redlock servers must be plain servers, not Sentinel sets: {redact_url(url)}",
                    setting="redlock_url",
                )
            node = dataclasses.replace(self, url=url, redlock_urls=())
            try:
                node.validate()
            except InvalidRedisSettingsError as exc:
                raise InvalidRedisSettingsError(str(exc), setting="redlock_url") from None

    def for_redlock_server(self, url: str) -> RedisSettings:
        """These settings for one server of the Redlock set."""
        return dataclasses.replace(self, url=url, redlock_urls=())

    def _validate_sentinel_url(self) -> None:
        try:
            target = sentinel.parse_sentinel_url(self.url)
        except (ValueError, sentinel.SentinelUrlError) as exc:
            raise InvalidRedisSettingsError(f"{exc} ({redact_url(self.url)})") from None
        _check_query_options(key for key, _ in target.options)
        if target.options and not target.tls:
            raise InvalidRedisSettingsError(
                f"TLS options in a redis+sentinel:// URL: use rediss+sentinel:// ({redact_url(self.url)})"
            )

    def _validate_url(self) -> None:
        parsed = _parse(self.url)
        if "@" in parsed.path + parsed.query + parsed.fragment:
            # urlsplit ended the user-info early: the password holds a raw "/", "?" or "#".
            raise InvalidRedisSettingsError(
                "the redis URL's password contains '/', '?' or '#': percent-encode it "
                "(%2F, %3F, %23) or pass it with password_file"
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
        _check_query_options(urllib.parse.parse_qs(parsed.query, keep_blank_values=True))
        try:
            parse_url(self.url)
        except ValueError as exc:
            raise InvalidRedisSettingsError(f"{exc} ({redact_url(self.url)})") from None

    def _validate_tls(self) -> None:
        files = {"tls_ca": self.tls_ca_file, "tls_cert": self.tls_cert_file, "tls_key": self.tls_key_file}
        given = {name: path for name, path in files.items() if path is not None}
        if not given:
            return
        names = ", ".join(given)
        if _scheme(self.url) not in TLS_SCHEMES:
            raise InvalidRedisSettingsError(
                f"{names} only apply to TLS connections: use a rediss:// (or rediss+sentinel://) URL",
                setting=next(iter(given)),
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            missing = "tls_key" if self.tls_key_file is None else "tls_cert"
            raise InvalidRedisSettingsError(
                f"tls_cert and tls_key go together: {missing} is missing",
                setting=missing,
            )
        query = self.url.partition("?")[2]
        for name, option in _URL_OPTION_OF.items():
            if name in given and option in urllib.parse.parse_qs(query):
                raise InvalidRedisSettingsError(
                    f"{name} and the URL option {option} both set the same file: keep one",
                    setting=name,
                )
        for name, path in given.items():
            _check_readable(path, setting=name)
        # Load them as the connection will, so that a wrong file fails at start-up, not in a loop.
        context = ssl.create_default_context()
        try:
            if self.tls_ca_file is not None:
                context.load_verify_locations(cafile=str(self.tls_ca_file))
        except (ssl.SSLError, ValueError) as exc:
            raise InvalidRedisSettingsError(
                f"tls_ca {self.tls_ca_file} holds no usable CA certificate ({_ssl_reason(exc)})",
                setting="tls_ca",
            ) from None
        try:
            if self.tls_cert_file is not None and self.tls_key_file is not None:
                context.load_cert_chain(certfile=str(self.tls_cert_file), keyfile=str(self.tls_key_file))
        except (ssl.SSLError, ValueError) as exc:
            raise InvalidRedisSettingsError(
                f"tls_cert {self.tls_cert_file} and tls_key {self.tls_key_file} "
                f"are not a matching certificate and private key ({_ssl_reason(exc)})",
                setting="tls_cert",
            ) from None

    def _validate_replica_ack(self) -> None:
        count = self.min_replicas_ack
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_REPLICAS_ACK:
            raise InvalidRedisSettingsError(
                f"min replicas ack must be an integer from 0 to {MAX_REPLICAS_ACK}, got {count!r}",
                setting="min_replicas_ack",
            )
        timeout_s = self.replicas_ack_timeout_s
        if timeout_s is None:
            return
        if count == 0:
            raise InvalidRedisSettingsError(
                "replicas_ack_timeout only applies with min_replicas_ack 1 or more",
                setting="replicas_ack_timeout",
            )
        if not 0.001 <= timeout_s < self.request_timeout_s:
            raise InvalidRedisSettingsError(
                f"the replicas ack timeout ({timeout_s * 1000:g}ms) must be at least 1ms and shorter "
                f"than the request timeout ({self.request_timeout_s * 1000:g}ms): the grant or "
                "renewal and its WAIT are one request for the election",
                setting="replicas_ack_timeout",
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


#: The URL query option redis-py reads for the same file.
_URL_OPTION_OF = {"tls_ca": "ssl_ca_certs", "tls_cert": "ssl_certfile", "tls_key": "ssl_keyfile"}


#: A host in a redis:// URL: a DNS name (underscores allowed: compose service names) or IPv4.
_URL_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?\.?")
_URL_DB_PATH = re.compile(r"/?|/\d{1,5}")


def check_redis_url(url: str) -> None:
    """Refuse what redis-py would accept silently and then never reach, or reach wrongly: it
    reads `/abc` or `/-1` as database 0 (or fails every request with it), takes port 0 for 6379
    and keeps the first of repeated query options. Other schemes, and anything unparsable, are
    left to the rest of `RedisSettings.validate`, which runs this first and reports them."""
    if any(not char.isprintable() for char in url):
        # urlsplit drops tabs and newlines without a word: "redis://h\n:6379" would become h:6379.
        raise InvalidRedisSettingsError("the redis URL contains control characters (a stray newline?)")
    try:
        parsed = urllib.parse.urlsplit(url)
        port = parsed.port
    except ValueError:
        return
    if parsed.scheme not in ("redis", "rediss", "unix"):
        return
    options = [name for name, _ in urllib.parse.parse_qsl(parsed.query, keep_blank_values=True)]
    repeated = sorted({name for name in options if options.count(name) > 1})
    host, tcp = parsed.hostname or "", parsed.scheme != "unix"
    if repeated:
        problem = f"the redis URL gives the option {repeated[0]!r} more than once"
    elif tcp and port == 0:
        problem = "the redis URL has port 0; give the server's port (default 6379)"
    elif tcp and host and ":" not in host and not _URL_HOST.fullmatch(host):
        problem = f"the redis URL has an invalid host {host!r}"
    elif tcp and not _URL_DB_PATH.fullmatch(parsed.path):
        problem = "the redis URL's path must be a database number, e.g. /0"
    elif tcp and parsed.path.strip("/") and "db" in options:
        problem = "the redis URL gives the database twice (path and ?db=)"
    else:
        return
    raise InvalidRedisSettingsError(f"{problem}: {redact_url(url)}")


def _scheme(url: str) -> str:
    return url.partition("://")[0].lower()


def _check_query_options(options: Any) -> None:
    for option in options:
        if option.lower() in ("password", "username"):
            continue
        if option not in ALLOWED_QUERY_OPTIONS:
            allowed = ", ".join(sorted(ALLOWED_QUERY_OPTIONS))
            raise InvalidRedisSettingsError(
                f"redis URL option {option!r} is not supported: elector sets timeouts, retries "
                f"and health checks itself (see request_timeout); allowed: {allowed}"
            )


def _check_readable(path: Path, *, setting: str) -> None:
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise InvalidRedisSettingsError(
            f"cannot read {setting} {path}: {exc.strerror}", setting=setting
        ) from None


def _ssl_reason(exc: Exception) -> str:
    # ssl errors carry OpenSSL's reason ("[X509: NO_CERTIFICATE_OR_CRL_FOUND] ..."); never key bytes.
    return getattr(exc, "reason", None) or str(exc) or type(exc).__name__


def _parse(url: str) -> urllib.parse.SplitResult:
    try:
        parsed = urllib.parse.urlsplit(url)
    except ValueError:
        raise InvalidRedisSettingsError(f"not a valid redis URL: {redact_url(url)}") from None
    if parsed.scheme not in SUPPORTED_SCHEMES:
        raise InvalidRedisSettingsError(
            f"redis URL must start with redis://, rediss:// or unix:// (or redis+sentinel://, "
            f"rediss+sentinel:// for Sentinel), got {redact_url(url)!r}"
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


def url_without_password(url: str) -> str:
    """`url` without its password (the user stays): for a password given separately."""
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


def client_policy(settings: RedisSettings, *, client_name: str | None) -> dict[str, Any]:
    """The keyword arguments every lease client gets, whatever the topology.

    Per-request timeouts and no retries of redis-py's own: a retry loop or a blackholed
    connection inside the client must not eat a lease's validity while the election believes
    one request is in flight (the election retries). TCP keepalive finds a silently dead peer.
    """
    policy: dict[str, Any] = {
        "socket_timeout": settings.request_timeout_s,
        "socket_connect_timeout": settings.request_timeout_s,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
        "client_name": client_name,
    }
    if _scheme(settings.url) != "unix":
        policy["socket_keepalive"] = True
        policy["socket_keepalive_options"] = _keepalive_options()
    return policy


def tls_options(settings: RedisSettings) -> dict[str, Any]:
    """redis-py's ssl_* arguments for the TLS files of the settings (none without)."""
    files = (
        ("ssl_ca_certs", settings.tls_ca_file),
        ("ssl_certfile", settings.tls_cert_file),
        ("ssl_keyfile", settings.tls_key_file),
    )
    return {option: str(path) for option, path in files if path is not None}


def make_client(settings: RedisSettings, *, client_name: str | None = None) -> redis.asyncio.Redis:
    """A redis-py asyncio client for the lease: short timeouts, no retries, bytes responses.

    With a redis+sentinel:// URL, a client of the current master that follows failovers
    (see sentinel.py); the sentinels get the same timeouts and no retries.
    """
    settings.validate()
    policy = {**client_policy(settings, client_name=client_name), "retry_on_timeout": False}
    tls: dict[str, Any] = tls_options(settings)
    password = settings.read_password()
    if sentinel.is_sentinel_url(settings.url):
        target = sentinel.parse_sentinel_url(settings.url)
        if target.tls:
            tls = {"ssl": True, **dict(target.options), **tls}
        data_node: dict[str, Any] = {**policy, **tls, "db": target.db, "decode_responses": False}
        if target.username is not None:
            data_node["username"] = target.username
        if password is not None or target.password is not None:
            data_node["password"] = password if password is not None else target.password
        return sentinel.make_sentinel_client(
            # retry_on_timeout is deprecated for plain clients (and false anyway): not for sentinels.
            target,
            connection_kwargs=data_node,
            sentinel_kwargs={k: v for k, v in {**policy, **tls}.items() if k != "retry_on_timeout"},
        )
    url = settings.url
    extra: dict[str, Any] = {}
    if password is not None:
        # redis-py lets a password in the URL win over the keyword: drop the URL's.
        url = url_without_password(url)
        extra["password"] = password
    client: redis.asyncio.Redis = redis.asyncio.Redis.from_url(
        url, decode_responses=False, **policy, **tls, **extra
    )
    return client
