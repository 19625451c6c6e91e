"""The lease protocol as Lua scripts, one named constant each.

Keys of one lock share the Redis Cluster hash tag `{<lock>}` (see `LockKeys`), so every script
touches one slot. Scripts run atomically; redis-py sends them by EVALSHA and reloads them on
NOSCRIPT (after a Redis restart or SCRIPT FLUSH).

The stored lease value is JSON built inside the script:
    {"identity":"<holder>","fencing_token":<n>,"token":"<secret hex>"}
`identity` and `fencing_token` are for observers (`redis-cli GET`, `elector status`); the
`token` (128 random bits) makes the value unique to one grant, so that only the process that
was granted it can renew or release it. Owner checks compare the whole value.

Announcements on the lock's channel are JSON too, without the secret:
    {"event":"acquired"|"released","identity":"<holder>","fencing_token":<n>}
"""

from __future__ import annotations

#: Acquire: grant the lock if free, else say who holds it and for how long.
#:
#: KEYS[1] lease key, KEYS[2] fencing counter key, KEYS[3] quiet-period key, KEYS[4] server key
#: ARGV[1] identity, JSON-encoded (a JSON string literal, quotes included)
#: ARGV[2] secret owner token (hex, no quotes or backslashes)
#: ARGV[3] ttl in milliseconds (positive integer)
#: ARGV[4] the lock's announcement channel
#: Returns one of
#:   {1, fencing_token, value}   granted: the new lease value, expiring in ttl
#:   {0, holder_value, pttl}     held by someone else; pttl -1 when the key has no expiry
#:   {2, "", pttl}               quiet period: no grants for pttl ms
#:
#: A lease that already carries our owner token (an earlier attempt was applied but its answer
#: was lost to a timeout) is adopted: its TTL is replaced and it is returned as granted.
#:
#: Fencing token: max(previous + 1, Redis server time in ms). The counter never expires, so tokens
#: strictly increase across grants; if Redis loses it, server time (ahead of every earlier token)
#: keeps them increasing. The counter must be a plain integer below 10^15 (exact in Lua numbers).
#:
#: Quiet period: a lease granted before Redis restarted (empty, from an old snapshot, or a replica
#: promoted by a failover) may still be believed by its holder until its next renewal, while the
#: lease key itself is gone. So when the counter is missing, or the server's run_id differs from
#: the one recorded at the last grant, grants are refused for one ttl.
#: The announcement is best effort (pcall): a user without channel permissions still gets grants.
ACQUIRE = """
local ttl = tonumber(ARGV[3])
if not ttl or ttl <= 0 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR elector: ttl must be a positive integer of milliseconds')
end
local holder = redis.call('GET', KEYS[1])
if holder then
  if string.find(holder, '"token":"' .. ARGV[2] .. '"', 1, true) then
    redis.call('PEXPIRE', KEYS[1], ttl)
    local fencing = string.match(holder, '"fencing_token":(%d+)')
    return {1, tonumber(fencing), holder}
  end
  return {0, holder, redis.call('PTTL', KEYS[1])}
end
local quiet = redis.call('PTTL', KEYS[3])
if quiet > 0 then
  return {2, '', quiet}
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local run_id = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)') or ''
local last = redis.call('GET', KEYS[2])
if last and (not string.match(last, '^%d+$') or string.len(last) > 15) then
  return redis.error_reply('ERR elector: the fencing counter is not an integer below 10^15')
end
if not last or redis.call('GET', KEYS[4]) ~= run_id then
  if not last then
    redis.call('SET', KEYS[2], string.format('%d', now_ms))
  end
  redis.call('SET', KEYS[4], run_id)
  redis.call('SET', KEYS[3], string.format('%d', now_ms), 'PX', ttl)
  return {2, '', ttl}
end
local token = string.format('%d', math.max(tonumber(last) + 1, now_ms))
redis.call('SET', KEYS[2], token)
local value = '{"identity":' .. ARGV[1] .. ',"fencing_token":' .. token .. ',"token":"' .. ARGV[2] .. '"}'
redis.call('SET', KEYS[1], value, 'PX', ttl)
redis.pcall('PUBLISH', ARGV[4],
  '{"event":"acquired","identity":' .. ARGV[1] .. ',"fencing_token":' .. token .. '}')
return {1, tonumber(token), value}
"""

#: Renew: replace the TTL, only while the key still holds our value.
#:
#: KEYS[1] lease key
#: ARGV[1] our lease value, ARGV[2] ttl in milliseconds (positive integer)
#: Returns {1} renewed, or {0, current_value_or_empty, pttl} lost.
#: A missing key is never re-created (that would hide the window in which the lock was free),
#: and the TTL is replaced, never added to.
RENEW = """
local ttl = tonumber(ARGV[2])
if not ttl or ttl <= 0 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR elector: ttl must be a positive integer of milliseconds')
end
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1}
end
if not current then
  return {0, '', -2}
end
return {0, current, redis.call('PTTL', KEYS[1])}
"""

#: Release: delete the key only while it holds our value, and announce it.
#:
#: KEYS[1] lease key
#: ARGV[1] our lease value, ARGV[2] the lock's announcement channel, ARGV[3] the message
#: Returns 1 released, 0 not ours (already expired or taken). The announcement is best effort.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.pcall('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
"""

#: Observe: read the lock without contending.
#:
#: KEYS[1] lease key, KEYS[2] fencing counter key, KEYS[3] quiet-period key
#: Returns {value_or_empty, pttl, counter_or_empty, quiet_pttl}
OBSERVE = """
local value = redis.call('GET', KEYS[1]) or ''
local counter = redis.call('GET', KEYS[2]) or ''
return {value, redis.call('PTTL', KEYS[1]), counter, redis.call('PTTL', KEYS[3])}
"""


class LockKeys:
    """Names of the keys and the channel of one lock, all under one hash tag."""

    __slots__ = ("channel", "fencing", "lease", "quiet", "server")

    def __init__(self, lock: str, *, prefix: str = "elector") -> None:
        tag = "{" + lock + "}"
        self.lease = f"{prefix}:{tag}:lease"
        self.fencing = f"{prefix}:{tag}:fencing"
        self.quiet = f"{prefix}:{tag}:quiet"
        #: The run_id of the Redis server that made the last grant (a restart changes it).
        self.server = f"{prefix}:{tag}:server"
        self.channel = f"{prefix}:{tag}:events"
