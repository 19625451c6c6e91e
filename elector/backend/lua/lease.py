"""The lease protocol as Lua scripts, one named constant each.

Keys of one lock share the Redis Cluster hash tag `{<lock>}` (see `LockKeys`), so every script
touches one slot. Scripts run atomically; redis-py sends them by EVALSHA and reloads them on
NOSCRIPT (after a Redis restart or SCRIPT FLUSH).

The stored lease value is JSON built inside the script:
    {"identity":"<holder>","fencing_token":<n>,"token":"<secret hex>","v":2,"ttl_ms":<ttl>}
`identity` and `fencing_token` are for observers (`redis-cli GET`, `elector status`); the
`token` (128 random bits) makes the value unique to one grant, so that only the process that
was granted it can renew or release it. Owner checks compare the whole value. `v` (the protocol
version) and `ttl_ms` (the holder's ttl) came with protocol 2: protocol 1 (cbaaac6) wrote the
first three fields only and ignores the others (see protocol.py and docs/protocol.md).

Announcements on the lock's channel are JSON too, without the secret:
    {"event":"acquired"|"released","identity":"<holder>","fencing_token":<n>}
A release that starts a handoff adds `"to":"<target>"`; `elector handoff` publishes
    {"event":"handoff","identity":"<holder>","fencing_token":<n>,"to":"<target>"|null}

Candidates (replicas contending for the lock, with a priority) are a hash
    identity -> {"priority":<n>,"seen_ms":<server time of the last refresh>}
plus a sorted set identity -> expiry (server ms), plus a hash identity -> the nonce (hex) of the
instance (one Elector, one lock election of a daemon) that registered it last: a registration
that finds its identity's live entry registered by another nonce answers a clash (two live
processes report one identity). Older daemons neither write nor read the instances hash, and the
entries hash keeps its exact format (their strict pattern still matches). Every acquire
attempt and every renewal refreshes the caller's entry in the same script (no extra round
trip); entries lapse after 3 ttl. Each script that touches the registry first removes at
most PRUNE_LIMIT lapsed entries (bounded work per call), and new identities are not registered
beyond MAX_CANDIDATES (grants still work). Registry writes are best effort (pcall): a registry
key of the wrong type, written by someone else, must never block an election.

A handoff in progress is the string key
    {"from":"<holder>","to":"<target>"|null}   with PX = the window
While it lasts nobody named `from` is granted the lock, and when `to` is set nobody else is.
A handoff key that is unparsable, of another type, or without an expiry is ignored.
"""

from __future__ import annotations

from elector.backend import protocol
from elector.backend.lua.common import CALLER_LIB as _CALLER_LIB
from elector.backend.lua.common import LIB as _LIB
from elector.backend.lua.common import MAX_CANDIDATES, MAX_HANDOFF_BYTES, PRUNE_LIMIT
from elector.backend.lua.lost_data import DATA_LIB

__all__ = [
    "ACQUIRE",
    "CANDIDATES",
    "MAX_CANDIDATES",
    "MAX_HANDOFF_BYTES",
    "OBSERVE",
    "PRUNE_LIMIT",
    "RELEASE",
    "RENEW",
    "REQUEST_HANDOFF",
    "WITHDRAW",
    "LockKeys",
]

