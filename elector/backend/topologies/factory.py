"""The Redis side of a daemon, whatever the topology: clients, hubs, batchers, and a lease per lock.

Three shapes, chosen by `RedisSettings`:
- one server, or a Sentinel set (`redis+sentinel://`): one client, ONE pub/sub connection for every
  lock's announcements (`EventHub`), and a `ScriptBatcher` that pipelines calls falling due together;
- a Redis Cluster (`cluster=True`): a cluster client (each lock's scripts go to the master of its
  slot), one hub connection to the node named in the URL, a batcher that batches per hash slot;
- Redlock (`redlock_urls`): per server a client, a hub and a batcher, and per lock a
  `RedlockLeaseBackend` over that lock's backend on every server.

The daemon asks for `backend_for(lock)` and closes everything with `aclose()`; it never needs to
know which shape it runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable

import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from elector.backend.connection import RedisSettings, make_client, redact_url
from elector.backend.errors import translate_error
from elector.backend.pipeline import ScriptBatcher
from elector.backend.pubsub.hub import EventHub
from elector.backend.redis_lease import RedisLeaseBackend
from elector.backend.topologies.cluster import cluster_hub_client, cluster_lease_backend, make_cluster_client
from elector.backend.topologies.redlock import RedlockLeaseBackend
from elector.lease import LeaseBackend


@dataclasses.dataclass(slots=True)
class _Server:
    """One Redis endpoint's shared connections."""

    client: redis.asyncio.Redis
    hub: EventHub
    batcher: ScriptBatcher | None


class LeaseConnections:
    """Every connection a daemon holds to Redis, shared by all its locks."""

    def __init__(
        self,
        settings: RedisSettings,
        *,
        client_name: str,
        keepalive_s: float,
        request_timeout_s: float,
    ) -> None:
        settings.validate()
        self.settings = settings
        self._request_timeout_s = request_timeout_s
        self._cluster: RedisCluster | None = None
        self._cluster_batcher: ScriptBatcher | None = None
        self._servers: list[_Server] = []
        self._redlocks: list[RedlockLeaseBackend] = []

        def hub_of(client: redis.asyncio.Redis) -> EventHub:
            return EventHub(client, keepalive_s=keepalive_s, request_timeout_s=request_timeout_s)

        if settings.redlock_urls:
            for index, url in enumerate(settings.redlock_urls):
                client = make_client(settings.for_redlock_server(url), client_name=f"{client_name}:{index}")
                self._servers.append(_Server(client, hub_of(client), ScriptBatcher(client)))
        elif settings.cluster:
            self._cluster = make_cluster_client(settings, client_name=client_name)
            self._cluster_batcher = ScriptBatcher(self._cluster)  # per hash slot (cluster.py)
            hub_client = cluster_hub_client(settings, client_name=f"{client_name}:events")
            self._servers.append(_Server(hub_client, hub_of(hub_client), None))
        else:
            client = make_client(settings, client_name=client_name)
            self._servers.append(_Server(client, hub_of(client), ScriptBatcher(client)))

    @property
    def topology(self) -> str:
        """`redlock`, `cluster` or `standalone` (which includes Sentinel), for logs."""
        if self.settings.redlock_urls:
            return "redlock"
        return "cluster" if self.settings.cluster else "standalone"

    @property
    def endpoints(self) -> list[str]:
        """The URLs in use, passwords masked."""
        urls = self.settings.redlock_urls or (self.settings.url,)
        return [redact_url(url) for url in urls]

    @property
    def client(self) -> redis.asyncio.Redis:
        """The client of a single server or Sentinel set (e.g. to watch a Sentinel master)."""
        if self.settings.redlock_urls or self._cluster is not None:
            raise TypeError(f"a {self.topology} topology has no single client")
        return self._servers[0].client

    async def start(self) -> None:
        """Load a cluster's slot map before the locks' first requests race to do it.

        A failure is not fatal (the cluster client loads the map again on a later request, and
        the elections retry): it is raised as a LeaseBackendError for the caller to log.
        """
        if self._cluster is None:
            return
        try:
            await self._cluster.initialize()
        except Exception as exc:
            raise translate_error(exc, what="connect to the Redis Cluster") from exc

    def backend_for(self, lock: str) -> LeaseBackend:
        """The lease backend of `lock` on these connections."""
        settings = self.settings
        if self._cluster is not None:
            return cluster_lease_backend(
                self._cluster,
                lock=lock,
                key_prefix=settings.key_prefix,
                hub=self._servers[0].hub,
                batcher=self._cluster_batcher,
            )
        backends = [
            RedisLeaseBackend(
                server.client,
                lock=lock,
                key_prefix=settings.key_prefix,
                hub=server.hub,
                batcher=server.batcher,
                replica_ack=settings.replica_ack,
            )
            for server in self._servers
        ]
        if not settings.redlock_urls:
            return backends[0]
        redlock = RedlockLeaseBackend(backends, lock=lock, request_timeout_s=self._request_timeout_s)
        self._redlocks.append(redlock)
        return redlock

    async def aclose(self, *, within_s: float) -> None:
        """Close everything, each step bounded by `within_s` (a dead Redis must not hold us up)."""
        closers: list[Callable[[], Awaitable[None]]] = [redlock.aclose for redlock in self._redlocks]
        for server in self._servers:
            if server.batcher is not None:
                closers.append(server.batcher.aclose)
            closers += [server.hub.aclose, server.client.aclose]
        if self._cluster_batcher is not None:
            closers.append(self._cluster_batcher.aclose)
        if self._cluster is not None:
            closers.append(self._cluster.aclose)
        for close in closers:
            with contextlib.suppress(Exception, TimeoutError):
                async with asyncio.timeout(within_s):
                    await close()
