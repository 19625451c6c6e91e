"""The Redis lease backend: the lease protocol's Lua scripts, client set-up and error translation."""

from elector.backend.connection import InvalidRedisSettingsError, RedisSettings, make_client, redact_url
from elector.backend.redis_lease import RedisEventSubscription, RedisLeaseBackend, parse_holder
from elector.backend.registry import HandoffRefusedError

__all__ = [
    "HandoffRefusedError",
    "InvalidRedisSettingsError",
    "RedisEventSubscription",
    "RedisLeaseBackend",
    "RedisSettings",
    "make_client",
    "parse_holder",
    "redact_url",
]