#: Acquire: grant the lock if free, else say who holds it and for how long.
#:
#: KEYS[1] lease key, KEYS[2] fencing counter key, KEYS[3] quiet-period key, KEYS[4] server key,
#: KEYS[5] candidates hash, KEYS[6] candidate expiry zset, KEYS[7] handoff key, KEYS[8] meta hash,
#: KEYS[9] (optional) candidate instances hash
#: ARGV[1] identity, JSON-encoded (a JSON string literal, quotes included)
#: ARGV[2] secret owner token (hex, no quotes or backslashes)
#: ARGV[3] ttl in milliseconds (positive integer)
#: ARGV[4] the lock's announcement channel
#: ARGV[5] the candidate's priority (integer, |priority| <= 10^9)
#: ARGV[6] the longest ttl (ms) this contender has seen in use on the lock, 0 for none
#: ARGV[7] the highest fencing token this contender has observed, 0 for none (< 10^15)
#: ARGV[8] (optional, with KEYS[9]) this instance's nonce (hex), "" or absent for none
#: Returns one of
#:   {1, fencing_token, value, clash}   granted: the new lease value, expiring in ttl
#:   {0, holder_value, pttl, clash}     held by someone else; pttl -1 when the key has no expiry
#:   {2, "", pttl, clash}               quiet period: no grants for pttl ms
#:   {3, handoff_json, pttl, clash}     stand back: a handoff (normalised JSON, see above)
#:                                      excludes us for pttl ms
#:   {4, version, -1}                   the meta hash is from a protocol this script does not
#:                                      speak: nothing was written (the caller treats the lock as held)
#: `clash` (1 or 0; appended last, so the elements before it are where they were) is 1 when our
#: identity's live candidate entry was last registered by another instance (another nonce):
#: two live processes report one identity. Always 0 without a nonce.
#:
#: Every other call first refreshes the caller's candidate entry (lapsing after 3 ttl), and
#: with a nonce records it as the instance that registered the identity last.
#:
#: A lease that already carries our owner token (an earlier attempt was applied but its answer
#: was lost to a timeout) is adopted: its TTL is replaced and it is returned as granted.
#:
#: Fencing token: max(previous + 1, Redis server time in ms, ARGV[7] + 1). The counter never
#: expires, so while it survives tokens strictly increase across grants. When Redis loses it,
#: the next token is above every earlier one only if the server's clock (ms since the epoch) is
#: ahead of every token issued before, or the contender saw a token at least as high: tokens
#: issued from the clock are only as monotonic as the servers' clocks (docs/fencing.md). The
#: counter must be a plain integer below 10^15 (exact in Lua numbers).
#:
#: Quiet period: a lease granted before Redis lost data (an empty restart, an old snapshot, a
#: replica promoted by a failover or a failback) may still be believed by its holder while the
#: lease key itself is gone. So grants are refused when the counter is missing, the server's
#: run_id differs from the one recorded at the last grant, or its master_replid (changed by every
#: promotion) differs from the one in the meta hash. The quiet period lasts the longest of: our
#: ttl, the longest ttl this contender saw in use (ARGV[6]), and the longest ttl recorded in the
#: meta hash; a contender that saw a longer ttl than the one a quiet period was started with
#: stretches it. A replid change is not counted when protocol 1 has served the quiet period for
#: this promotion (this server was promoted out of the recorded stream, and protocol 1 recorded
#: its run_id since; see docs/protocol.md): one quiet period per loss in a mixed fleet. When the
#: meta hash names no stream (protocol 1 alone used the lock since the hash was lost), the server
#: key is trusted only on a server never promoted since its start (no master_replid2); a held
#: or quiet answer then records the stream (note_stream), so later promotions are seen.
#: The announcement is best effort (pcall): a user without channel permissions still gets grants.
#:
#: Handoff: checked after the quiet period (a restarted server's stale handoff must not shorten
#: it), before a grant of the free lock. `from` is refused, and when `to` is set, so is everyone
#: but `to`. The grant that ends a handoff (to `to`, or with `to` null to anyone but `from`)
#: deletes the handoff key.
ACQUIRE = (
    _LIB
    + protocol.META_LIB
    + _CALLER_LIB
    + DATA_LIB
    + """
local caller, refusal = read_caller(ARGV[3], ARGV[5], ARGV[1])
if not caller then
  return refusal
end
local ttl, priority, me = caller.ttl, caller.priority, caller.me
local nonce, bad_nonce = read_nonce(ARGV[8], KEYS[9])
if bad_nonce then
  return bad_nonce
end
local seen_ttl = tonumber(ARGV[6] or '0')
if not seen_ttl or seen_ttl < 0 or seen_ttl ~= math.floor(seen_ttl) or seen_ttl > 1e12 then
  return redis.error_reply('ERR elector: the longest ttl seen must be a non-negative integer of ms')
end
local seen_token = ARGV[7] or '0'
if not string.match(seen_token, '^%d+$') or string.len(seen_token) > 15 then
  return redis.error_reply('ERR elector: the highest token seen must be an integer below 10^15')
end
seen_token = tonumber(seen_token)
local meta = read_meta(KEYS[8])
local foreign = foreign_protocol(meta)
if foreign then
  return {4, foreign, -1}
end
local now_ms = server_ms()
local clash, recorded = instance_clash(KEYS[9], KEYS[6], me, nonce, now_ms)
pcall(register, KEYS[5], KEYS[6], me, priority, now_ms, 3 * ttl, KEYS[9])
note_instance(KEYS[9], KEYS[6], me, nonce, recorded)
local holder = redis.call('GET', KEYS[1])
if holder then
  if string.find(holder, '"token":"' .. ARGV[2] .. '"', 1, true) then
    redis.call('PEXPIRE', KEYS[1], ttl)
    local fencing = string.match(holder, '"fencing_token":(%d+)')
    return {1, tonumber(fencing), holder, clash}
  end
  note_stream(meta)
  return {0, holder, redis.call('PTTL', KEYS[1]), clash}
end
local quiet = redis.call('PTTL', KEYS[3])
if quiet > 0 then
  note_stream(meta)
  -- Started by a contender that knew a shorter ttl (or by protocol 1): one that saw a longer
  -- ttl in use, or the meta hash's record of one, stretches it (the value is the start, in
  -- server ms, in both protocols).
  local longest = seen_ttl
  if meta then
    longest = math.max(longest, meta.ttl)
  end
  local started = tonumber(redis.call('GET', KEYS[3]))
  if started and longest > 0 and started + longest - now_ms > quiet then
    quiet = started + longest - now_ms
    redis.call('PEXPIRE', KEYS[3], quiet)
  end
  return {2, '', quiet, clash}
end
local data = check_data(meta)
local run_id, replid, last, lost = data.run_id, data.replid, data.last, data.lost
if last and (not string.match(last, '^%d+$') or string.len(last) > 15) then
  return redis.error_reply('ERR elector: the fencing counter is not an integer below 10^15')
end
if lost then
  local quiet_ms = math.max(ttl, seen_ttl)
  if meta then
    quiet_ms = math.max(quiet_ms, meta.ttl)
  end
  if not last then
    redis.call('SET', KEYS[2], string.format('%d', math.max(now_ms, seen_token)))
  end
  redis.call('SET', KEYS[4], run_id)
  redis.call('HSET', KEYS[8], 'protocol', PROTOCOL, 'replid', replid, 'run_id', run_id)
  note_ttl(KEYS[8], read_meta(KEYS[8]), quiet_ms, now_ms)
  redis.call('SET', KEYS[3], string.format('%d', now_ms), 'PX', quiet_ms)
  return {2, '', quiet_ms, clash}
end
local handoff = read_handoff(KEYS[7])
if handoff and (me == handoff.from or (handoff.to and me ~= handoff.to)) then
  return {3, handoff_json(handoff.from, handoff.to), handoff.pttl, clash}
end
local token = string.format('%d', math.max(tonumber(last) + 1, now_ms, seen_token + 1))
redis.call('SET', KEYS[2], token)
local value = '{"identity":' .. ARGV[1] .. ',"fencing_token":' .. token .. ',"token":"' .. ARGV[2]
  .. '","v":' .. PROTOCOL .. ',"ttl_ms":' .. string.format('%d', ttl) .. '}'
redis.call('SET', KEYS[1], value, 'PX', ttl)
if handoff then
  redis.call('DEL', KEYS[7])
end
if not meta or meta.replid ~= replid or meta.run_id ~= run_id then
  redis.call('HSET', KEYS[8], 'protocol', PROTOCOL, 'replid', replid, 'run_id', run_id)
end
note_ttl(KEYS[8], meta, ttl, now_ms)
redis.pcall('PUBLISH', ARGV[4],
  '{"event":"acquired","identity":' .. ARGV[1] .. ',"fencing_token":' .. token .. '}')
return {1, tonumber(token), value, clash}
"""
)

