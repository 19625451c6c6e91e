"""The Lua helpers the lease scripts share: server time, the candidate registry, the handoff key.

Prepended to the scripts of scripts.py that use them (see there for the protocol itself).
"""

from __future__ import annotations

#: Most registered candidates per lock; beyond it new identities are simply not registered.
MAX_CANDIDATES = 1000
#: Most lapsed candidate entries one script call removes (bounded work per request).
PRUNE_LIMIT = 100
#: Longest handoff value parsed; anything longer is not elector's.
MAX_HANDOFF_BYTES = 4096

#: Lua helpers shared by the scripts of scripts.py (prepended to each that uses them; not a script).
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
LIB = (
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
