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
A release that starts a handoff adds `"to":"<target>"`; `elector handoff` publishes
    {"event":"handoff","identity":"<holder>","fencing_token":<n>,"to":"<target>"|null}

Candidates (replicas contending for the lock, with a priority) are a hash
    identity -> {"priority":<n>,"seen_ms":<server time of the last refresh>}
plus a sorted set identity -> expiry (server ms). Every acquire attempt and every renewal
refreshes the caller's entry in the same script (no extra round trip); entries lapse after
3 ttl. Each script that touches the registry first removes at most PRUNE_LIMIT lapsed entries
(bounded work per call), and new identities are not registered beyond MAX_CANDIDATES (grants
still work). Registry writes are best effort (pcall): a registry key of the wrong type, written
by someone else, must never block an election.

A handoff in progress is the string key
    {"from":"<holder>","to":"<target>"|null}   with PX = the window
While it lasts nobody named `from` is granted the lock, and when `to` is set nobody else is.
A handoff key that is unparsable, of another type, or without an expiry is ignored.
"""

from __future__ import annotations

#: Most registered candidates per lock; beyond it new identities are simply not registered.
MAX_CANDIDATES = 1000
#: Most lapsed candidate entries one script call removes (bounded work per request).
PRUNE_LIMIT = 100
#: Longest handoff value parsed; anything longer is not elector's.
MAX_HANDOFF_BYTES = 4096

#: Lua helpers shared by the scripts below (prepended to each that uses them; not a script).
#:
#: server_ms(): Redis server time in ms (one clock for every replica's entries).
#: prune(entries, expiry, now_ms): drop at most PRUNE_LIMIT lapsed candidates.
#: register(entries, expiry, identity, priority, now_ms, lapse_ms): prune, then refresh the entry
#:   (a new identity only while fewer than MAX_CANDIDATES are registered).
#: live(entries, expiry, now_ms): {{identity, priority, seen_ms}, ...} of unexpired, parsable
#:   entries (at most MAX_CANDIDATES); foreign or garbage entries are skipped.
#: read_handoff(key): {from=, to=, pttl=} of the handoff in progress, or nil when there is none
#:   or the key is garbage / of another type / without expiry (so it can never block grants).
#: handoff_json(from, to): the normalised handoff value (valid JSON whatever the input was).
#: decode_identity(json): the identity from its JSON string literal, or nil.
_LIB = (
    f"local MAX_CANDIDATES, PRUNE_LIMIT = {MAX_CANDIDATES}, {PRUNE_LIMIT}\n"
    f"local MAX_HANDOFF_BYTES = {MAX_HANDOFF_BYTES}\n"
    + """local function server_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
local function prune(entries, expiry, now_ms)
  local gone = redis.call('ZRANGEBYSCORE', expiry, '-inf', string.format('%d', now_ms),
    'LIMIT', 0, PRUNE_LIMIT)
  if #gone > 0 then
    redis.call('HDEL', entries, unpack(gone))
    redis.call('ZREM', expiry, unpack(gone))
  end
end
local function register(entries, expiry, identity, priority, now_ms, lapse_ms)
  prune(entries, expiry, now_ms)
  if redis.call('ZSCORE', expiry, identity) or redis.call('ZCARD', expiry) < MAX_CANDIDATES then
    redis.call('HSET', entries, identity,
      string.format('{"priority":%d,"seen_ms":%d}', priority, now_ms))
    redis.call('ZADD', expiry, string.format('%d', now_ms + lapse_ms), identity)
  end
