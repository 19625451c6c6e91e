"""The two scripts only Redlock uses, on each of its servers (the others are in lease.py)."""

from __future__ import annotations

from elector.backend import protocol

#: Redlock confirm: make this server's part of a majority grant carry the grant's fencing token.
#:
#: KEYS[1] lease key, KEYS[2] fencing counter key
#: ARGV[1] this server's lease value from its ACQUIRE (owner check)
#: ARGV[2] the grant's fencing token T (the highest any server of the majority issued; < 10^15)
#: ARGV[3] the holder's identity, JSON-encoded, ARGV[4] the grant's secret owner token (hex)
#: ARGV[5] the lock's announcement channel, ARGV[6] the grant's ttl in ms (for the value)
#: Returns {1, value} confirmed: the counter is at least T and the key holds `value` (same expiry)
#:         {0, ""}    the key no longer holds ARGV[1] (expired, released, replaced): not confirmed
#: Raising the counter is what keeps Redlock's tokens increasing: every later majority shares a
#: server with this one, and that server now issues tokens above T. The value is rewritten to
#: {"identity":..,"fencing_token":T,"token":<grant owner>,"v":2,"ttl_ms":..} so every server
#: of the majority holds the same value (one owner check for renew and release, one holder for
#: observers). The expiry is kept (PX of the remaining PTTL: KEEPTTL would need 6.0+ and says the same).
REDLOCK_CONFIRM = (
    f"local PROTOCOL_VERSION = '{protocol.PROTOCOL}'\n"
    + """
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
local ttl = tonumber(ARGV[6])
if not ttl or ttl <= 0 or ttl ~= math.floor(ttl) then
  return redis.error_reply('ERR elector: ttl must be a positive integer of milliseconds')
end
local value = '{"identity":' .. ARGV[3] .. ',"fencing_token":' .. token .. ',"token":"' .. ARGV[4]
  .. '","v":' .. PROTOCOL_VERSION .. ',"ttl_ms":' .. string.format('%d', ttl) .. '}'
redis.call('SET', KEYS[1], value, 'PX', pttl)
redis.pcall('PUBLISH', ARGV[5],
  '{"event":"acquired","identity":' .. ARGV[3] .. ',"fencing_token":' .. token .. '}')
return {1, value}
"""
)

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
