"""Fenced writes on redis-py's sync client: `elector.sync.FencedStore` (see elector.library.fencing)."""

from __future__ import annotations

import redis
import redis.asyncio
import redis.exceptions
from redis.commands.core import Script

from elector.library.fencing import (
    FENCED_DELETE,
    FENCED_SET,
    RAISE_FENCE,
    FencedStoreBase,
    FencedWriteResult,
    accepted_or_raise,
    fence_value,
    script_error,
    write_result,
    wrongtype_error,
)


class FencedStore(FencedStoreBase):
    """`elector.FencedStore` on a sync `redis.Redis` or `redis.RedisCluster` the caller owns.

    The same methods and errors, not awaited; safe to share between threads as redis-py's
    client is.
    """

    _CLIENTS = (redis.Redis, redis.RedisCluster)
    _CLIENT_NAMES = "redis.Redis or redis.RedisCluster"
    _OTHER_KIND = ((redis.asyncio.Redis, redis.asyncio.RedisCluster), "elector.FencedStore")

    def __init__(self, client: redis.Redis | redis.RedisCluster, *, fence_key_suffix: str = ":fence") -> None:
        super().__init__(client, fence_key_suffix=fence_key_suffix)
        self._client = client
        self._set = client.register_script(FENCED_SET)
        self._delete = client.register_script(FENCED_DELETE)
        self._raise_fence = client.register_script(RAISE_FENCE)

    def set(
        self, key: str, value: str | bytes, *, fencing_token: int, ttl_ms: int | None = None
    ) -> FencedWriteResult:
        """SET `key` to `value` unless a higher token than `fencing_token` was accepted for it."""
        fence_key, args = self._set_args(key, value, fencing_token=fencing_token, ttl_ms=ttl_ms)
        return write_result(self._run(self._set, key=key, fence_key=fence_key, args=args))

    def delete(self, key: str, *, fencing_token: int) -> FencedWriteResult:
        """DEL `key` unless a higher token than `fencing_token` was accepted for it."""
        fence_key, args = self._token_args(key, fencing_token=fencing_token)
        return write_result(self._run(self._delete, key=key, fence_key=fence_key, args=args))

    def raise_fence(self, key: str, *, fencing_token: int) -> FencedWriteResult:
        """Raise `key`'s fence to `fencing_token` without touching its value."""
        fence_key, args = self._token_args(key, fencing_token=fencing_token)
        return write_result(self._run(self._raise_fence, key=key, fence_key=fence_key, args=args))

    def set_or_raise(
        self, key: str, value: str | bytes, *, fencing_token: int, ttl_ms: int | None = None
    ) -> FencedWriteResult:
        """`set`, raising StaleFencingTokenError if the write was rejected."""
        result = self.set(key, value, fencing_token=fencing_token, ttl_ms=ttl_ms)
        return accepted_or_raise(result, key=key, token=fencing_token)

    def delete_or_raise(self, key: str, *, fencing_token: int) -> FencedWriteResult:
        """`delete`, raising StaleFencingTokenError if the delete was rejected."""
        result = self.delete(key, fencing_token=fencing_token)
        return accepted_or_raise(result, key=key, token=fencing_token)

    def highest_token(self, key: str) -> int | None:
        """The highest token accepted for `key`, or None (a plain read: observe, do not decide)."""
        fence_key = self.fence_key(key)
        try:
            raw: str | bytes | None = self._client.get(fence_key)
        except redis.exceptions.ResponseError as exc:
            raise wrongtype_error(exc, key=key, fence_key=fence_key) from exc
        return fence_value(raw, key=key, fence_key=fence_key)

    def _run(self, script: Script, *, key: str, fence_key: str, args: list[str | bytes]) -> list[int]:
        try:
            reply: list[int] = script(keys=[key, fence_key], args=args)
        except redis.exceptions.ResponseError as exc:
            raise script_error(exc, key=key, fence_key=fence_key) from exc
        return reply
