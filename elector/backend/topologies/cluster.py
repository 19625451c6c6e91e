"""Redis Cluster: the lease backend on a cluster client.

`RedisLeaseBackend` works unchanged on a `redis.asyncio.RedisCluster`: every key and the channel
of one lock share the hash tag `{<lock>}` (see `scripts.LockKeys`), so each script touches ONE
slot and redis-py routes its EVALSHA to the master serving that slot (no CROSSSLOT), and loads a
script on NOSCRIPT there. Different locks spread over the masters by their names.

Redirections. redis-py follows MOVED (slot moved for good: it patches its slot map) and ASK
(slot being migrated: ASKING + the command on the target) by itself, up to 16 hops, inside one
request; each hop is bounded by the request timeout and the election's own deadline bounds the
whole. Everything that still fails (TRYAGAIN during a migration, CLUSTERDOWN, a dead master
before its failover, a slot nobody serves) reaches the backend as an exception and becomes a
`LeaseBackendError`, like every other client failure: the election backs off and retries, and a
leader steps down at its renew deadline. The client's own retries are off (`Retry(NoBackoff(),
0)`), as for a standalone server: a retry loop must not eat the validity of a lease.

Announcements. The scripts PUBLISH on the lock's channel. In a cluster a classic PUBLISH is
forwarded over the cluster bus to every node, so a subscriber connected to ANY node hears every
lock; SPUBLISH (sharded, 7.0+) would spare that fan-out but redis 6.2 lacks it, and lease events
are rare (one per grant and release). So:
- without an `EventHub`, `RedisLeaseBackend.subscribe` opens redis-py's `ClusterPubSub`, which
  connects to the node serving the channel's slot, i.e. the lock's own master (after a failover
  the broken subscription is rebuilt by the election and follows the new slot map);
- with many locks, `cluster_hub_client` gives an `EventHub` a plain client of one node: ONE
  connection for every lock's announcements (the hub reconnects to that node only, so pick a
  node that stays; a lost subscription only slows takeovers to the PTTL-based wake-up).

Batching. With a `ScriptBatcher` of the cluster client, the calls that fall due together are
grouped per hash slot: the locks whose keys share a slot (a shared hash tag, or by chance) go in
ONE call of a batch script (lua/batch.py) to that slot's master; a lock alone in its slot is sent
as its own script call, as without a batcher. A script may only touch keys of one slot, so no
other grouping is safe; redis-py's cluster pipelines refuse EVALSHA, so commands of different
slots stay separate requests, sent at once.

Safety. Redis Cluster replicates asynchronously: a master that fails before its replica got a
grant loses it on failover (the quiet period of the ACQUIRE script - run_id changed - then stops
new grants for one ttl, exactly as for a standalone failover). Fencing tokens stay the protection.
"""

from __future__ import annotations

import urllib.parse
from typing import Any, cast

import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from elector.backend.connection import (
    InvalidRedisSettingsError,
    RedisSettings,
    client_policy,
    redact_url,
    tls_options,
    url_without_password,
)
from elector.backend.errors import translate_error
from elector.backend.pipeline import ScriptBatcher
from elector.backend.pubsub import LeaseEventSource
from elector.backend.redis_lease import RedisLeaseBackend

CLUSTER_SCHEMES = ("redis", "rediss")


def _check_cluster_url(url: str) -> urllib.parse.SplitResult:
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in CLUSTER_SCHEMES:
        raise InvalidRedisSettingsError(
            f"a Redis Cluster URL must start with redis:// or rediss:// (one node of the cluster), "
            f"got {redact_url(url)!r}"
        )
    db = parsed.path.strip("/")
    query_db = urllib.parse.parse_qs(parsed.query).get("db", ["0"])[-1]
    if db not in ("", "0") or query_db != "0":
        raise InvalidRedisSettingsError(
            f"Redis Cluster has only database 0; the URL names another: {redact_url(url)}"
        )
    return parsed


def _policy(settings: RedisSettings, client_name: str | None) -> dict[str, Any]:
    """The lease's client policy (connection.client_policy), TLS files and the password file's."""
    policy = {
        **client_policy(settings, client_name=client_name),
        **tls_options(settings),
        "decode_responses": False,
    }
    password = settings.read_password()
    if password is not None:
        policy["password"] = password
    return policy


def make_cluster_client(settings: RedisSettings, *, client_name: str | None = None) -> RedisCluster:
    """A RedisCluster client for the lease, from the URL of any one node of the cluster.

    Same policy as `make_client`: per-request timeouts, no retries of its own (MOVED/ASK
    redirections are still followed: they are one request's routing, not a retry), bytes replies.
    A partially served cluster is accepted (`require_full_coverage=False`): a lock needs only the
    master of its own slot.
    """
    settings.validate()
    _check_cluster_url(settings.url)
    policy = _policy(settings, client_name)
    url = url_without_password(settings.url) if "password" in policy else settings.url
    try:
        client = RedisCluster.from_url(url, require_full_coverage=False, **policy)
    except (ValueError, redis.exceptions.RedisError) as exc:
        raise InvalidRedisSettingsError(f"{exc} ({redact_url(settings.url)})") from None
    return client


def cluster_hub_client(settings: RedisSettings, *, client_name: str | None = None) -> redis.asyncio.Redis:
    """A plain client of the cluster node named by the settings' URL, for an `EventHub`.

    Classic PUBLISH reaches every node of a cluster, so one subscribed connection to one node
    carries every lock's announcements.
    """
    settings.validate()
    _check_cluster_url(settings.url)
    policy = _policy(settings, client_name)
    policy["retry_on_timeout"] = False
    url = url_without_password(settings.url) if "password" in policy else settings.url
    client: redis.asyncio.Redis = redis.asyncio.Redis.from_url(url, **policy)
    return client


def cluster_lease_backend(
    cluster: RedisCluster,
    *,
    lock: str,
    key_prefix: str = "elector",
    hub: LeaseEventSource | None = None,
    batcher: ScriptBatcher | None = None,
) -> RedisLeaseBackend:
    """The lease backend of one lock on a Redis Cluster; `batcher` (a `ScriptBatcher` of the same
    cluster client) batches the calls of the locks whose keys share a hash slot (module doc)."""
    # RedisLeaseBackend's client is typed as the standalone client, whose command surface the
    # cluster client offers too (scripts, pub/sub); it checks for RedisCluster where they differ.
    return RedisLeaseBackend(
        cast(redis.asyncio.Redis, cluster), lock=lock, key_prefix=key_prefix, hub=hub, batcher=batcher
    )


async def connect_cluster(settings: RedisSettings, *, client_name: str | None = None) -> RedisCluster:
    """`make_cluster_client`, then its slot map loaded before anyone uses it.

    redis-py loads the slot map lazily, on the first command; several first commands at once
    (every lock of a daemon acquiring at start-up) race in that load and fail with broken
    connections. Loaded here once, they do not. Raises LeaseBackendError when no node answers.
    """
    client = make_cluster_client(settings, client_name=client_name)
    try:
        await client.initialize()
    except Exception as exc:
        await client.aclose()
        raise translate_error(exc, what="connect to the Redis Cluster") from exc
    return client
