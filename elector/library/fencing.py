"""Fenced writes for resources kept in Redis: reject writes from a leader that was replaced.

A leader may be paused (GC, a stopped VM, a slow disk) past the end of its lease, while another
process is elected and starts working. When the old leader resumes it still believes it leads,
and its next write would overwrite the new leader's work. Every grant of the lease carries a
fencing token that increases per lock (strictly while Redis keeps the lock's counter; after
the counter is lost, only if the server's clock is ahead of every earlier token: see
docs/fencing.md); a resource that remembers the highest token it has accepted can reject the
writes of any earlier leader, however late they arrive.

`FencedStore` does that for string values kept in Redis, on the user's own
`redis.asyncio.Redis` (or `RedisCluster`) client, whatever its `decode_responses` setting
(`elector.sync.FencedStore`: the same on redis-py's sync `redis.Redis`/`RedisCluster`):

    store = FencedStore(client)
    result = await store.set("{jobs}:report", data, fencing_token=lease.fencing_token)
    if not result.accepted:
        ...  # a newer leader has written: stop working, we are not the leader any more

Design:

- Each resource key `K` has a fence key `K + fence_key_suffix` (default ``K:fence``) holding the
  highest token accepted for `K`, as a decimal integer. One Lua script compares the token with
  the fence and, if it is not lower, writes the value and raises the fence, atomically. A token
  EQUAL to the fence is accepted: one leader writes many times with the same token.
- The fence only moves when a leader writes: until the new leader's first write, the old one's
  writes still succeed. `raise_fence` lets a new leader shut its predecessor out as it starts.
- The fence key never expires and survives `delete`. A fence that expired with its value would
  let a stale leader re-create the value after the new leader's copy expired or was deleted,
  and readers would take the stale copy for current. The cost is one small key per resource key
  ever fenced; to retire a resource for good, delete both keys once no old leader can still be
  running (longer than any pause you are willing to assume).
- Redis Cluster: a script may only touch keys of one slot. The fence key is the resource key
  plus a suffix, so a key with a hash tag (``{jobs}:report`` -> ``{jobs}:report:fence``) puts
  both in the tag's slot. A key without a tag hashes as a whole and its fence lands in another
  slot: on a cluster client such keys are refused with a ValueError before anything is sent.
  On a standalone server any key works.
- Tokens of different locks are not comparable: fence each resource with the tokens of ONE lock.
- The value and its fence are written by one script, so replication, AOF and snapshots carry
  both or neither.
- A fence key that holds anything other than a token (another program wrote it, or a different
  type) raises `CorruptFenceKeyError`: guessing would silently accept or reject writes.

Errors: arguments are checked before any request (ValueError). Everything else redis-py raises
(ConnectionError, TimeoutError, AuthenticationError, NoPermissionError, ...) propagates as-is;
this helper runs inside the user's code, on the user's client and its retry policy. A write
whose answer was lost (timeout) may or may not have been applied: the fence makes repeating it
with the same token safe.
"""

from __future__ import annotations

import dataclasses
import re

import redis
import redis.asyncio
import redis.exceptions
from redis.commands.core import AsyncScript
from redis.crc import key_slot

#: Tokens are below 10^15: exact in the doubles Lua uses for numbers (and in JSON everywhere).
MAX_FENCING_TOKEN = 10**15 - 1
_TOKEN_RE = re.compile(r"[0-9]{1,15}")
#: Marks our scripts' reports of a corrupt fence key, to tell them from any other error reply.
_CORRUPT_MARK = "elector-fence-corrupt:"

#: The check every script starts with (not a script by itself).
#:
#: KEYS[2] the fence key, ARGV[1] the fencing token (decimal, at most 15 digits).
#: Returns {0, fence} from the script when fence > token: rejected, nothing changed. Otherwise
#: falls through with `token` set. A fence that is not a string holding a decimal integer below
#: 10^15 is an error reply marked "elector-fence-corrupt:", never read as some number.
_CHECK_FENCE = """
local token = ARGV[1]
if not string.match(token, '^%d+$') or string.len(token) > 15 then
  return redis.error_reply('ERR elector-fence: the fencing token must be an integer below 10^15')
end
local fence = redis.pcall('GET', KEYS[2])
if type(fence) == 'table' then
  return redis.error_reply('ERR elector-fence-corrupt: is not a string')
end
if fence then
  if not string.match(fence, '^%d+$') or string.len(fence) > 15 then
    return redis.error_reply('ERR elector-fence-corrupt: does not hold an integer below 10^15')
  end
  if tonumber(fence) > tonumber(token) then
    return {0, tonumber(fence)}
  end
end
"""

