"""The Lua helpers the lease scripts share: server time, the candidate registry, the handoff key.

Prepended to the scripts of lease.py and batch.py that use them (see there for the protocol itself).
"""

from __future__ import annotations

#: Most registered candidates per lock; beyond it new identities are simply not registered.
MAX_CANDIDATES = 1000
#: Most lapsed candidate entries one script call removes (bounded work per request).
PRUNE_LIMIT = 100
#: Longest handoff value parsed; anything longer is not elector's.
MAX_HANDOFF_BYTES = 4096
#: Longest instance nonce (hex digits) the scripts take or read back (see lease.py).
MAX_NONCE_DIGITS = 64

#: Lua helpers shared by the scripts of lease.py and batch.py (prepended to each that uses them;
#: not a script).
#:
#: server_ms(): Redis server time in ms (one clock for every replica's entries).
#: prune(entries, expiry, now_ms, instances): drop at most PRUNE_LIMIT lapsed candidates (and
#:   their instance nonces, when the instances hash is given; best effort).
#: register(entries, expiry, identity, priority, now_ms, lapse_ms, instances): prune, then refresh
#:   the entry (a new identity only while fewer than MAX_CANDIDATES are registered).
#: instance_clash(instances, expiry, identity, nonce, now_ms): (1 when the identity's entry is
#:   live and was last registered by another instance, another nonce, else 0; the nonce recorded
#:   for the live entry, or nil); called before register. No nonce (an older caller), no recorded
#:   nonce (an older daemon's entry), a garbage one or a key of another type: 0, never an error.
#: note_instance(instances, expiry, identity, nonce, recorded): record `nonce` as the instance
#:   that last registered the identity, unless the live entry's recorded nonce is already ours
#:   (the steady state: no write); only when the identity is registered; best effort. A hash
#:   holding more than PRUNE_LIMIT nonces beyond the registered entries (left by older daemons,
#:   whose prune does not know it) is reset first, so its size stays bounded.
#: live(entries, expiry, now_ms): {{identity, priority, seen_ms}, ...} of unexpired, parsable
#:   entries (at most MAX_CANDIDATES); foreign or garbage entries are skipped.
#: read_handoff(key): {from=, to=, pttl=} of the handoff in progress, or nil when there is none
#:   or the key is garbage / of another type / without expiry (so it can never block grants).
#: handoff_json(from, to): the normalised handoff value (valid JSON whatever the input was).
#: decode_identity(json): the identity from its JSON string literal, or nil.
LIB = (
    f"local MAX_CANDIDATES, PRUNE_LIMIT = {MAX_CANDIDATES}, {PRUNE_LIMIT}\n"
    f"local MAX_HANDOFF_BYTES, MAX_NONCE_DIGITS = {MAX_HANDOFF_BYTES}, {MAX_NONCE_DIGITS}\n"
    + """local function server_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end
local function prune(entries, expiry, now_ms, instances)
  local gone = redis.call('ZRANGEBYSCORE', expiry, '-inf', string.format('%d', now_ms),
    'LIMIT', 0, PRUNE_LIMIT)
  if #gone > 0 then
    redis.call('HDEL', entries, unpack(gone))
    redis.call('ZREM', expiry, unpack(gone))
    if instances then
      redis.pcall('HDEL', instances, unpack(gone))
    end
  end
end
local function register(entries, expiry, identity, priority, now_ms, lapse_ms, instances)
  prune(entries, expiry, now_ms, instances)
  if redis.call('ZSCORE', expiry, identity) or redis.call('ZCARD', expiry) < MAX_CANDIDATES then
    redis.call('HSET', entries, identity,
      string.format('{"priority":%d,"seen_ms":%d}', priority, now_ms))
    redis.call('ZADD', expiry, string.format('%d', now_ms + lapse_ms), identity)
  end
end
local function read_instance(instances, expiry, identity, now_ms)
  local until_ms = tonumber(redis.call('ZSCORE', expiry, identity))
  local stored = redis.call('HGET', instances, identity)
  if type(stored) ~= 'string' then
    stored = nil
  end
  return stored, until_ms ~= nil and until_ms > now_ms
end
local function instance_clash(instances, expiry, identity, nonce, now_ms)
  if not nonce then
    return 0, nil
  end
  local ok, stored, alive = pcall(read_instance, instances, expiry, identity, now_ms)
  if not ok or not alive then
    return 0, nil
  end
  if stored and stored ~= nonce and string.len(stored) <= MAX_NONCE_DIGITS
      and string.match(stored, '^%x+$') then
    return 1, stored
  end
  return 0, stored
end
local function write_instance(instances, expiry, identity, nonce)
  if not redis.call('ZSCORE', expiry, identity) then
    return
  end
  if redis.call('HLEN', instances) > redis.call('ZCARD', expiry) + PRUNE_LIMIT then
    redis.call('DEL', instances)
  end
  redis.call('HSET', instances, identity, nonce)
end
local function note_instance(instances, expiry, identity, nonce, stored)
  if nonce and stored ~= nonce then
    pcall(write_instance, instances, expiry, identity, nonce)
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

#: Lua helpers of the two scripts a contender calls with its ttl, priority and identity (ACQUIRE,
#: RENEW): read_caller(ttl, priority, identity) checks the three arguments and returns
#: {ttl=, priority=, me=}, or nil and the error reply to return; read_nonce(nonce, instances_key)
#: returns the instance nonce (nil when none was given), or nil and the error reply (prepended
#: after LIB, whose decode_identity and MAX_NONCE_DIGITS it uses; not a script).
CALLER_LIB = """local function read_caller(ttl_arg, priority_arg, identity_arg)
  local ttl = tonumber(ttl_arg)
  if not ttl or ttl <= 0 or ttl ~= math.floor(ttl) then
    return nil, redis.error_reply('ERR elector: ttl must be a positive integer of milliseconds')
  end
  local priority = tonumber(priority_arg)
  if not priority or priority ~= math.floor(priority) or math.abs(priority) > 1e9 then
    return nil, redis.error_reply('ERR elector: priority must be an integer between -10^9 and 10^9')
  end
  local me = decode_identity(identity_arg)
  if not me then
    return nil, redis.error_reply('ERR elector: identity must be a JSON string')
  end
  return {ttl = ttl, priority = priority, me = me}
end
local function read_nonce(nonce_arg, instances_key)
  if not nonce_arg or nonce_arg == '' then
    return nil
  end
  if not instances_key or string.len(nonce_arg) > MAX_NONCE_DIGITS
      or not string.match(nonce_arg, '^%x+$') then
    return nil, redis.error_reply('ERR elector: the instance nonce must be hex digits (at most '
      .. MAX_NONCE_DIGITS .. '), with the instances key')
  end
  return nonce_arg
end
"""
