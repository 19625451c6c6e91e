"""The protocol version of what elector writes to Redis, and the facts kept beside the lease.

Compatibility rule (docs/protocol.md has the whole of it): releases N and N+1 interoperate on
one lock with no safety loss. Protocol 1 is the release at cbaaac6; this code speaks protocol 2,
which changes no format protocol 1 reads. The new facts live where protocol 1 never looks:

- in the lease value, two fields protocol 1 ignores: `"v":2` and `"ttl_ms":<the holder's ttl>`;
- in a NEW hash of the same hash tag, `elector:{<lock>}:meta`:
      protocol      "2": the version of this hash and of the counter and registry beside it
      replid        the server's `master_replid` at the last grant (a promotion changes it)
      run_id        the server's `run_id` when the replid was recorded
      ttl_ms        the longest ttl a holder of the lock has used lately ...
      ttl_until_ms  ... and until when (server ms) that ttl still counts.

Data from a protocol this code does not know (a meta hash whose `protocol` is not "2", a lease
value whose `v` is not 1 or 2) is never deleted or overwritten: the lock counts as held, and
every attempt reports it as a DATA error naming the version, until someone upgrades.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

#: The protocol this code writes.
PROTOCOL = 2
#: Protocol versions whose lease values this code understands (1: no "v" field).
KNOWN_LEASE_VERSIONS = frozenset({1, 2})
#: How long a ttl seen in use is remembered after it was last seen, in multiples of that ttl.
#: A holder that renews keeps being seen by the contenders; one not seen for this long has lost
#: its belief in the lease long ago (it believes at most one ttl after its last renewal).
TTL_MEMORY_TTLS = 3
#: The longest ttl elector accepts (the --ttl limit): a ttl read from Redis is capped at it.
MAX_TTL_MS = 24 * 3600 * 1000
#: Stored values longer than this are not elector's: neither Python (codec.py) nor a script parses them.
MAX_VALUE_BYTES = 4096

#: Lua helpers for the meta hash (prepended to the scripts that use it; not a script).
#:
#: read_meta(key): nil when the hash is missing, else {protocol=, replid=, ttl=, ttl_until=, run_id=}
#:   (absent fields: false / 0). A key of another type raises WRONGTYPE: not elector's.
#: foreign_protocol(meta): the version text when the hash is not protocol 2's, else nil.
#: note_ttl(key, meta, ttl, now_ms): remember `ttl` as in use; a longer one still counting is
#:   kept, so a rolling ttl decrease does not shorten a quiet period while an old holder lives.
META_LIB = (
    f"local PROTOCOL = '{PROTOCOL}'\n"
    f"local TTL_MEMORY_TTLS = {TTL_MEMORY_TTLS}\n"
    f"local MAX_TTL_MS = {MAX_TTL_MS}\n"
    + """local function read_meta(key)
  if redis.call('EXISTS', key) == 0 then
    return nil
  end
  local f = redis.call('HMGET', key, 'protocol', 'replid', 'ttl_ms', 'ttl_until_ms', 'run_id')
  -- A ttl beyond elector's own limit was not written by elector: it must not stall the lock.
  local ttl = math.min(tonumber(f[3]) or 0, MAX_TTL_MS)
  return {protocol = f[1], replid = f[2], ttl = ttl, ttl_until = tonumber(f[4]) or 0, run_id = f[5]}
end
local function foreign_protocol(meta)
  if meta and meta.protocol ~= PROTOCOL then
    if type(meta.protocol) == 'string' then
      return string.sub(meta.protocol, 1, 40)
    end
    return '(none)'
  end
  return nil
end
local function note_ttl(key, meta, ttl, now_ms)
  local until_ms = now_ms + TTL_MEMORY_TTLS * ttl
  if not meta or ttl > meta.ttl or now_ms >= meta.ttl_until then
    redis.call('HSET', key, 'protocol', PROTOCOL, 'ttl_ms', string.format('%d', ttl),
      'ttl_until_ms', string.format('%d', until_ms))
  elseif ttl == meta.ttl and meta.ttl_until - now_ms < (TTL_MEMORY_TTLS - 1) * ttl then
    -- At most one write per ttl while the same ttl stays in use.
    redis.call('HSET', key, 'ttl_until_ms', string.format('%d', until_ms))
  end
end
"""
)


def lease_version(raw: bytes | str) -> int | str:
    """The protocol version of a stored lease value: 1 without a `v` field, else its `v`.

    Returns the raw text of a `v` that is not an integer (unknown by definition). A value that is
    not a JSON object is not elector's and reports version 1 (the caller's parser rejects it).
    """
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return 1
    if not isinstance(data, dict) or "v" not in data:
        return 1
    version = data["v"]
    if isinstance(version, int) and not isinstance(version, bool):
        return version
    return str(version)[:40]


def lease_ttl_ms(raw: bytes | str) -> int | None:
    """The holder's ttl written in a protocol-2 lease value, or None (protocol 1 has none)."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    ttl = data.get("ttl_ms") if isinstance(data, dict) else None
    if isinstance(ttl, int) and not isinstance(ttl, bool) and 0 < ttl <= 10**12:
        return ttl
    return None


def unknown_protocol_message(*, lock: str, where: str, version: object) -> str:
    return (
        f"the lock {lock!r} holds data from elector protocol {version} ({where}); this daemon "
        f"speaks protocol {PROTOCOL}: it leaves the data alone and treats the lock as held. "
        "Upgrade this daemon (or remove the other release's data by hand)"
    )


class TtlMemory:
    """The longest lease ttl this contender has seen in use on a lock, remembered in memory.

    An empty Redis restart loses every key, the stored longest ttl included; the contenders still
    know what they saw, and pass it to ACQUIRE so the quiet period covers the longest lease any
    holder may still believe in. A ttl is forgotten TTL_MEMORY_TTLS of itself after it was last
    seen, so a finished rolling ttl decrease stops costing longer quiet periods.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._ttl_ms = 0
        self._seen_at = 0.0

    def note(self, ttl_ms: int) -> None:
        now = self._clock()
        if ttl_ms >= self.longest_ms():
            self._ttl_ms, self._seen_at = ttl_ms, now

    def longest_ms(self) -> int:
        if self._ttl_ms and self._clock() - self._seen_at > TTL_MEMORY_TTLS * self._ttl_ms / 1000:
            self._ttl_ms = 0
        return self._ttl_ms