#: Fenced SET: write the value unless a higher token has been accepted for the key.
#:
#: KEYS[1] resource key, KEYS[2] its fence key (same slot)
#: ARGV[1] fencing token (decimal, at most 15 digits)
#: ARGV[2] the value
#: ARGV[3] ttl in milliseconds (positive integer), or "" for no expiry (as a plain SET, this
#:         also clears an expiry the key had)
#: Returns {1, token} written, the fence now at token (it was lower, equal or missing),
#:      or {0, fence} rejected: fence > token, nothing changed.
#: The fence key is SET without an expiry (which also clears one someone else put on it).
FENCED_SET = (
    _CHECK_FENCE
    + """
if ARGV[3] == '' then
  redis.call('SET', KEYS[1], ARGV[2])
else
  local ttl = tonumber(ARGV[3])
  if not ttl or ttl <= 0 or ttl ~= math.floor(ttl) then
    return redis.error_reply('ERR elector-fence: ttl must be a positive integer of milliseconds')
  end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)
end
redis.call('SET', KEYS[2], token)
return {1, tonumber(token)}
"""
)

#: Fenced DEL: delete the key unless a higher token has been accepted for it.
#:
#: KEYS[1] resource key, KEYS[2] its fence key (same slot)
#: ARGV[1] fencing token (decimal, at most 15 digits)
#: Returns {1, token} accepted (also when the key did not exist), the fence now at token,
#:      or {0, fence} rejected: fence > token, nothing changed.
#: The fence is kept (and raised): a stale leader must not re-create what the leader deleted.
FENCED_DELETE = (
    _CHECK_FENCE
    + """
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], token)
return {1, tonumber(token)}
"""
)

#: Raise the fence alone: claim the key for a token without writing its value.
#:
#: KEYS[1] resource key (not touched: passed so that all the scripts take the same keys),
#: KEYS[2] its fence key (same slot)
#: ARGV[1] fencing token (decimal, at most 15 digits)
#: Returns {1, token} accepted, the fence now at token (it was lower, equal or missing),
#:      or {0, fence} rejected: fence > token, nothing changed.
RAISE_FENCE = (
    _CHECK_FENCE
    + """
redis.call('SET', KEYS[2], token)
return {1, tonumber(token)}
"""
)


class FencingError(Exception):
    """Base of the errors `FencedStore` raises itself (redis-py's own errors are not wrapped)."""


class StaleFencingTokenError(FencingError):
    """A write was rejected: the resource has accepted a higher fencing token.

    The writer has been replaced as leader (possibly long ago, if it was paused): it must stop
    its leader work, not retry.
    """

    def __init__(self, *, key: str, token: int, highest_seen: int) -> None:
        super().__init__(
            f"fencing token {token} is stale for {key!r}: it has accepted token {highest_seen} "
            "from a newer leader"
        )
        self.key = key
        self.token = token
        self.highest_seen = highest_seen


class CorruptFenceKeyError(FencingError):
    """The fence key holds something other than a fencing token; no write was made.

    Something other than `FencedStore` wrote it. Set it to a token at least as high as the last
    one issued for the lock (e.g. its `elector:{<lock>}:fencing` counter) rather than deleting
    it: without a fence, a stale leader's next write would be accepted.
    """

    def __init__(self, *, key: str, fence_key: str, detail: str) -> None:
        super().__init__(
            f"fence key {fence_key!r} of {key!r} {detail}: something other than elector's "
            "FencedStore wrote it"
        )
        self.key = key
        self.fence_key = fence_key


@dataclasses.dataclass(frozen=True, slots=True)
class FencedWriteResult:
    """The outcome of one fenced write."""

    #: True: the write was applied; False: a higher token had been accepted, nothing changed.
    accepted: bool
    #: The highest token the resource has accepted, after this request.
    highest_token: int


def check_fencing_token(token: int) -> int:
    """`token` if it is a valid fencing token (an int in 0 .. 10^15 - 1), else ValueError."""
    # bool is an int subclass; True as a token is a bug at the call site, not token 1.
    if not isinstance(token, int) or isinstance(token, bool):
        raise ValueError(f"fencing_token must be an int, got {type(token).__name__}")
    if not 0 <= token <= MAX_FENCING_TOKEN:
        raise ValueError(f"fencing_token must be in 0 .. 10^15 - 1, got {token}")
    return token