end
local function live(entries, expiry, now_ms)
  local ids = redis.call('ZRANGEBYSCORE', expiry, '(' .. string.format('%d', now_ms), '+inf',
    'LIMIT', 0, MAX_CANDIDATES)
  local found = {}
  if #ids == 0 then
    return found
  end
  local raws = redis.call('HMGET', entries, unpack(ids))
  for i, id in ipairs(ids) do
    local raw = raws[i]
    if type(raw) == 'string' then
      local priority, seen = string.match(raw, '^{"priority":(%-?%d+),"seen_ms":(%d+)}$')
      if priority and string.len(priority) <= 12 and string.len(seen) <= 15 then
        found[#found + 1] = {id, tonumber(priority), tonumber(seen)}
      end
    end
  end
  return found
end
local function decode_identity(text)
  local ok, identity = pcall(cjson.decode, text)
  if ok and type(identity) == 'string' then
    return identity
  end
  return nil
end
local function read_handoff(key)
  local raw = redis.pcall('GET', key)
  if type(raw) ~= 'string' or string.len(raw) > MAX_HANDOFF_BYTES then
    return nil
  end
  local ok, h = pcall(cjson.decode, raw)
  if not ok or type(h) ~= 'table' or type(h['from']) ~= 'string' then
    return nil
  end
  local to = h['to']
  if to == cjson.null then
    to = nil
  elseif to ~= nil and type(to) ~= 'string' then
    return nil
  end
  local pttl = redis.call('PTTL', key)
  if pttl <= 0 then
    return nil
  end
  return {from = h['from'], to = to, pttl = pttl}
end
local function handoff_json(from, to)
  local target = 'null'
  if to then
    target = cjson.encode(to)
  end
  return '{"from":' .. cjson.encode(from) .. ',"to":' .. target .. '}'
end
"""
)

#: Acquire: grant the lock if free, else say who holds it and for how long.
#:
#: KEYS[1] lease key, KEYS[2] fencing counter key, KEYS[3] quiet-period key, KEYS[4] server key,
#: KEYS[5] candidates hash, KEYS[6] candidate expiry zset, KEYS[7] handoff key
#: ARGV[1] identity, JSON-encoded (a JSON string literal, quotes included)
#: ARGV[2] secret owner token (hex, no quotes or backslashes)
#: ARGV[3] ttl in milliseconds (positive integer)
#: ARGV[4] the lock's announcement channel
#: ARGV[5] the candidate's priority (integer, |priority| <= 10^9)
#: Returns one of
#:   {1, fencing_token, value}   granted: the new lease value, expiring in ttl
#:   {0, holder_value, pttl}     held by someone else; pttl -1 when the key has no expiry
#:   {2, "", pttl}               quiet period: no grants for pttl ms
#:   {3, handoff_json, pttl}     stand back: a handoff (normalised JSON, see above) excludes us
#:                               for pttl ms
#:
#: Every call first refreshes the caller's candidate entry (lapsing after 3 ttl).
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
#:
#: Handoff: checked after the quiet period (a restarted server's stale handoff must not shorten
#: it), before a grant of the free lock. `from` is refused, and when `to` is set, so is everyone
#: but `to`. The grant that ends a handoff (to `to`, or with `to` null to anyone but `from`)
#: deletes the handoff key.
ACQUIRE = (
    _LIB
    + """
local ttl = tonumber(ARGV[3])
if not ttl or ttl <= 0 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR elector: ttl must be a positive integer of milliseconds')
end
local priority = tonumber(ARGV[5])
if not priority or priority ~= math.floor(priority) or math.abs(priority) > 1e9 then
  return redis.error_reply('ERR elector: priority must be an integer between -10^9 and 10^9')
end
local me = decode_identity(ARGV[1])
if not me then
  return redis.error_reply('ERR elector: identity must be a JSON string')
end
local now_ms = server_ms()
pcall(register, KEYS[5], KEYS[6], me, priority, now_ms, 3 * ttl)
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
local handoff = read_handoff(KEYS[7])
if handoff and (me == handoff.from or (handoff.to and me ~= handoff.to)) then
  return {3, handoff_json(handoff.from, handoff.to), handoff.pttl}
end
local token = string.format('%d', math.max(tonumber(last) + 1, now_ms))
redis.call('SET', KEYS[2], token)
local value = '{"identity":' .. ARGV[1] .. ',"fencing_token":' .. token .. ',"token":"' .. ARGV[2] .. '"}'
redis.call('SET', KEYS[1], value, 'PX', ttl)
if handoff then
  redis.call('DEL', KEYS[7])
end
redis.pcall('PUBLISH', ARGV[4],
  '{"event":"acquired","identity":' .. ARGV[1] .. ',"fencing_token":' .. token .. '}')
return {1, tonumber(token), value}
"""
)

#: Renew: replace the TTL, only while the key still holds our value.
#:
#: KEYS[1] lease key, KEYS[2] candidates hash, KEYS[3] candidate expiry zset, KEYS[4] handoff key
#: ARGV[1] our lease value, ARGV[2] ttl in milliseconds (positive integer),
#: ARGV[3] our identity, JSON-encoded, ARGV[4] our priority (integer, |priority| <= 10^9)
#: Returns
#:   {1, handoff_json_or_empty, handoff_pttl, rival_identity_or_empty, rival_priority,
#:    rival_seen_ms_ago}                        renewed
#:   {0, current_value_or_empty, pttl}          lost
#: A missing key is never re-created (that would hide the window in which the lock was free),
#: and the TTL is replaced, never added to.
#: Every call refreshes our candidate entry. The handoff is reported only when its `from` is us
#: (a stale one naming an earlier holder is not ours to act on). The rival is the live candidate
#: other than us with the highest priority; ties go to the greatest identity (byte order).
RENEW = (
    _LIB
    + """
local ttl = tonumber(ARGV[2])
if not ttl or ttl <= 0 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR elector: ttl must be a positive integer of milliseconds')
end
local priority = tonumber(ARGV[4])
if not priority or priority ~= math.floor(priority) or math.abs(priority) > 1e9 then
  return redis.error_reply('ERR elector: priority must be an integer between -10^9 and 10^9')
end
local me = decode_identity(ARGV[3])
if not me then
  return redis.error_reply('ERR elector: identity must be a JSON string')
end
local now_ms = server_ms()
pcall(register, KEYS[2], KEYS[3], me, priority, now_ms, 3 * ttl)
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ttl)
  local reply = {1, '', 0, '', 0, 0}
  local handoff = read_handoff(KEYS[4])
  if handoff and handoff.from == me then
    reply[2], reply[3] = handoff_json(handoff.from, handoff.to), handoff.pttl
  end
  local ok, found = pcall(live, KEYS[2], KEYS[3], now_ms)
  if ok then
    local best = nil
    for _, c in ipairs(found) do
      if c[1] ~= me and (not best or c[2] > best[2] or (c[2] == best[2] and c[1] > best[1])) then
        best = c
      end
    end
    if best then
      reply[4], reply[5], reply[6] = best[1], best[2], math.max(0, now_ms - best[3])
    end
  end
  return reply
