"""The Redis lease backend: the lease protocol's Lua scripts, client set-up and error translation."""

from elector.backend.connection import InvalidRedisSettingsError, RedisSettings, make_client, redact_url
from elector.backend.redis_lease import RedisEventSubscription, RedisLeaseBackend, parse_holder

__all__ = [
    "InvalidRedisSettingsError",
    "RedisEventSubscription",
    "RedisLeaseBackend",
    "RedisSettings",
    "make_client",
    "parse_holder",
    "redact_url",
]
