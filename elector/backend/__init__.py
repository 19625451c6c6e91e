"""The Redis lease backend: the lease protocol's Lua scripts, client set-up and error translation."""

from elector.backend.candidates import HandoffRefusedError
from elector.backend.codec import parse_holder
from elector.backend.connection import InvalidRedisSettingsError, RedisSettings, make_client, redact_url
from elector.backend.pubsub.subscriptions import RedisEventSubscription
from elector.backend.redis_lease import RedisLeaseBackend
from elector.backend.topologies.cluster import (
    cluster_hub_client,
    cluster_lease_backend,
    connect_cluster,
    make_cluster_client,
)
from elector.backend.topologies.redlock import RedlockLeaseBackend

__all__ = [
    "HandoffRefusedError",
    "InvalidRedisSettingsError",
    "RedisEventSubscription",
    "RedisLeaseBackend",
    "RedisSettings",
    "RedlockLeaseBackend",
    "cluster_hub_client",
    "cluster_lease_backend",
    "connect_cluster",
    "make_client",
    "make_cluster_client",
    "parse_holder",
    "redact_url",
]