end
if not current then
  return {0, '', -2}
end
return {0, current, redis.call('PTTL', KEYS[1])}
"""
)

#: Release: delete the key only while it holds our value, and announce it.
#:
#: KEYS[1] lease key, KEYS[2] handoff key
#: ARGV[1] our lease value, ARGV[2] the lock's announcement channel, ARGV[3] the message,
#: ARGV[4] the handoff value to start ("" for a plain release), ARGV[5] its window in ms
#: Returns 1 released, 0 not ours (already expired or taken). The announcement is best effort.
#: A handoff is started in the same step as the delete, so no other candidate can slip in
#: between the lock becoming free and the handoff excluding it.
RELEASE = """
if ARGV[4] ~= '' then
  local window = tonumber(ARGV[5])
  if not window or window <= 0 or window ~= math.floor(window) then
    return redis.error_reply('ERR elector: the handoff window must be a positive integer of ms')
  end
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[4] ~= '' then
    redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[5])
  end
  redis.pcall('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
"""

#: Withdraw: remove a candidate's entry (a replica shutting down).
#:
#: KEYS[1] candidates hash, KEYS[2] candidate expiry zset
#: ARGV[1] the identity, JSON-encoded
#: Returns 1 when an entry was removed, 0 when there was none.
WITHDRAW = (
    _LIB
    + """
local me = decode_identity(ARGV[1])
if not me then
  return redis.error_reply('ERR elector: identity must be a JSON string')
end
local removed = redis.call('HDEL', KEYS[1], me)
redis.call('ZREM', KEYS[2], me)
return removed
"""
)

#: Request a handoff: ask the current holder to hand the lease over (`elector handoff`).
#:
#: KEYS[1] lease key, KEYS[2] handoff key
#: ARGV[1] the target, JSON-encoded, or null for "anyone but the holder"
#: ARGV[2] the window in ms (positive integer), ARGV[3] the lock's announcement channel
#: Returns one of
#:   {1, handoff_json, window}   started: the handoff key is set and the holder was told
#:   {0, "", 0}                  nothing to hand off: no holder (or a value elector did not write)
#:   {2, holder_identity, 0}     refused: the target already holds the lock
#: The announcement {"event":"handoff","identity":<holder>,"fencing_token":<n>,"to":<target>}
#: wakes the holder at once; it also finds the request at its next renewal (messages can be lost).
#: A lease value over 4096 bytes (MAX_VALUE_BYTES of redis_lease.py) is not elector's: not parsed.
REQUEST_HANDOFF = (
    _LIB
    + """
local window = tonumber(ARGV[2])
if not window or window <= 0 or window ~= math.floor(window) then
  return redis.error_reply('ERR elector: the handoff window must be a positive integer of ms')
end
local to = nil
if ARGV[1] ~= 'null' then
  to = decode_identity(ARGV[1])
  if not to then
    return redis.error_reply('ERR elector: the handoff target must be a JSON string or null')
  end
end
local value = redis.call('GET', KEYS[1])
if not value or string.len(value) > 4096 then
  return {0, '', 0}
end
local ok, lease = pcall(cjson.decode, value)
if not ok or type(lease) ~= 'table' or type(lease['identity']) ~= 'string'
    or type(lease['fencing_token']) ~= 'number' then
  return {0, '', 0}
end
local from = lease['identity']
if to == from then
  return {2, from, 0}
end
local handoff = handoff_json(from, to)
redis.call('SET', KEYS[2], handoff, 'PX', window)
local target = 'null'
if to then
  target = cjson.encode(to)
end
redis.pcall('PUBLISH', ARGV[3], '{"event":"handoff","identity":' .. cjson.encode(from)
  .. ',"fencing_token":' .. string.format('%d', lease['fencing_token']) .. ',"to":' .. target .. '}')
return {1, handoff, window}
"""
)

#: Candidates: the live registered candidates of a lock, read without contending.
#:
#: KEYS[1] candidates hash, KEYS[2] candidate expiry zset
#: Returns {identity_1, priority_1, seen_ms_ago_1, identity_2, ...} (unordered; garbage entries
#: are left out). Pruning is best effort, so a read-only user or replica can still list them.
CANDIDATES = (
    _LIB
    + """
local now_ms = server_ms()
pcall(prune, KEYS[1], KEYS[2], now_ms)
local ok, found = pcall(live, KEYS[1], KEYS[2], now_ms)
if not ok then
  return redis.error_reply('ERR elector: the candidate registry ' .. KEYS[1] .. ' / ' .. KEYS[2]
    .. ' is not a hash and a sorted set: something other than elector wrote it; delete them')
end
local reply = {}
for _, c in ipairs(found) do
  reply[#reply + 1] = c[1]
  reply[#reply + 1] = c[2]
  reply[#reply + 1] = math.max(0, now_ms - c[3])
end
return reply
"""
)

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

    __slots__ = (
        "candidate_expiry",
        "candidates",
        "channel",
        "fencing",
        "handoff",
        "lease",
        "quiet",
        "server",
    )

    def __init__(self, lock: str, *, prefix: str = "elector") -> None:
        tag = "{" + lock + "}"
        self.lease = f"{prefix}:{tag}:lease"
        self.fencing = f"{prefix}:{tag}:fencing"
        self.quiet = f"{prefix}:{tag}:quiet"
        #: The run_id of the Redis server that made the last grant (a restart changes it).
        self.server = f"{prefix}:{tag}:server"
        self.channel = f"{prefix}:{tag}:events"
        #: Registered candidates: identity -> {"priority":n,"seen_ms":t} (a hash) ...
        self.candidates = f"{prefix}:{tag}:candidates"
        #: ... and identity -> expiry in server ms (a sorted set), for lapsing and pruning.
        self.candidate_expiry = f"{prefix}:{tag}:candidates:expiry"
        #: The handoff in progress, {"from":..,"to":..} with PX = its window.
        self.handoff = f"{prefix}:{tag}:handoff"


#: Redlock confirm: make this server's part of a majority grant carry the grant's fencing token.
#:
#: KEYS[1] lease key, KEYS[2] fencing counter key
#: ARGV[1] this server's lease value from its ACQUIRE (owner check)
#: ARGV[2] the grant's fencing token T (the highest any server of the majority issued; < 10^15)
#: ARGV[3] the holder's identity, JSON-encoded, ARGV[4] the grant's secret owner token (hex)
#: ARGV[5] the lock's announcement channel
#: Returns {1, value} confirmed: the counter is at least T and the key holds `value` (same expiry)
#:         {0, ""}    the key no longer holds ARGV[1] (expired, released, replaced): not confirmed
#: Raising the counter is what keeps Redlock's tokens increasing: every later majority shares a
#: server with this one, and that server now issues tokens above T. The value is rewritten to
#: {"identity":..,"fencing_token":T,"token":<grant owner>} so every server of the majority holds
#: the same value (one owner check for renew and release, one holder for observers). The expiry is
#: kept (PX of the remaining PTTL: KEEPTTL would need 6.0+ and says the same).
REDLOCK_CONFIRM = """
local token = ARGV[2]
if not string.match(token, '^%d+$') or string.len(token) > 15 then
  return redis.error_reply('ERR elector: the fencing token must be an integer below 10^15')
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, ''}
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl <= 0 then
  return {0, ''}
end
local last = redis.call('GET', KEYS[2])
if last and (not string.match(last, '^%d+$') or string.len(last) > 15) then
  return redis.error_reply('ERR elector: the fencing counter is not an integer below 10^15')
end
if not last or tonumber(last) < tonumber(token) then
  redis.call('SET', KEYS[2], token)
end
local value = '{"identity":' .. ARGV[3] .. ',"fencing_token":' .. token .. ',"token":"' .. ARGV[4] .. '"}'
redis.call('SET', KEYS[1], value, 'PX', pttl)
redis.pcall('PUBLISH', ARGV[5],
  '{"event":"acquired","identity":' .. ARGV[3] .. ',"fencing_token":' .. token .. '}')
return {1, value}
"""

#: Redlock abandon: drop this server's part of a grant that did not win a majority, silently.
#:
#: KEYS[1] lease key
#: ARGV[1] the lease value to drop (owner check)
#: Returns 1 deleted, 0 not ours.
#: No announcement, unlike RELEASE: after a split vote the contenders back off for a random time,
#: and a "released" message would wake them all at once into the next split vote.
REDLOCK_ABANDON = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""
