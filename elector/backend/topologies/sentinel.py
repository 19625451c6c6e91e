"""Redis Sentinel: the `redis+sentinel://` URL and a client that follows the master.

    redis+sentinel://[user:password@]host1[:port1][,host2[:port2]...]/<master-name>[/db]
    rediss+sentinel://...   TLS to the sentinels and to the master

The sentinels' default port is 26379. The user and password are the master's (the data
nodes'); the sentinels are asked without credentials.

Discovery is redis-py's (`redis.asyncio.sentinel.Sentinel.master_for`), with elector's client
policy applied to the sentinels as well: no retries, the request timeout on every socket. What
the pool does on a failover (checked in tests/backend/topologies/test_sentinel.py):

- Every NEW connection asks the sentinels for the master's address; an address change drops
  the pool's idle connections, so nothing idles on the old master.
- A connection in use when the master changes errs on its next request: the demoted master
  closes its clients (Sentinel sends it CLIENT KILL), a killed one refuses or resets. A write
  answered READONLY is turned into a ConnectionError by redis-py and the connection is dropped.
  Either way the request fails once (a CONNECTION or SERVER backend error: a failed renewal,
  not a crash), and the next one connects to whatever the sentinels report then.
- The announcement hub (hub.py) takes its connection from the same pool, so its reconnect
  after the old connection broke lands on the new master too.
- A planned failover (SENTINEL FAILOVER) leaves the old master writable for seconds and kills no
  connection: only a master watcher (sentinel_watch.py, which the daemon and the library run)
  moves the pool's connections at once. Without it, a leader stays on the old master.
- Discovery asks every sentinel (or uses the watcher's answer), not just the first one: the
  failover leader reports the old address in SENTINEL MASTERS until its failover ends. An
  address is used only when a majority of the listed sentinels name it with the newest config
  epoch (sentinel_watch.agreed_master); without a majority the connection fails
  (MasterNotFoundError, a failed request) rather than guess.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import Any

import redis.asyncio
from redis.asyncio.sentinel import SentinelConnectionPool

from elector.backend.topologies.sentinel_watch import FollowingSentinel

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
DEFAULT_SENTINEL_PORT = 26379
#: Sentinel addresses one URL may list (a deployment has 3 or 5; more is a typo or an attack).
MAX_SENTINELS = 16


class SentinelUrlError(ValueError):
    """A malformed sentinel URL; the message never quotes the URL (the caller adds it redacted)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SentinelTarget:
    """What a `redis+sentinel://` URL names."""

    sentinels: tuple[tuple[str, int], ...]
    master_name: str
    db: int
    tls: bool
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    #: The URL's query options (the ssl_* ones elector allows), applied to master and sentinels.
    options: tuple[tuple[str, str], ...] = ()


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def _address(text: str) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not host or (rest and not rest.startswith(":")):
            raise SentinelUrlError(f"bad sentinel address {text!r}")
        port_text = rest[1:]
    else:
        host, _, port_text = text.partition(":")
        if not host:
            raise SentinelUrlError("a sentinel address has no host")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise SentinelUrlError(f"sentinel {host!r} has an invalid port {port_text!r}")
    return host, int(port_text)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """The sentinels, master name, db and credentials of `url`; SentinelUrlError if malformed."""
    parsed = urllib.parse.urlsplit(url)
    scheme = parsed.scheme.lower()
    if scheme not in SENTINEL_SCHEMES:
        raise SentinelUrlError("not a redis+sentinel:// or rediss+sentinel:// URL")
    userinfo, at, hosts = parsed.netloc.rpartition("@")
    if not hosts:
        raise SentinelUrlError("no sentinel address (redis+sentinel://host1:26379,host2:26379/master)")
    addresses = tuple(_address(part.strip()) for part in hosts.split(","))
    if len(addresses) > MAX_SENTINELS:
        raise SentinelUrlError(f"more than {MAX_SENTINELS} sentinel addresses")
    if len(set(addresses)) != len(addresses):
        raise SentinelUrlError("a sentinel address is listed twice")
    parts = [urllib.parse.unquote(p) for p in parsed.path.split("/")[1:]]
    if not parts or not parts[0]:
        raise SentinelUrlError("no master name: end the URL with /<master-name> (e.g. /mymaster)")
    if len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise SentinelUrlError("the path must be /<master-name> or /<master-name>/<db number>")
    db = int(parts[1]) if len(parts) == 2 else 0
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(secret) if colon and secret else None
    options: list[tuple[str, str]] = []
    for key, values in urllib.parse.parse_qs(parsed.query, keep_blank_values=True).items():
        if key == "db":
            raise SentinelUrlError("give the db in the path (/<master-name>/<db>), not as ?db=")
        options.append((key, values[-1]))
    return SentinelTarget(
        sentinels=addresses,
        master_name=parts[0],
        db=db,
        tls=scheme == "rediss+sentinel",
        username=username,
        password=password,
        options=tuple(options),
    )


class SentinelMasterClient(redis.asyncio.Redis):
    """The client of the current master; closing it also closes its connections to the sentinels."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        pool = self.connection_pool
        if isinstance(pool, SentinelConnectionPool):
            await pool.sentinel_manager.aclose()


def make_sentinel_client(
    target: SentinelTarget, *, connection_kwargs: dict[str, Any], sentinel_kwargs: dict[str, Any]
) -> redis.asyncio.Redis:
    """A client of `target`'s master, built from elector's connection policy.

    `connection_kwargs` are the master's connection options (timeouts, retry, TLS files,
    credentials); `sentinel_kwargs` the sentinels' (the same without credentials or db).
    """
    manager = FollowingSentinel(  # type: ignore[no-untyped-call]
        list(target.sentinels), sentinel_kwargs=sentinel_kwargs, **connection_kwargs
    )
    client: redis.asyncio.Redis = manager.master_for(target.master_name, redis_class=SentinelMasterClient)
    return client