#: Renew: replace the TTL, only while the key still holds our value.
#:
#: KEYS[1] lease key, KEYS[2] candidates hash, KEYS[3] candidate expiry zset, KEYS[4] handoff key,
#: KEYS[5] meta hash, KEYS[6] (optional) candidate instances hash
#: ARGV[1] our lease value, ARGV[2] ttl in milliseconds (positive integer),
#: ARGV[3] our identity, JSON-encoded, ARGV[4] our priority (integer, |priority| <= 10^9)
#: ARGV[5] (optional, with KEYS[6]) this instance's nonce (hex), "" or absent for none
#: Returns
#:   {1, handoff_json_or_empty, handoff_pttl, rival_identity_or_empty, rival_priority,
#:    rival_seen_ms_ago, clash}                 renewed
#:   {0, current_value_or_empty, pttl, clash}   lost
#: `clash` as in ACQUIRE (appended last: the elements before it are unchanged).
#: A missing key is never re-created (that would hide the window in which the lock was free),
#: and the TTL is replaced, never added to.
#: Every call refreshes our candidate entry, and our ttl as "in use" in a protocol-2 meta hash
#: (a meta hash of another protocol is left alone). The handoff is reported only when its `from`
#: is us (a stale one naming an earlier holder is not ours to act on). The rival is the candidate
#: other than us with the highest priority among those seen within the last ttl (a candidate
#: that registered once and died must not be handed the lease); ties go to the greatest
#: identity (byte order).
RENEW = (
    _LIB
    + protocol.META_LIB
    + _CALLER_LIB
    + """
local caller, refusal = read_caller(ARGV[2], ARGV[4], ARGV[3])
if not caller then
  return refusal
end
local ttl, priority, me = caller.ttl, caller.priority, caller.me
local nonce, bad_nonce = read_nonce(ARGV[5], KEYS[6])
if bad_nonce then
  return bad_nonce
end
local now_ms = server_ms()
local clash, recorded = instance_clash(KEYS[6], KEYS[3], me, nonce, now_ms)
pcall(register, KEYS[2], KEYS[3], me, priority, now_ms, 3 * ttl, KEYS[6])
note_instance(KEYS[6], KEYS[3], me, nonce, recorded)
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ttl)
  local ok, meta = pcall(read_meta, KEYS[5])
  if ok and meta and not foreign_protocol(meta) then
    note_ttl(KEYS[5], meta, ttl, now_ms)
  end
  local reply = {1, '', 0, '', 0, 0, clash}
  local handoff = read_handoff(KEYS[4])
  if handoff and handoff.from == me then
    reply[2], reply[3] = handoff_json(handoff.from, handoff.to), handoff.pttl
  end
  local found_ok, found = pcall(live, KEYS[2], KEYS[3], now_ms)
  if found_ok then
    local best = nil
    for _, c in ipairs(found) do
      if c[1] ~= me and now_ms - c[3] < ttl
          and (not best or c[2] > best[2] or (c[2] == best[2] and c[1] > best[1])) then
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
  return {0, '', -2, clash}
end
return {0, current, redis.call('PTTL', KEYS[1]), clash}
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
#: KEYS[1] candidates hash, KEYS[2] candidate expiry zset, KEYS[3] (optional) instances hash
#: ARGV[1] the identity, JSON-encoded
#: Returns 1 when an entry was removed, 0 when there was none. The identity's instance nonce goes
#: too (best effort).
WITHDRAW = (
    _LIB
    + """
local me = decode_identity(ARGV[1])
if not me then
  return redis.error_reply('ERR elector: identity must be a JSON string')
end
local removed = redis.call('HDEL', KEYS[1], me)
redis.call('ZREM', KEYS[2], me)
if KEYS[3] then
  redis.pcall('HDEL', KEYS[3], me)
end
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
#: A lease value over MAX_VALUE_BYTES (protocol.py) is not elector's: not parsed.
REQUEST_HANDOFF = (
    _LIB
    + f"local MAX_VALUE_BYTES = {protocol.MAX_VALUE_BYTES}\n"
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
if not value or string.len(value) > MAX_VALUE_BYTES then
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
#: KEYS[1] candidates hash, KEYS[2] candidate expiry zset, KEYS[3] (optional) instances hash
#: Returns {identity_1, priority_1, seen_ms_ago_1, identity_2, ...} (unordered; garbage entries
#: are left out). Pruning is best effort, so a read-only user or replica can still list them.
CANDIDATES = (
    _LIB
    + """
local now_ms = server_ms()
pcall(prune, KEYS[1], KEYS[2], now_ms, KEYS[3])
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
#: KEYS[1] lease key, KEYS[2] fencing counter key, KEYS[3] quiet-period key, KEYS[4] meta hash
#: Returns {value_or_empty, pttl, counter_or_empty, quiet_pttl, meta_protocol_or_empty}
#: (meta_protocol "(none)" when the hash exists without one, "(not a hash)" for another type).
OBSERVE = """
local value = redis.call('GET', KEYS[1]) or ''
local counter = redis.call('GET', KEYS[2]) or ''
local meta = ''
if KEYS[4] and redis.call('EXISTS', KEYS[4]) == 1 then
  if redis.call('TYPE', KEYS[4])['ok'] == 'hash' then
    meta = redis.call('HGET', KEYS[4], 'protocol') or '(none)'
  else
    meta = '(not a hash)'
  end
end
return {value, redis.call('PTTL', KEYS[1]), counter, redis.call('PTTL', KEYS[3]), meta}
"""


class LockKeys:
    """Names of the keys and the channel of one lock, all under one hash tag."""

    __slots__ = (
        "candidate_expiry",
        "candidate_instances",
        "candidates",
        "channel",
        "fencing",
        "handoff",
        "lease",
        "meta",
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
        #: ... and identity -> the nonce of the instance (one Elector or daemon election) that
        #: registered it last (a hash), to tell two live processes with one identity apart.
        self.candidate_instances = f"{prefix}:{tag}:candidates:instances"
        #: The handoff in progress, {"from":..,"to":..} with PX = its window.
        self.handoff = f"{prefix}:{tag}:handoff"
        #: Protocol 2's facts beside the lease (a hash; see protocol.py): protocol, replid, ttl.
        self.meta = f"{prefix}:{tag}:meta"