def _parse_fence(raw: str | bytes, *, key: str, fence_key: str) -> int:
    text = raw.decode("ascii", errors="replace") if isinstance(raw, bytes) else raw
    if not _TOKEN_RE.fullmatch(text):
        raise CorruptFenceKeyError(
            key=key, fence_key=fence_key, detail="does not hold an integer below 10^15"
        )
    return int(text)


class FencedStoreBase:
    """What the async and the sync store share: the checks, the scripts' arguments and replies.

    Subclasses only send the requests, on their kind of client.
    """

    #: The client classes a subclass works with, and the store that takes the other kind.
    _CLIENTS: tuple[type, ...] = ()
    _CLIENT_NAMES = ""
    _OTHER_KIND: tuple[tuple[type, ...], str] = ((), "")

    def __init__(self, client: object, *, fence_key_suffix: str = ":fence") -> None:
        if not isinstance(client, self._CLIENTS):
            other_clients, other_store = self._OTHER_KIND
            hint = (
                f"; for a {type(client).__module__}.{type(client).__name__} use {other_store}"
                if isinstance(client, other_clients)
                else ""
            )
            raise TypeError(
                f"{type(self).__module__}.{type(self).__name__} needs a {self._CLIENT_NAMES} client, "
                f"got {type(client).__name__}{hint}"
            )
        if not fence_key_suffix:
            raise ValueError("fence_key_suffix must not be empty: the fence key would be the key itself")
        if "{" in fence_key_suffix or "}" in fence_key_suffix:
            # A brace could complete or start a hash tag and move the fence to another slot.
            raise ValueError(f"fence_key_suffix must not contain braces, got {fence_key_suffix!r}")
        self._suffix = fence_key_suffix
        self._cluster = isinstance(client, redis.asyncio.RedisCluster | redis.RedisCluster)

    def fence_key(self, key: str) -> str:
        """The name of the key holding `key`'s highest accepted token."""
        if not isinstance(key, str) or not key:
            raise ValueError(f"key must be a non-empty str, got {key!r}")
        fence_key = key + self._suffix
        if self._cluster and key_slot(key.encode()) != key_slot(fence_key.encode()):
            raise ValueError(
                f"key {key!r} and its fence key {fence_key!r} map to different Redis Cluster slots: "
                "give the key a hash tag, e.g. '{jobs}:report', so that both share its slot"
            )
        return fence_key

    def _set_args(
        self, key: str, value: str | bytes, *, fencing_token: int, ttl_ms: int | None
    ) -> tuple[str, list[str | bytes]]:
        """(fence key, ARGV) of FENCED_SET, all checked."""
        token = check_fencing_token(fencing_token)
        if not isinstance(value, str | bytes):
            raise ValueError(f"value must be str or bytes, got {type(value).__name__}")
        if ttl_ms is not None and (not isinstance(ttl_ms, int) or isinstance(ttl_ms, bool) or ttl_ms <= 0):
            raise ValueError(f"ttl_ms must be a positive int or None, got {ttl_ms!r}")
        return self.fence_key(key), [str(token), value, "" if ttl_ms is None else str(ttl_ms)]

    def _token_args(self, key: str, *, fencing_token: int) -> tuple[str, list[str | bytes]]:
        """(fence key, ARGV) of FENCED_DELETE and RAISE_FENCE, checked."""
        token = check_fencing_token(fencing_token)
        return self.fence_key(key), [str(token)]


def write_result(reply: list[int]) -> FencedWriteResult:
    return FencedWriteResult(accepted=int(reply[0]) == 1, highest_token=int(reply[1]))


def script_error(exc: redis.exceptions.ResponseError, *, key: str, fence_key: str) -> Exception:
    """Our scripts' report of a corrupt fence as CorruptFenceKeyError; any other error as it is."""
    text = str(exc)
    if _CORRUPT_MARK in text:
        detail = text[text.index(_CORRUPT_MARK) + len(_CORRUPT_MARK) :].strip()
        return CorruptFenceKeyError(key=key, fence_key=fence_key, detail=detail)
    return exc


def fence_value(raw: str | bytes | None, *, key: str, fence_key: str) -> int | None:
    return None if raw is None else _parse_fence(raw, key=key, fence_key=fence_key)


def wrongtype_error(exc: redis.exceptions.ResponseError, *, key: str, fence_key: str) -> Exception:
    if "WRONGTYPE" in str(exc):
        return CorruptFenceKeyError(key=key, fence_key=fence_key, detail="is not a string")
    return exc


