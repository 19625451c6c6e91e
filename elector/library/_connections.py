"""The library's own connections to the lease's Redis (from a URL), opened as the daemon opens them.

`elector.Elector` and `elector.watch` both open them here: one way to start them, to report a
Redis that does not answer yet (the caller retries), and to leave nothing open when cancelled.
"""

from __future__ import annotations

import logging

import redis.asyncio as aioredis

from elector.backend import RedisLeaseBackend, RedisSettings
from elector.backend.topologies.factory import LeaseConnections
from elector.backend.topologies.sentinel_watch import (
    SentinelMasterWatcher,
    default_poll_interval_s,
    watch_master,
)
from elector.election import ElectionTiming
from elector.lease import LeaseBackend, LeaseBackendError

logger = logging.getLogger("elector.api")


async def open_connections(
    settings: RedisSettings, *, client_name: str, timing: ElectionTiming, who: str, then: str
) -> LeaseConnections:
    """Connections for `settings`, started: a cluster's slot map is read before the first request.

    Redis unreachable: a WARNING ("<who>: <error> (<then>)") and the connections, for the
    caller's retries. Cancelled (or any other exception): closed, then it propagates."""
    connections = LeaseConnections(
        settings,
        client_name=client_name,
        keepalive_s=max(60.0, 6 * timing.ttl_s),  # the election's own default
        request_timeout_s=timing.request_timeout_s,
    )
    try:
        await connections.start()
    except LeaseBackendError as exc:
        logger.warning("%s: %s (%s)", who, exc, then)
    except BaseException:
        await connections.aclose(within_s=timing.request_timeout_s)
        raise
    return connections


async def connect_lease(
    settings: RedisSettings | None,
    client: aioredis.Redis | None,
    *,
    lock: str,
    identity: str,
    key_prefix: str,
    timing: ElectionTiming,
) -> tuple[LeaseBackend, LeaseConnections | None, SentinelMasterWatcher | None]:
    """An Elector's backend for its lock: on the caller's `client`, or on connections of our own
    (returned, to be closed); and, for a client of a redis+sentinel:// URL built by elector (ours,
    or the caller's from make_client), a watcher (not started) that follows a new master at once."""
    connections = None
    if settings is None:
        assert client is not None
        backend: LeaseBackend = RedisLeaseBackend(client, lock=lock, key_prefix=key_prefix)
    else:
        connections = await open_connections(
            settings,
            client_name=f"elector:{lock}:{identity}",
            timing=timing,
            who=f"lock {lock!r}",
            then="the election retries",
        )
        # One server or a Sentinel set has a single client (a Sentinel master is watched).
        client = connections.client if connections.topology == "standalone" else None
        backend = connections.backend_for(lock)
    watcher = None
    if client is not None:
        watcher = watch_master(
            client,
            poll_interval_s=default_poll_interval_s(timing.renew_interval_s),
            request_timeout_s=timing.request_timeout_s,
        )
    return backend, connections, watcher