class FencedStore(FencedStoreBase):
    """Fenced writes of string values in Redis, on an asyncio client the caller owns (and closes).

    The same store may be shared by any number of tasks and keys; it holds no state per key.
    For redis-py's sync client, use `elector.sync.FencedStore` (same methods, not awaited).
    """

    _CLIENTS = (redis.asyncio.Redis, redis.asyncio.RedisCluster)
    _CLIENT_NAMES = "redis.asyncio.Redis or redis.asyncio.RedisCluster"
    _OTHER_KIND = ((redis.Redis, redis.RedisCluster), "elector.sync.FencedStore")

    def __init__(
        self,
        client: redis.asyncio.Redis | redis.asyncio.RedisCluster,
        *,
        fence_key_suffix: str = ":fence",
    ) -> None:
        super().__init__(client, fence_key_suffix=fence_key_suffix)
        self._client = client
        self._set = client.register_script(FENCED_SET)
        self._delete = client.register_script(FENCED_DELETE)
        self._raise_fence = client.register_script(RAISE_FENCE)

    async def set(
        self, key: str, value: str | bytes, *, fencing_token: int, ttl_ms: int | None = None
    ) -> FencedWriteResult:
        """SET `key` to `value` unless a higher token than `fencing_token` was accepted for it.

        `ttl_ms`: the value's time to live; None for no expiry (like SET, this clears an expiry
        the key had). The fence key never expires (see the module docstring).
        """
        fence_key, args = self._set_args(key, value, fencing_token=fencing_token, ttl_ms=ttl_ms)
        return write_result(await self._run(self._set, key=key, fence_key=fence_key, args=args))

    async def delete(self, key: str, *, fencing_token: int) -> FencedWriteResult:
        """DEL `key` unless a higher token than `fencing_token` was accepted for it.

        Accepted also when the key did not exist; the fence is kept and raised to the token.
        """
        fence_key, args = self._token_args(key, fencing_token=fencing_token)
        return write_result(await self._run(self._delete, key=key, fence_key=fence_key, args=args))

    async def raise_fence(self, key: str, *, fencing_token: int) -> FencedWriteResult:
        """Raise `key`'s fence to `fencing_token` without touching its value.

        Until a new leader's first fenced write, its predecessor's writes are still accepted;
        a leader that must shut its predecessor out at once calls this when it takes over.
        """
        fence_key, args = self._token_args(key, fencing_token=fencing_token)
        return write_result(await self._run(self._raise_fence, key=key, fence_key=fence_key, args=args))

    async def set_or_raise(
        self, key: str, value: str | bytes, *, fencing_token: int, ttl_ms: int | None = None
    ) -> FencedWriteResult:
        """`set`, raising StaleFencingTokenError if the write was rejected."""
        result = await self.set(key, value, fencing_token=fencing_token, ttl_ms=ttl_ms)
        return accepted_or_raise(result, key=key, token=fencing_token)

    async def delete_or_raise(self, key: str, *, fencing_token: int) -> FencedWriteResult:
        """`delete`, raising StaleFencingTokenError if the delete was rejected."""
        result = await self.delete(key, fencing_token=fencing_token)
        return accepted_or_raise(result, key=key, token=fencing_token)

    async def highest_token(self, key: str) -> int | None:
        """The highest token accepted for `key`, or None if it was never written through a fence.

        A plain read: by the time it returns, a newer leader may have raised the fence. Use it to
        observe, not to decide whether to write (the write itself is the check).
        """
        fence_key = self.fence_key(key)
        try:
            raw: str | bytes | None = await self._client.get(fence_key)
        except redis.exceptions.ResponseError as exc:
            raise wrongtype_error(exc, key=key, fence_key=fence_key) from exc
        return fence_value(raw, key=key, fence_key=fence_key)

    async def _run(
        self,
        script: AsyncScript,
        *,
        key: str,
        fence_key: str,
        args: list[str | bytes],
    ) -> list[int]:
        try:
            reply: list[int] = await script(keys=[key, fence_key], args=args)
        except redis.exceptions.ResponseError as exc:
            raise script_error(exc, key=key, fence_key=fence_key) from exc
        return reply


def accepted_or_raise(result: FencedWriteResult, *, key: str, token: int) -> FencedWriteResult:
    if not result.accepted:
        raise StaleFencingTokenError(key=key, token=token, highest_seen=result.highest_token)
    return result
